"""The server side of fedlib's protocol over a Flower Grid, and the node side that answers it.

:class:`FlowerTransport` has :func:`fedlib.core.protocol.simulate`'s signature. Inside
``with protocol.transport(FlowerTransport(...))`` every method's own orchestration code (``run_afl``,
``run_federated``, the incremental learners, FedDL...) runs unchanged, but each round's broadcast goes
to the Flower nodes of the participating clients and their uploads come back over the network.

What travels, per message (one per participating client and round):

- server -> node: the broadcast's payload (ArrayRecord "payload"), and in ConfigRecord "fedlib": the
  payload's tree, the client id k, the data ``stage``, and the client program: a pickled fedlib
  object (e.g. ``AFLClient(num_classes=10, gamma=1.0)``) sent to a node once and then named by its
  SHA-256 (nodes keep programs in their Flower context state);
- node -> server: the upload (same two records) plus, when the client's state keeps a ``log``
  (Re-Fed's cache sizes and scores, which the book's tables show), that log as a diagnostic
  ConfigRecord that no algorithm reads (counted in the config bytes, not in the upload's).

:func:`answer` is the node side: it unpickles the program with :class:`ProgramUnpickler` (fedlib,
torch, numpy classes only), restores the client's own state from the node's context, runs
``program.step(data, state, broadcast)`` on the node's data and returns the upload.

Faults: replies are awaited ``timeout`` seconds; a client that does not answer, answers with an
error, or uploads a malformed message (non-finite values, or a failed task-specific ``validator``)
is left out of that round's aggregate and recorded in :attr:`FlowerTransport.report` with its reason.
"""
from __future__ import annotations

import hashlib
import io
import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message as FlowerMessage

from fedlib.core.protocol import run_rounds
from fedlib.core.messages import Cost, Message
from fedlib.flower.records import META, array_bytes, config_bytes, from_records, to_records

log = logging.getLogger("fedlib.flower")

STATE, DIAGNOSTICS = "fedlib-state", "fedlib-diagnostics"
_SAFE_ROOTS = ("fedlib", "torch", "numpy", "collections", "copyreg", "functools", "_codecs", "math")
_SAFE_BUILTINS = {"set", "frozenset", "slice", "range", "complex", "object", "dict", "list", "tuple", "bytearray",
                  "getattr", "float", "int", "bool", "str"}


class ProgramUnpickler(pickle.Unpickler):
    """Unpickles client programs and states: classes and functions of fedlib, torch, numpy and a few
    standard containers only (a node never imports or runs anything else a server sends)."""

    def find_class(self, module: str, name: str):
        root = module.split(".")[0]
        if root in _SAFE_ROOTS or (module == "builtins" and name in _SAFE_BUILTINS):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a client program may only use "
                                     f"classes of {', '.join(_SAFE_ROOTS)}")


def loads(data: bytes) -> Any:
    return ProgramUnpickler(io.BytesIO(data)).load()


def program_id(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:16]


def check_finite(message: Message) -> None:
    """ValueError naming the first payload entry holding NaN or inf."""
    def walk(value, path):
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc" and not np.isfinite(value).all():
            raise ValueError(f"entry {path!r} holds {int((~np.isfinite(value)).sum())} non-finite value(s)")
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        if isinstance(value, float) and not np.isfinite(value):
            raise ValueError(f"entry {path!r} is {value}")
    walk(message.payload, "")


@dataclass
class RoundReport:
    """Who took part in one round of one protocol step."""

    step: int
    round: int
    asked: list[int]
    answered: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)


@dataclass
class FlowerCost:
    """Bytes Flower carried: ``array_up`` / ``array_down`` from the messages' ArrayRecords
    (``count_bytes``), ``config_up`` / ``config_down`` from their ConfigRecords (trees, ids, programs)."""

    array_up: int = 0
    array_down: int = 0
    config_up: int = 0
    config_down: int = 0


Validator = Callable[[Message], None]


