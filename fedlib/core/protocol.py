"""The one client/server protocol of every federated method in fedlib, and its in-process simulator.

A method is two objects:

- a :class:`Client` program: ``init_state(k)`` makes client k's own persistent state (a dict that
  only client k's steps ever see), ``step(data, state, broadcast) -> Message`` computes the upload
  from the client's local data, its state and the server's broadcast;
- a :class:`Server`: ``broadcast() -> Message`` is what this round's clients receive,
  ``expects()`` what it accepts from them (checked against its own state, :mod:`fedlib.core.uploads`),
  ``receive(messages)`` checks and takes the round's uploads, ``result()`` is what the run produced.

:func:`simulate` drives them in one process (rounds, client sampling, measured bytes and seconds).
Inside ``with transport(t):`` every :func:`simulate` call is handed to ``t`` instead, with the same
arguments: :class:`fedlib.flower.FlowerTransport` sends the broadcast to Flower SuperNodes and
returns their uploads, so every method's orchestration code runs unchanged between processes. Nothing in a client reads another
client's state or the server's: all a client learns arrives in the broadcast ``Message``.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch
from tqdm.auto import tqdm

from fedlib.core.devices import synchronize
from fedlib.core.messages import Cost, Message
from fedlib.core.uploads import NOTHING, Expected, check_uploads


class Client(Protocol):
    """What one client computes (stateless itself: its memory is the ``state`` dict)."""

    def init_state(self, k: int) -> dict[str, Any]:
        """Client k's own persistent state before its first step (seeds, caches, ...)."""
        ...

    def step(self, data: Any, state: dict[str, Any], broadcast: Message) -> Message:
        """One upload computed from local ``data``, own ``state`` (updated in place) and ``broadcast``."""
        ...

    # Optional: ``step_many(datas, states, broadcast) -> list[Message]``, the uploads of several
    # clients at once, equal to ``[step(d, s, broadcast) for d, s in zip(datas, states)]`` (up to
    # float round-off); :func:`simulate` calls it with each round's participants when present.


class Server:
    """What the server does with the uploads; every server of fedlib derives from it.

    A server defines ``broadcast()`` (what the coming round's clients receive), ``expects()`` (an
    :class:`~fedlib.core.uploads.Expected`: the uploads it accepts now, from its own state),
    ``absorb(messages)`` (take a round's checked uploads) and ``result()``. ``receive(messages)``
    checks the whole round against ``expects()`` first: a malformed upload raises a ValueError that
    names its sender and entry, and the server's state is left as it was.
    """

    def broadcast(self) -> Message:
        """The message every client of the coming round receives."""
        raise NotImplementedError

    def expects(self) -> Expected:
        """The uploads this server accepts now (shapes from its own state)."""
        raise NotImplementedError

    def receive(self, messages: Sequence[Message]) -> None:
        """Take one round's uploads (in client order), every one checked before any is absorbed."""
        messages = list(messages)
        check_uploads(messages, self.expects())
        self.absorb(messages)

    def absorb(self, messages: list[Message]) -> None:
        """Take one round's uploads, already checked by :meth:`receive`."""
        raise NotImplementedError

    def result(self) -> Any:
        """What the run produced (a model state, weights, landmarks...)."""
        raise NotImplementedError


class Broadcaster(Server):
    """THE broadcast-only server: broadcasts ``payload`` (the public settings of the coming round, e.g. a
    stage's; :meth:`begin_stage` replaces them), keeps the round's checked uploads as ``result()`` and
    accepts what ``expected`` says (default: uploads with no entry). Servers that broadcast such a payload
    derive from it (STSA's) or borrow its :meth:`broadcast` and :meth:`begin_stage`."""

    def __init__(self, payload: dict | None = None, expected: Expected = NOTHING):
        self.payload, self.expected, self.uploads = dict(payload or {}), expected, []

    def begin_stage(self, **payload) -> None:
        """The payload of the coming round(s)."""
        self.payload = dict(payload)

    def broadcast(self) -> Message:
        return Message("server", dict(self.payload))

    def expects(self) -> Expected:
        return self.expected

    def absorb(self, messages: list[Message]) -> None:
        self.uploads = messages

    def result(self) -> list[Message]:
        return self.uploads


