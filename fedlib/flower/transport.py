"""The server side of fedlib's protocol over a Flower Grid, and the node side that answers it.

:class:`FlowerTransport` has :func:`fedlib.core.protocol.simulate`'s signature. Inside
``with protocol.transport(FlowerTransport(...))`` every method's own orchestration code (``run_afl``,
``run_federated``, the incremental learners, FedDL...) runs unchanged, but each round's broadcast goes
to the Flower nodes of the participating clients and their uploads come back over the network.

What travels, per message (one per participating client and round), is data only:

- server -> node: the broadcast's payload (ArrayRecord "payload"), and in ConfigRecord "fedlib": the
  payload's tree, the client id k, the data ``stage``, the run (``task``) and the client program as
  a JSON description (:func:`fedlib.flower.programs.describe`: the program's registered name and its
  settings); the node builds the program from its own installed fedlib (:func:`fedlib.flower.programs.build`);
- node -> server: the upload (same two records) plus, when the client's state keeps a ``log``
  (Re-Fed's cache sizes and scores, which the book's tables show), that log as arrays and a tree in
  the records "fedlib-diagnostics" and "fedlib-diagnostics-tree" (counted in Flower's bytes, not in the upload's; no algorithm reads it).

:func:`answer` is the node side: it builds the program, restores the client's own state from the
node's context (where it stays: it never travels), runs ``program.step(data, state, broadcast)`` on
the node's data and returns the upload.

Faults: replies are awaited ``timeout`` seconds. A client that does not answer, answers with an error
(e.g. Flower's "node unavailable"), or uploads a malformed message is left out of that round and
recorded in :meth:`FlowerTransport.report` with its reason. Uploads are checked by the server's own
:meth:`~fedlib.core.protocol.Server.expects` (the same check its ``receive`` runs in one process), and
the sender must be the client the node serves. A round with fewer than ``min_clients`` valid uploads
(or fewer than its participants, if less) stops the run with :class:`TooFewClients`.
"""
from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.app import Message as FlowerMessage

from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import run_rounds
from fedlib.core.uploads import UploadCheck
from fedlib.flower.programs import build, describe
from fedlib.flower.records import META, array_bytes, config_bytes, decode_tree, encode_tree, from_records, to_records

log = logging.getLogger("fedlib.flower")

STATE, DIAGNOSTICS, DIAGNOSTICS_TREE = "fedlib-state", "fedlib-diagnostics", "fedlib-diagnostics-tree"


class TooFewClients(RuntimeError):
    """A round kept fewer valid uploads than the run's minimum."""


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


