"""Tests for fedlib.core.protocol.simulate: bytes per receiver, participants, callbacks, client states."""
from __future__ import annotations

import time

import pytest
import torch

from fedlib.core.messages import Message
from fedlib.core.protocol import ClientStates, simulate


class CountingClient:
    """Uploads its data (a tensor) and counts its own steps in its state."""

    def init_state(self, k):
        return {"id": k, "steps": 0, "seen": []}

    def step(self, data, state, broadcast):
        state["steps"] += 1
        state["seen"].append(float(broadcast["w"]))
        return Message(f"client{state['id']}", {"x": data})


class SumServer:
    def __init__(self):
        self.w = torch.zeros(4)
        self.rounds = []

    def broadcast(self):
        return Message("server", {"w": self.w.sum()})

    def receive(self, messages):
        self.rounds.append([m.sender for m in messages])
        self.w = self.w + sum(m["x"] for m in messages)

    def result(self):
        return self.w


def data(k_count=4):
    return [torch.full((4,), float(k)) for k in range(k_count)]  # 16 bytes each


def test_bytes_counted_per_receiver_and_participants():
    server, client = SumServer(), CountingClient()
    cost = simulate(server, client, data(), 3, participants=lambda r: [3, 1] if r < 3 else [])
    assert server.rounds == [["client1", "client3"]] * 2  # increasing k; round 3 sends nothing
    assert cost.bytes_down == 2 * 2 * 4  # a 0-d float32 broadcast (4 bytes) per receiver, 2 rounds
    assert cost.bytes_up == 2 * 2 * 16
    assert torch.equal(server.result(), torch.full((4,), 8.0))


def test_callbacks_run_after_each_round_and_are_not_timed():
    server, client = SumServer(), CountingClient()
    calls = []

    def slow(r, srv, cost):
        calls.append((r, cost.bytes_up))
        time.sleep(0.2)

    cost = simulate(server, client, data(2), 3, callbacks=[slow])
    assert calls == [(1, 32), (2, 64), (3, 96)]
    assert cost.seconds < 0.2   # the three callbacks slept 0.6 s; the rounds themselves take milliseconds


def test_states_kept_across_calls_and_private_to_each_client():
    client = CountingClient()
    states = ClientStates(client)
    simulate(SumServer(), client, data(3), 2, participants=lambda r: [0] if r == 1 else [0, 2], states=states)
    simulate(SumServer(), client, data(3), 1, participants=lambda r: [2], states=states)
    assert states[0]["steps"] == 2 and states[2]["steps"] == 2 and 1 not in states
    assert states[0] is not states[2] and states[0]["seen"] is not states[2]["seen"]
    assert states[2]["id"] == 2


def test_states_without_client_take_the_first_program():
    states = ClientStates()
    simulate(SumServer(), CountingClient(), data(2), 1, states=states)
    assert states[1]["steps"] == 1


def test_negative_rounds_refused():
    with pytest.raises(ValueError, match="rounds"):
        simulate(SumServer(), CountingClient(), data(), -1)


def test_the_broadcast_only_server_sends_its_payload_and_keeps_checked_uploads():
    from fedlib.core.protocol import Broadcaster
    from fedlib.core.uploads import Expected, Tensor

    server = Broadcaster({"stage": 1}, Expected(({"x": Tensor((4,))},)))
    cost = simulate(server, CountingClientWithX(), data(3), 1)
    assert [m.sender for m in server.result()] == ["client0", "client1", "client2"] and cost.bytes_down == 3 * 8
    server.begin_stage(stage=2)
    assert server.broadcast().payload == {"stage": 2}
    with pytest.raises(ValueError, match=r"refused upload from 'client0': entry 'x' has shape \(3,\), expected \(4,\)"):
        server.receive([Message("client0", {"x": torch.zeros(3)})])
    assert len(server.result()) == 3


class CountingClientWithX:
    def init_state(self, k):
        return {"id": k}

    def step(self, data, state, broadcast):
        return Message(f"client{state['id']}", {"x": data})
