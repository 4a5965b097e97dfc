"""The one client/server protocol of every federated method in fedlib, and its in-process simulator.

A method is two objects:

- a :class:`Client` program: ``init_state(k)`` makes client k's own persistent state (a dict that
  only client k's steps ever see), ``step(data, state, broadcast) -> Message`` computes the upload
  from the client's local data, its state and the server's broadcast;
- a :class:`Server`: ``broadcast() -> Message`` is what this round's clients receive,
  ``receive(messages)`` takes the round's uploads, ``result()`` is what the run produced.

:func:`simulate` drives them in one process (rounds, client sampling, measured bytes and seconds);
the Flower apps drive the very same objects between processes. Nothing in a client reads another
client's state or the server's: all a client learns arrives in the broadcast ``Message``.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch

from fedlib.core.devices import synchronize
from fedlib.core.messages import Cost, Message


class Client(Protocol):
    """What one client computes (stateless itself: its memory is the ``state`` dict)."""

    def init_state(self, k: int) -> dict[str, Any]:
        """Client k's own persistent state before its first step (seeds, caches, ...)."""
        ...

    def step(self, data: Any, state: dict[str, Any], broadcast: Message) -> Message:
        """One upload computed from local ``data``, own ``state`` (updated in place) and ``broadcast``."""
        ...


class Server(Protocol):
    """What the server does with the uploads."""

    def broadcast(self) -> Message:
        """The message every client of the coming round receives."""
        ...

    def receive(self, messages: list[Message]) -> None:
        """Take one round's uploads (in client order)."""
        ...

    def result(self) -> Any:
        """What the run produced (a model state, weights, landmarks...)."""
        ...


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
    ``client.step(data[k], states[k], broadcast)`` in increasing k; the server receives the uploads
    (bytes up = their sizes). A round with no participant sends nothing. Then each callback is
    called as ``callback(r, server, cost_so_far)``; time spent in callbacks (evaluation, logging)
    is not counted in ``seconds``. ``states`` carries the clients' states between calls (stages).
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    states = ClientStates(client) if states is None else states
    if states.client is None:
        states.client = client
    cost = Cost()
    iterator: Iterable[int] = range(1, rounds + 1)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc=desc, leave=False)
    for r in iterator:
        t0 = time.perf_counter()
        ids = sorted(participants(r)) if participants is not None else range(len(data))
        ids = list(ids)
        if ids:
            message = server.broadcast()
            cost.bytes_down += message.nbytes * len(ids)
            uploads = [client.step(data[k], states[k], message) for k in ids]
            cost.bytes_up += sum(u.nbytes for u in uploads)
            server.receive(uploads)
            del uploads
        if device is not None:
            synchronize(device)
        cost.seconds += time.perf_counter() - t0
        for callback in callbacks:
            callback(r, server, cost)
    return cost


EMPTY = Message(sender="server")   # the broadcast of a one-shot method (nothing to send)