class FlowerTransport:
    """:func:`~fedlib.core.protocol.simulate` over a Flower ``grid``.

    ``nodes``: client id k -> Flower node id (every client of the run; K = len(nodes)).
    ``timeout``: seconds to wait for a round's replies. ``stage()`` is sent with every message: the key
    of the data a node uses (incremental protocols advance it per task). ``task``: a string sent with
    every message that tells the node which run (and so which data and model) it serves.
    ``min_clients``: the fewest valid uploads a round may keep (at most its participants).
    """

    def __init__(self, grid, nodes: dict[int, int], timeout: float = 600.0, stage: Callable[[], int] = lambda: 0,
                 task: str = "", min_clients: int = 1):
        if min_clients < 1:
            raise ValueError(f"min_clients must be >= 1, got {min_clients}")
        self.grid, self.nodes, self.timeout = grid, dict(nodes), float(timeout)
        self.stage, self.task, self.min_clients = stage, task, int(min_clients)
        self.reports: list[RoundReport] = []
        self.flower = FlowerCost()
        self._calls = 0

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
        programs = describe(client), describe(init)

        def exchange(broadcast: Message, ids: list[int], r: int) -> list[Message]:
            report = RoundReport(self._calls, r, list(ids))
            self.reports.append(report)
            uploads = self._exchange(server, broadcast, ids, programs, report)
            for k, _, client_log in uploads:
                if states is not None and client_log is not None:
                    states[k]["log"] = client_log
            return [u for _, u, _ in uploads]

        return run_rounds(server, len(data), rounds, exchange, participants=participants, callbacks=callbacks,
                          device=device, progress=progress, desc=desc)

    def _exchange(self, server, broadcast: Message, ids: list[int], programs: tuple[str, str], report: RoundReport):
        messages, sent = [], {}
        for k in ids:
            content = to_records(broadcast, client=int(k), stage=int(self.stage()), task=self.task,
                                 program=programs[0], init=programs[1])
            self.flower.array_down += array_bytes(content)
            self.flower.config_down += config_bytes(content)
            messages.append(FlowerMessage(content, dst_node_id=self.nodes[k], message_type="train",
                                          group_id=f"{self._calls}.{report.round}"))
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        for k, message in zip(ids, messages):     # message ids are set when the grid pushes them
            sent[message.metadata.message_id] = k
        by_node = {self.nodes[k]: k for k in ids}
        check = UploadCheck(server.expects())
        got: dict[int, tuple[Message, Any]] = {}
        for reply in sorted(replies, key=lambda m: sent.get(m.metadata.reply_to_message_id, -1)):
            k = sent.get(reply.metadata.reply_to_message_id, by_node.get(reply.metadata.src_node_id))
            if k is None or k in got or k in report.rejected:
                continue
            if reply.has_error():   # the node's own error, or Flower's (e.g. the node is unavailable)
                report.rejected[k] = f"Flower error {reply.error.code}: {reply.error.reason}"
                continue
            self.flower.array_up += array_bytes(reply.content)
            self.flower.config_up += config_bytes(reply.content)
            try:
                upload = from_records(reply.content)
                if upload.sender != f"client{k}":
                    raise ValueError(f"its sender {upload.sender!r} is not client{k}, the client this node serves")
                check(upload)
                got[k] = (upload, _diagnostics(reply.content))
            except Exception as err:   # noqa: BLE001 - whatever a node sends, the run goes on without it
                report.rejected[k] = f"malformed upload: {err}"
        report.missing = [k for k in ids if k not in got and k not in report.rejected]
        report.answered = sorted(got)
        for k in report.missing:
            log.warning("client %d (node %d) did not answer within %.0f s: left out of step %d round %d",
                        k, self.nodes[k], self.timeout, report.step, report.round)
        for k, why in report.rejected.items():
            log.warning("client %d left out of step %d round %d: %s", k, report.step, report.round, why)
        need = min(self.min_clients, len(ids))
        if len(got) < need:
            why = "; ".join([f"client {k}: {w}" for k, w in report.rejected.items()]
                            + [f"client {k}: no answer within {self.timeout:.0f} s" for k in report.missing])
            raise TooFewClients(f"step {report.step} round {report.round}: {len(got)} of {len(ids)} clients sent a "
                                f"valid upload, fewer than the {need} the run needs (min-clients) - {why}")
        return [(k, *got[k]) for k in sorted(got)]


def _diagnostics(content) -> Any:
    """The client's log a reply carries (records :data:`DIAGNOSTICS`), or None."""
    if DIAGNOSTICS_TREE not in content.config_records:
        return None
    arrays = content.array_records[DIAGNOSTICS] if DIAGNOSTICS in content.array_records else ArrayRecord()
    return decode_tree(arrays, content.config_records[DIAGNOSTICS_TREE].get("tree", "null"))


# ------------------------------------------------------------------------------------------------
# node side
# ------------------------------------------------------------------------------------------------
_PROGRAMS: dict[tuple, Any] = {}   # per process: the latest programs built, by (task, description)


def remember(cache: dict, key, make: Callable[[], Any], size: int = 8):
    """``cache[key]``, made by ``make()`` on a miss; the oldest entry goes once ``size`` are kept
    (a node process serves many steps: programs and tasks must not pile up)."""
    if key not in cache:
        if len(cache) >= size:
            cache.pop(next(iter(cache)))
        cache[key] = make()
    return cache[key]


def answer(message: FlowerMessage, context: Context, task, corrupt: Callable[[Message], Message] | None = None
           ) -> FlowerMessage:
    """Run one protocol step on this node for ``task`` (its data: ``task.client_data(k, stage)``)."""
    meta = message.content.config_records[META]
    program = remember(_PROGRAMS, (task.key, str(meta["program"])), lambda: build(str(meta["program"]), task))
    initializer = remember(_PROGRAMS, (task.key, str(meta["init"])), lambda: build(str(meta["init"]), task))
    k, stage = int(meta["client"]), int(meta["stage"])
    # the client's own state stays on this node (its Flower context); it never travels
    store = context.state.config_records.setdefault(STATE, ConfigRecord())
    key = f"state:{k}"
    state = pickle.loads(bytes(store[key])) if key in store else initializer.init_state(k)
    upload = program.step(task.client_data(k, stage), state, from_records(message.content))
    store[key] = pickle.dumps(state)
    if corrupt is not None:
        upload = corrupt(upload)
    content = to_records(upload)
    if "log" in state:
        arrays, tree = encode_tree(state["log"])
        content[DIAGNOSTICS], content[DIAGNOSTICS_TREE] = arrays, ConfigRecord({"tree": tree})
    return FlowerMessage(content, reply_to=message)
