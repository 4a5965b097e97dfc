"""Flower ServerApp and ClientApp (Message API) that run any fedlib protocol of :mod:`fedlib.flower.tasks`.

Server (:func:`serve`): wait until the run's K SuperNodes have registered, ask each for its
``partition-id`` (a "query" message; Flower's node configuration says which fedlib client a node
is), then run the task's orchestration inside ``protocol.transport(FlowerTransport(...))`` and
write ``result.npz`` (the model / estimate) and ``report.json`` (who answered, fedlib's and
Flower's bytes) to ``out-dir``.

A run that fails (e.g. fewer valid uploads than ``min-clients``) writes its one-line reason to
``out-dir/failed.txt``.

Node (:func:`make_client_app`): "query" answers the node's partition id; "train" runs one
protocol step (:func:`fedlib.flower.transport.answer`) on the node's own data. The node
configuration may name a ``fault`` to exercise the server's fault handling: ``nan`` (upload a NaN),
``shape`` (upload an array with a column missing) or ``slow`` (answer after ``fault-delay`` seconds).

Deployment (``flwr run``) reads the run configuration ``protocol``, ``options`` (the
``key=value`` string of :func:`fedlib.flower.tasks.parse_options`) and ``out-dir``.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedlib.core import protocol
from fedlib.core.messages import Message as FedMessage
from fedlib.flower.records import META
from fedlib.flower.tasks import Outcome, Task, parse_options
from fedlib.flower.transport import FlowerTransport, answer, remember

log = logging.getLogger("fedlib.flower")
FAULTS = ("", "nan", "shape", "slow")


# ------------------------------------------------------------------------------------------------
# server
# ------------------------------------------------------------------------------------------------
def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """Node ids once >= ``count`` SuperNodes have registered (RuntimeError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} of the {count} SuperNodes this run needs (num-clients) "
                               f"registered within {timeout:.0f} s")
        time.sleep(0.2)


def client_nodes(grid: Grid, nodes: list[int], count: int, timeout: float) -> dict[int, int]:
    """{fedlib client k: node id} from each node's ``partition-id`` (its Flower node configuration)."""
    ask = [Message(RecordDict(), dst_node_id=node, message_type="query", group_id="partition-ids") for node in nodes]
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(ask, timeout=timeout):
        if reply.has_error():
            continue
        k = int(reply.content.config_records["node"]["partition-id"])
        if k in mapping:
            raise RuntimeError(f"two SuperNodes claim partition-id {k}: give each node its own")
        mapping[k] = reply.metadata.src_node_id
    missing = sorted(set(range(count)) - set(mapping))
    if missing:
        raise RuntimeError(f"no SuperNode answered for partition-id(s) {missing} (num-clients={count}); "
                           f"start one per client with --node-config \"partition-id=k num-partitions={count}\"")
    return {k: mapping[k] for k in range(count)}


def serve(grid: Grid, config: dict[str, Any], out_dir: str | Path | None = None,
          progress: bool = False) -> tuple[Outcome, dict]:
    """Run ``config``'s protocol over ``grid``; returns the outcome and the run report."""
    task = Task(config)
    count, timeout = config["num-clients"], config["timeout"]
    out = None if out_dir is None else Path(out_dir)
    try:
        nodes = client_nodes(grid, wait_for_nodes(grid, count, timeout), count, timeout)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "nodes.json").write_text(json.dumps({str(k): v for k, v in nodes.items()}))
        transport = FlowerTransport(grid, nodes, timeout, stage=lambda: task.stage, task=task.key,
                                    min_clients=config["min-clients"])
        with protocol.transport(transport):
            outcome = task.run(progress)
    except Exception as err:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "failed.txt").write_text(f"{type(err).__name__}: {err}")
        raise
    report = {"config": config, **outcome.summary, "flower": transport.report()}
    if out is not None:
        np.savez(out / "result.npz", **outcome.arrays)
        (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
    return outcome, report


def make_server_app(config: dict[str, Any] | None = None, out_dir: str | Path | None = None,
                    holder: dict | None = None) -> ServerApp:
    """A ServerApp running ``config`` (None: from the run configuration); ``holder`` receives the
    outcome and report (the simulation engine runs the ServerApp in this process)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg, out = config, out_dir
        if cfg is None:
            run = context.run_config
            cfg = parse_options(str(run.get("protocol", "afl")), str(run.get("options", "")))
            out = str(run.get("out-dir", "")) or None
        outcome, report = serve(grid, cfg, out)
        if holder is not None:
            holder.update(outcome=outcome, report=report)

    return app


# ------------------------------------------------------------------------------------------------
# node
# ------------------------------------------------------------------------------------------------
_TASKS: dict[str, Task] = {}


def _task(key: str) -> Task:
    """The task a message names (its configuration as JSON); kept per process with its data."""
    def make() -> Task:
        config = json.loads(key)
        return Task(parse_options(config["protocol"], config))
    return remember(_TASKS, key, make, size=4)


def corrupt(kind: str):
    """The upload a faulty node sends instead of its own (``kind`` in :data:`FAULTS`): its first array
    (depth first) with a NaN (-1 in an integer array) or with its last column cut off."""
    def damage(value):
        if kind == "nan":
            torch_tensor = hasattr(value, "clone")
            value = value.contiguous().clone() if torch_tensor else value.copy()
            floating = value.is_floating_point() if torch_tensor else value.dtype.kind == "f"
            value.reshape(-1)[0] = float("nan") if floating else -1
            return value
        return value[..., :-1]

    def first(tree):
        for key, value in (tree.items() if isinstance(tree, dict) else []):
            if isinstance(value, dict):
                found = first(value)
                if found is not None:
                    return {**tree, key: found}
            elif np.ndim(value) >= 1 and np.size(value):
                return {**tree, key: damage(value)}
        return None

    def upload(message: FedMessage) -> FedMessage:
        return FedMessage(message.sender, first(message.payload) or message.payload)
    return upload


def make_client_app(faults: dict[int, str] | None = None, delay: float = 5.0) -> ClientApp:
    """The ClientApp; ``faults`` {partition id: kind} overrides the node configuration's ``fault``."""
    app = ClientApp()

    def node_fault(context: Context) -> tuple[str, float]:
        pid = int(context.node_config["partition-id"])
        kind = (faults or {}).get(pid, str(context.node_config.get("fault", "")))
        if kind not in FAULTS:
            raise ValueError(f"node config fault must be one of {FAULTS}, got {kind!r}")
        return kind, float(context.node_config.get("fault-delay", delay))

    @app.query()
    def query(message: Message, context: Context) -> Message:
        node = {"partition-id": int(context.node_config["partition-id"])}
        return Message(RecordDict({"node": ConfigRecord(node)}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        task = _task(str(message.content.config_records[META]["task"]))
        kind, wait = node_fault(context)
        if kind == "slow":
            time.sleep(wait)
        return answer(message, context, task, corrupt(kind) if kind in ("nan", "shape") else None)

    return app


server = make_server_app()   # `flwr run` (fedlib/flower/app/pyproject.toml)
client = make_client_app()