class ClientStates(dict):
    """``{k: state}``: every client's own state, made by ``client.init_state(k)`` on first use and
    kept across rounds and stages (as a client process keeps its memory). Made without a client,
    it takes the client program of the first :func:`simulate` call it is passed to."""

    def __init__(self, client: Client | None = None):
        super().__init__()
        self.client = client

    def __missing__(self, k: int) -> dict[str, Any]:
        self[k] = self.client.init_state(k)
        return self[k]


RoundCallback = Callable[[int, Server, Cost], None]


def simulate(server: Server, client: Client, data: Sequence[Any], rounds: int = 1, *,
             participants: Callable[[int], Iterable[int]] | None = None,
             states: ClientStates | None = None, callbacks: Sequence[RoundCallback] = (),
             device: torch.device | None = None, progress: bool = False, desc: str | None = None) -> Cost:
    """Run ``rounds`` rounds of the protocol in this process; return the measured :class:`Cost`.

    Round r (1-based): ``ids = participants(r)`` (default: every client, in order); the server's
    broadcast goes to each (bytes down = its size x len(ids)); each client k in ``ids`` runs
    ``client.step(data[k], states[k], broadcast)`` in increasing k (or, if the client program has
    ``step_many``, ``client.step_many([data[k] ...], [states[k] ...], broadcast)``); the server receives the uploads
    (bytes up = their sizes). A round with no participant sends nothing. Then each callback is
    called as ``callback(r, server, cost_so_far)``; time spent in callbacks (evaluation, logging)
    is not counted in ``seconds``. ``states`` carries the clients' states between calls (stages).
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    active = _TRANSPORT.get()
    if active is not None:
        return active(server, client, data, rounds, participants=participants, states=states,
                      callbacks=callbacks, device=device, progress=progress, desc=desc)
    states = ClientStates(client) if states is None else states
    if states.client is None:
        states.client = client
    step_many = getattr(client, "step_many", None)
    if callable(step_many):  # a client program that computes a round's uploads at once
        exchange = lambda msg, ids, r: step_many([data[k] for k in ids], [states[k] for k in ids], msg)  # noqa: E731
    else:
        exchange = lambda msg, ids, r: [client.step(data[k], states[k], msg) for k in ids]  # noqa: E731
    return run_rounds(server, len(data), rounds, exchange, participants=participants, callbacks=callbacks,
                      device=device, progress=progress, desc=desc)


Exchange = Callable[[Message, list[int], int], list[Message]]


def run_rounds(server: Server, num_clients: int, rounds: int, exchange: Exchange, *,
               participants: Callable[[int], Iterable[int]] | None = None, callbacks: Sequence[RoundCallback] = (),
               device: torch.device | None = None, progress: bool = False, desc: str | None = None) -> Cost:
    """The round loop of :func:`simulate` with the clients' side abstracted: ``exchange(broadcast,
    ids, r)`` returns the uploads of clients ``ids`` (in that order; in-process: their steps, over
    Flower: the nodes' replies). Bytes, seconds and callbacks as in :func:`simulate`."""
    cost = Cost()
    iterator: Iterable[int] = range(1, rounds + 1)
    if progress:
        iterator = tqdm(iterator, desc=desc, leave=False)
    for r in iterator:
        t0 = time.perf_counter()
        ids = sorted(participants(r)) if participants is not None else range(num_clients)
        ids = list(ids)
        if ids:
            message = server.broadcast()
            cost.bytes_down += message.nbytes * len(ids)
            uploads = exchange(message, ids, r)
            cost.bytes_up += sum(u.nbytes for u in uploads)
            server.receive(uploads)
            del uploads
        if device is not None:
            synchronize(device)
        cost.seconds += time.perf_counter() - t0
        for callback in callbacks:
            callback(r, server, cost)
    return cost


_TRANSPORT: contextvars.ContextVar[Callable[..., Cost] | None] = contextvars.ContextVar("transport", default=None)


@contextlib.contextmanager
def transport(runner: Callable[..., Cost]):
    """Within the block, :func:`simulate` calls ``runner`` (same signature) instead of running the
    clients in this process; e.g. a :class:`fedlib.flower.FlowerTransport` over a Flower Grid."""
    token = _TRANSPORT.set(runner)
    try:
        yield runner
    finally:
        _TRANSPORT.reset(token)


EMPTY = Message(sender="server")   # the broadcast of a one-shot method (nothing to send)