class FlowerTransport:
    """:func:`~fedlib.core.protocol.simulate` over a Flower ``grid``.

    ``nodes``: client id k -> Flower node id (every client of the run; K = len(nodes)).
    ``timeout``: seconds to wait for a round's replies. ``validators``: each raises ValueError on a
    malformed upload (non-finite values are always refused). ``stage()`` is sent with every message:
    the key of the data a node uses (incremental protocols advance it per task). ``task``: a string
    sent with every message that tells the node which run (and so which data) it serves.
    """

    def __init__(self, grid, nodes: dict[int, int], timeout: float = 600.0,
                 validators: Sequence[Validator] = (), stage: Callable[[], int] = lambda: 0, task: str = ""):
        self.grid, self.nodes, self.timeout = grid, dict(nodes), float(timeout)
        self.validators, self.stage, self.task = list(validators), stage, task
        self.reports: list[RoundReport] = []
        self.flower = FlowerCost()
        self._calls = 0
        self._sent: dict[int, set[str]] = {}   # node -> program ids it holds

    # -- what the run produced ------------------------------------------------------------------
    @property
    def answered(self) -> list[int]:
        """Clients that answered every round they were asked in."""
        bad = {k for r in self.reports for k in (*r.missing, *r.rejected)}
        return sorted({k for r in self.reports for k in r.asked} - bad)

    def report(self) -> dict:
        """JSON-able summary: clients asked / answered / missing / rejected (with reasons), bytes."""
        missing = sorted({k for r in self.reports for k in r.missing})
        rejected = {str(k): why for r in self.reports for k, why in r.rejected.items()}
        return {"clients": len(self.nodes), "answered": self.answered, "missing": missing, "rejected": rejected,
                "rounds": len(self.reports), "flower_bytes": vars(self.flower).copy()}

    # -- simulate() over the grid -----------------------------------------------------------------
    def __call__(self, server, client, data, rounds: int = 1, *, participants=None, states=None,
                 callbacks: Iterable = (), device=None, progress: bool = False, desc: str | None = None) -> Cost:
        self._calls += 1
        init = states.client if states is not None and states.client is not None else client
        program, initializer = pickle.dumps(client), pickle.dumps(init)
        programs = (program, program_id(program)), (initializer, program_id(initializer))

        def exchange(broadcast: Message, ids: list[int], r: int) -> list[Message]:
            report = RoundReport(self._calls, r, list(ids))
            self.reports.append(report)
            uploads = self._exchange(broadcast, ids, *programs, report)
            for k, _, client_log in uploads:
                if states is not None and client_log is not None:
                    states[k]["log"] = client_log
            return [u for _, u, _ in uploads]

        return run_rounds(server, len(data), rounds, exchange, participants=participants, callbacks=callbacks,
                          device=device, progress=progress, desc=desc)

    def _exchange(self, broadcast: Message, ids: list[int], program, initializer, report: RoundReport):
        messages, node_to_client = [], {}
        for k in ids:
            node = self.nodes[k]
            held = self._sent.setdefault(node, set())
            extra = {"client": int(k), "stage": int(self.stage()), "task": self.task, "program_id": program[1],
                     "init_id": initializer[1]}
            for blob, pid in (program, initializer):
                if pid not in held:
                    extra[f"program:{pid}"] = blob
            content = to_records(broadcast, **extra)
            self.flower.array_down += array_bytes(content)
            self.flower.config_down += config_bytes(content)
            messages.append(FlowerMessage(content, dst_node_id=node, message_type="train",
                                          group_id=f"{self._calls}.{report.round}"))
            node_to_client[node] = k
        replies = self.grid.send_and_receive(messages, timeout=self.timeout)
        got: dict[int, Message] = {}
        for reply in replies:
            k = node_to_client.get(reply.metadata.src_node_id)
            if k is None:
                continue
            self._sent[self.nodes[k]].update({program[1], initializer[1]})
            if reply.has_error():
                report.rejected[k] = f"client error: {reply.error.reason}"
                continue
            self.flower.array_up += array_bytes(reply.content)
            self.flower.config_up += config_bytes(reply.content)
            try:
                upload = from_records(reply.content)
                check_finite(upload)
                for validate in self.validators:
                    validate(upload)
            except (ValueError, TypeError, KeyError) as err:
                report.rejected[k] = f"malformed upload: {err}"
                continue
            diagnostics = reply.content.config_records.get(DIAGNOSTICS)
            got[k] = (upload, None if diagnostics is None else loads(bytes(diagnostics["log"])))
        report.missing = [k for k in ids if k not in got and k not in report.rejected]
        report.answered = sorted(got)
        for k in report.missing:
            log.warning("client %d (node %d) did not answer within %.0f s: left out of step %d round %d",
                        k, self.nodes[k], self.timeout, report.step, report.round)
        for k, why in report.rejected.items():
            log.warning("client %d rejected in step %d round %d: %s", k, report.step, report.round, why)
        return [(k, *got[k]) for k in sorted(got)]


# ------------------------------------------------------------------------------------------------
# node side
# ------------------------------------------------------------------------------------------------
_PROGRAMS: dict[str, Any] = {}   # per process: the latest unpickled programs by id


def remember(cache: dict, key, make: Callable[[], Any], size: int = 8):
    """``cache[key]``, made by ``make()`` on a miss; the oldest entry goes once ``size`` are kept
    (a node process serves many steps: programs and tasks must not pile up)."""
    if key not in cache:
        if len(cache) >= size:
            cache.pop(next(iter(cache)))
        cache[key] = make()
    return cache[key]


def _program(pid: str, meta: ConfigRecord, context: Context):
    store = context.state.config_records.setdefault(STATE, ConfigRecord())
    key = f"program:{pid}"
    if key in meta:
        store[key] = meta[key]
    if key not in store:
        raise KeyError(f"this node never received client program {pid}")
    return remember(_PROGRAMS, pid, lambda: loads(bytes(store[key])))


def answer(message: FlowerMessage, context: Context, client_data: Callable[[int, int], Any],
           corrupt: Callable[[Message], Message] | None = None) -> FlowerMessage:
    """Run one protocol step on this node: ``client_data(k, stage)`` is the node's data."""
    meta = message.content.config_records[META]
    program = _program(str(meta["program_id"]), meta, context)
    initializer = _program(str(meta["init_id"]), meta, context)
    k, stage = int(meta["client"]), int(meta["stage"])
    store, key = context.state.config_records[STATE], f"state:{k}"
    state = loads(bytes(store[key])) if key in store else initializer.init_state(k)
    upload = program.step(client_data(k, stage), state, from_records(message.content))
    store[key] = pickle.dumps(state)
    if corrupt is not None:
        upload = corrupt(upload)
    content = to_records(upload)
    if "log" in state:
        content[DIAGNOSTICS] = ConfigRecord({"log": pickle.dumps(state["log"])})
    return FlowerMessage(content, reply_to=message)
