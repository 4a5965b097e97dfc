"""FedConfig(batched_clients=True): all clients of a round trained at once equals the per-client loop.

Every method of ``ALGORITHMS`` on clients of unequal sizes (one smaller than a batch, one of
exactly one batch, one empty), partial participation, 2 local epochs: final global weights equal
up to float32 round-off, the same participants, bytes and client states (mini-batch generators
included, so the same ``randperm`` calls were made).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_cfg
from fedlib.core.protocol import ClientStates
from fedlib.federated.batched import batchable
from fedlib.federated.gradient import (
    ALGORITHMS, FedAvg, FedConfig, GradientClient, LinearHead, MLPHead, MOONHead, make_algorithm, run_federated,
)

D, C = 12, 4
SIZES = [40, 7, 0, 33, 16, 90, 1, 23]  # batch 16: partial last batches, one < a batch, one exact, one empty


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(7)
    means = torch.randn(C, D, generator=gen) * 2.0
    clients = []
    for n in SIZES:
        y = torch.randint(0, C, (n,), generator=gen)
        clients.append((means[y] + torch.randn(n, D, generator=gen), y))
    y = torch.randint(0, C, (200,), generator=gen)
    return clients, (means[y] + torch.randn(200, D, generator=gen), y)


def cfg(**kw):
    return make_cfg(dict(rounds=3, local_epochs=2, batch_size=16, lr=0.05, participation=0.75), **kw)


def model_fn(method: str, kind: str = "linear"):
    if method == "moon":
        return lambda: MOONHead(D, C, hidden=10, out_dim=6)
    return (lambda: MLPHead(D, C, hidden=9)) if kind == "mlp" else (lambda: LinearHead(D, C))


def both(clients, test, method, fn, **kw):
    """(per-client, batched) histories and client states of the same run."""
    out = []
    for batched in (False, True):
        states = ClientStates()
        h = run_federated(fn, clients, test, make_algorithm(method), cfg(batched_clients=batched, **kw),
                          progress=False, states=states)
        out.append((h, states))
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def assert_same_run(ref, bat, tol=1e-5):
    (h0, s0), (h1, s1) = ref, bat
    assert h0.participants == h1.participants
    assert h0.round == h1.round
    assert h0.bytes_up == h1.bytes_up and h0.bytes_down == h1.bytes_down
    assert h0.final_state.keys() == h1.final_state.keys()
    for k in h0.final_state:
        assert rel(h1.final_state[k], h0.final_state[k]) < tol, k
    assert h1.test_acc == pytest.approx(h0.test_acc, abs=0.011)  # at most ~2 of 200 test points flip
    assert s0.keys() == s1.keys()
    for k in s0:  # the same randperm calls on every client's own generator
        assert torch.equal(s0[k]["batches"].get_state(), s1[k]["batches"].get_state()), k


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_batched_equals_per_client(data, method):
    clients, test = data
    ref, bat = both(clients, test, method, model_fn(method))
    assert_same_run(ref, bat)
    s0, s1 = ref[1], bat[1]
    if method == "feddyn":  # each client's own g_k
        for k in s0:
            if s0[k]["grad"] is not None:
                for a, b in zip(s1[k]["grad"], s0[k]["grad"]):
                    assert rel(a, b) < 1e-4
    if method == "moon":  # each client's previous local model
        assert any(s["prev"] is not None for s in s0.values())
        for k in s0:
            assert (s0[k]["prev"] is None) == (s1[k]["prev"] is None)
            if s0[k]["prev"] is not None:
                for n in s0[k]["prev"]:
                    assert rel(s1[k]["prev"][n], s0[k]["prev"][n]) < 1e-5


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "feddyn", "fedntd"])
def test_batched_two_layer_head(data, method):
    clients, test = data
    assert_same_run(*both(clients, test, method, model_fn(method, "mlp")))


def test_batched_full_participation_no_momentum_no_decay(data):
    clients, test = data
    assert_same_run(*both(clients, test, "fedprox", model_fn("fedprox"), participation=1.0, momentum=0.0,
                          weight_decay=0.0))


def test_batched_frozen_parameters(data):
    """Parameters with requires_grad False are not trained in either path."""
    clients, test = data

    def fn():
        m = MLPHead(D, C, hidden=9)
        m.proj.requires_grad_(False)
        return m

    ref, bat = both(clients, test, "fedavg", fn)
    assert_same_run(ref, bat)
    assert torch.equal(ref[0].final_state["proj.weight"], bat[0].final_state["proj.weight"])


def test_batched_sequential_model(data):
    clients, test = data
    fn = lambda: nn.Sequential(nn.Flatten(), nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, C))  # noqa: E731
    assert_same_run(*both(clients, test, "fedavg", fn))


def test_unsupported_method_or_model_raises(data):
    clients, test = data

    class Custom(FedAvg):
        def local_loss(self, local, x, y, logits):
            return logits.pow(2).mean()

    assert "Custom overrides local_loss" in batchable(Custom(), LinearHead(D, C))
    with pytest.raises(ValueError, match="batched_clients=True: Custom overrides local_loss"):
        run_federated(lambda: LinearHead(D, C), clients, test, Custom(), cfg(batched_clients=True), progress=False)
    bn = lambda: nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Linear(8, C))  # noqa: E731
    with pytest.raises(ValueError, match="BatchNorm1d"):
        run_federated(bn, clients, test, "fedavg", cfg(batched_clients=True), progress=False)
    # the per-client path takes both
    GradientClient(Custom(), bn(), cfg(), C)
    run_federated(lambda: LinearHead(D, C), clients, test, Custom(), cfg(rounds=1), progress=False)
    with pytest.raises(ValueError, match="batched_clients"):
        FedConfig(batched_clients=1)


def test_step_many_default_is_the_per_client_loop(data):
    """batched_clients=False: step_many is [step(...)], bit for bit."""
    clients, _ = data
    model = LinearHead(D, C)
    bc = model.state_dict()
    from fedlib.core.messages import Message

    msg = Message("server", {"state": bc})
    ups = []
    for many in (False, True):
        client = GradientClient(make_algorithm("fedavg"), model, cfg(), C)
        states = [client.init_state(k) for k in range(len(clients))]
        if many:
            ups.append(client.step_many(clients, states, msg))
        else:
            ups.append([client.step(d, s, msg) for d, s in zip(clients, states)])
    for a, b in zip(*ups):
        assert a.sender == b.sender and a["n"] == b["n"]
        assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])


def test_step_runs_at_the_configured_thread_count(data):
    """A Flower node calls step() outside run_federated's thread setting: the client itself applies
    config.num_threads (another count changes float round-off, so a deployment would differ from the
    in-process run), then restores the caller's."""
    clients, _ = data
    seen = []

    class Spy(FedAvg):
        def training_loss(self, local, x, y):
            seen.append(torch.get_num_threads())
            return super().training_loss(local, x, y)

    from fedlib.core.messages import Message

    model = LinearHead(D, C)
    client = GradientClient(Spy(), model, cfg(num_threads=1), C)
    torch.set_num_threads(2)  # the conftest fixture restores the test's count afterwards
    client.step(clients[0], client.init_state(0), Message("server", {"state": model.state_dict()}))
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("method", ["finetune", "fedewc", "fedlwf", "fedprox"])
def test_batched_incremental_methods_equal_per_client(method):
    """The FCIL methods (masked CE; FedEWC's penalty; FedLwF's distillation from the previous stage's
    model) have batched twins: three stages through GradientLearner give the per-client weights
    after every stage up to float32 round-off, and the same bytes."""
    import numpy as np

    from fedlib.data.streams import make_stream
    from fedlib.federated.incremental import run_class_incremental
    from fedlib.federated.learner import GradientLearner, KeepWeights

    gen = torch.Generator().manual_seed(3)
    means = torch.randn(6, D, generator=gen) * 2.0
    y = torch.arange(6).repeat(30)
    x = (means[y] + torch.randn(len(y), D, generator=gen)).numpy()
    yt = torch.arange(6).repeat(5)
    xt = (means[yt] + torch.randn(len(yt), D, generator=gen)).numpy()
    stream = make_stream(y.numpy(), yt.numpy(), 3, seed=0)
    hp = {"fedewc": {"lam": 5.0}, "fedlwf": {"lam": 2.0}}.get(method, {})
    out = []
    for batched in (False, True):
        keep = KeepWeights()
        learner = GradientLearner(lambda: LinearHead(D, 6), FedConfig(seed=1, rounds=2, local_epochs=2, batch_size=8,
                                                                      lr=0.05, batched_clients=batched),
                                  method, num_classes=6, progress=False, on_stage_end=[keep], **hp)
        res = run_class_incremental(learner, stream, x, y.numpy(), xt, yt.numpy(), 4, 0.5, seed=2, progress=False)
        out.append((keep.weights, res))
    (w0, r0), (w1, r1) = out
    assert len(w0) == len(w1) == 3
    for a, b in zip(w0, w1):
        for k in a:
            assert rel(b[k], a[k]) < 1e-5, k
    assert np.array_equal(r0.bytes_up, r1.bytes_up)
