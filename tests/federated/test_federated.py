"""Tests for fedlib.federated.gradient: the shared federated loop and its six strategies."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import make_cfg, states_equal
from fedlib.core.messages import Message
from fedlib.core.seeds import seed_everything, torch_generator
from fedlib.federated.gradient import (
    ALGORITHMS, FedConfig, FedDisco, FedDyn, FedNTD, GradientServer, History, LinearHead, Local, MOON,
    MOONHead, make_algorithm, run_federated, sample_clients,
)

D, C, K = 20, 3, 10


def blobs(n: int, gen: torch.Generator, label_skew: int | None = None):
    """Well-separated Gaussian blobs; ``label_skew`` = dominant class of a non-IID client."""
    means = torch.eye(C, D) * 6.0
    if label_skew is None:
        y = torch.randint(0, C, (n,), generator=gen)
    else:
        y = torch.where(torch.rand(n, generator=gen) < 0.8, torch.tensor(label_skew),
                        torch.randint(0, C, (n,), generator=gen))
    x = means[y] + torch.randn(n, D, generator=gen)
    return x, y


@pytest.fixture(scope="module")
def fed_data():
    gen = torch.Generator().manual_seed(123)
    clients = [blobs(40 + 4 * k, gen, label_skew=k % C) for k in range(K)]
    test = blobs(300, gen)
    return clients, test


def linear():
    return LinearHead(D, C)


def cfg(**kw):
    return make_cfg(dict(rounds=3, local_epochs=1, batch_size=16, lr=0.05, participation=1.0), **kw)


def local(model, glob, state=None, spare=None, **broadcast):
    """A :class:`Local` for calling client hooks directly."""
    return Local(model, glob, spare, state if state is not None else {}, Message("server", broadcast))


def test_fedavg_learns(fed_data):
    clients, test = fed_data
    h = run_federated(linear, clients, test, "fedavg", cfg(), progress=False)
    assert h.final_acc > 0.9
    assert h.round == [1, 2, 3]
    assert h.best_acc >= h.final_acc
    assert all(b > a for a, b in zip(h.wall_s, h.wall_s[1:]))


def _plain_sgd(x, y, c: FedConfig, epochs: int):
    """Centralised mini-batch SGD with fedlib's documented seeding convention (client 0's batches)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(c.num_threads)  # same kernels as the federated run
    try:
        return _plain_sgd_body(x, y, c, epochs)
    finally:
        torch.set_num_threads(threads)


def _plain_sgd_body(x, y, c: FedConfig, epochs: int):
    seed_everything(c.seed)
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
    gen = torch_generator(c.seed, "batches", 0)
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0], generator=gen)
        xs, ys = x[perm], y[perm]
        for s in range(0, x.shape[0], c.batch_size):
            loss = F.cross_entropy(model(xs[s:s + c.batch_size]), ys[s:s + c.batch_size])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.state_dict()


def test_single_client_equals_local_sgd(fed_data):
    clients, test = fed_data
    x, y = clients[0]
    c = cfg(rounds=1, local_epochs=3)  # momentum 0.9 within one local call
    h = run_federated(linear, [(x, y)], test, "fedavg", c, progress=False)
    assert states_equal(h.final_state, _plain_sgd(x, y, c, epochs=3))
    # several rounds: momentum restarts each round, so compare with momentum 0
    c = cfg(rounds=3, local_epochs=1, momentum=0.0)
    h = run_federated(linear, [(x, y)], test, "fedavg", c, progress=False)
    assert states_equal(h.final_state, _plain_sgd(x, y, c, epochs=3))


def test_fedprox_mu0_equals_fedavg(fed_data):
    clients, test = fed_data
    c = cfg(participation=0.5)
    a = run_federated(linear, clients, test, "fedavg", c, progress=False)
    b = run_federated(linear, clients, test, make_algorithm("fedprox", mu=0.0), c, progress=False)
    assert states_equal(a.final_state, b.final_state)
    assert a.test_acc == b.test_acc
    c2 = run_federated(linear, clients, test, make_algorithm("fedprox", mu=1.0), c, progress=False)
    assert not states_equal(a.final_state, c2.final_state)


def test_deterministic(fed_data):
    clients, test = fed_data
    c = cfg(participation=0.3, rounds=4)
    a = run_federated(linear, clients, test, "fedntd", c, progress=False)
    b = run_federated(linear, clients, test, "fedntd", c, progress=False)
    assert a.test_acc == b.test_acc and a.participants == b.participants
    assert a.bytes_up == b.bytes_up and states_equal(a.final_state, b.final_state)
    d = run_federated(linear, clients, test, "fedntd", cfg(participation=0.3, rounds=4, seed=1),
                      progress=False)
    assert not states_equal(a.final_state, d.final_state)


def test_bytes_counted(fed_data):
    clients, test = fed_data
    c = cfg(participation=0.5, rounds=3)
    h = run_federated(linear, clients, test, "fedavg", c, progress=False)
    param_bytes = (C * D + C) * 4  # float32 weight (C, D) + bias (C,)
    m = math.ceil(0.5 * K)
    assert h.bytes_up == [r * m * (param_bytes + 8) for r in (1, 2, 3)]  # + the int n_k
    assert h.bytes_down == [r * m * param_bytes for r in (1, 2, 3)]


def test_empty_clients_skipped(fed_data):
    clients, test = fed_data
    empty = (torch.zeros(0, D), torch.zeros(0, dtype=torch.long))
    h = run_federated(linear, [empty] + list(clients[:3]) + [empty], test, "fedavg",
                      cfg(rounds=2), progress=False)
    assert h.bytes_up[-1] == 2 * 3 * ((C * D + C) * 4 + 8)
    assert h.final_acc > 0.5


def test_feddisco_counts_label_upload_and_weights(fed_data):
    clients, test = fed_data
    h = run_federated(linear, clients, test, "feddisco", cfg(rounds=1), progress=False)
    assert h.bytes_up[0] == K * ((C * D + C) * 4 + 8) + K * C * 8  # + int64 label counts once
    ups = [Message(f"client{k}", {"n": n}) for k, n in zip((0, 1, 2), (10, 30, 60))]
    assert h.bytes_down[0] == K * (C * D + C) * 4  # the setup round broadcasts nothing
    memory = {"discrepancy": {0: 0.0, 1: 0.5, 2: 2.0}}
    alg = FedDisco(a=0.5, b=0.1, metric="l2")  # raw discrepancy
    raw = [max(0.0, p - 0.5 * d + 0.1) for p, d in zip((0.1, 0.3, 0.6), (0.0, 0.5, 2.0))]
    assert alg.aggregation_weights(memory, ups) == pytest.approx([r / sum(raw) for r in raw])
    alg = FedDisco(a=0.5, b=0.1)  # kl: discrepancies normalised to sum 1 over the round
    raw = [max(0.0, p - 0.5 * d / 2.5 + 0.1) for p, d in zip((0.1, 0.3, 0.6), (0.0, 0.5, 2.0))]
    assert alg.aggregation_weights(memory, ups) == pytest.approx([r / sum(raw) for r in raw])


def test_feddisco_kl_discrepancy_from_label_counts():
    """Client 0 holds classes {0, 1} equally, client 1 all classes: KL to uniform = log 2 and 0."""
    x = torch.zeros(6, 2)
    clients = [(x[:2], torch.tensor([0, 1])), (x[:4], torch.tensor([0, 1, 2, 3]))]
    memory = {}
    run_federated(lambda: LinearHead(2, 4), clients, (x[:2], torch.tensor([0, 1])), FedDisco(), cfg(rounds=1),
                  progress=False, memory=memory)
    assert memory["discrepancy"][0] == pytest.approx(math.log(2))
    assert memory["discrepancy"][1] == pytest.approx(0.0, abs=1e-12)


def test_feddyn_server_update_is_algorithm1():
    alpha = 0.5
    alg = FedDyn(alpha=alpha)
    model = linear()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    theta_prev = {k: v.clone() for k, v in model.state_dict().items()}

    server = GradientServer(alg, model, num_clients=3)  # 3 non-empty clients
    h = {k: torch.randn_like(v) for k, v in theta_prev.items()}
    for k in h:
        server.memory["h"][k].copy_(h[k])
    thetas = [{k: v + torch.randn_like(v) for k, v in theta_prev.items()} for _ in range(2)]
    server.receive([Message(f"client{i}", {"state": t, "n": 5}) for i, t in enumerate(thetas)])
    m = 3
    for k in theta_prev:
        h_new = h[k] - alpha / m * sum(t[k] - theta_prev[k] for t in thetas)
        expect = sum(t[k] for t in thetas) / 2 - h_new / alpha
        torch.testing.assert_close(server.memory["h"][k], h_new)
        torch.testing.assert_close(model.state_dict()[k], expect)


def test_fedntd_ignores_true_class():
    torch.manual_seed(0)
    alg = FedNTD(beta=1.0, tau=2.0)
    g = linear().requires_grad_(False)
    x, y = torch.randn(8, D), torch.randint(0, C, (8,))
    assert alg.local_loss(local(g, g), x, y, g(x)).abs().item() < 1e-6
    logits = g(x) + torch.randn(8, C)
    base = alg.local_loss(local(None, g), x, y, logits)
    bumped = logits.clone()
    bumped[torch.arange(8), y] += 5.0  # change only the true-class logits
    assert base.item() > 0
    assert alg.local_loss(local(None, g), x, y, bumped).item() == pytest.approx(base.item())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_method_beats_chance(fed_data, name):
    clients, test = fed_data
    model_fn = (lambda: MOONHead(D, C, hidden=16, out_dim=8)) if name == "moon" else linear
    h = run_federated(model_fn, clients, test, name, cfg(rounds=3, participation=0.5), progress=False)
    assert h.final_acc > 0.8, (name, h.test_acc)
    df = h.to_frame()
    assert list(df.columns) == ["round", "test_acc", "wall_s", "bytes_up", "bytes_down"]
    assert len(df) == 3


def test_moon_needs_features(fed_data):
    clients, test = fed_data

    def bare():
        return torch.nn.Linear(D, C)

    with pytest.raises(TypeError, match="features"):
        run_federated(bare, clients, test, "moon", cfg(rounds=1), progress=False)


def test_participation_sampling(fed_data):
    gen = torch.Generator().manual_seed(0)
    for p, m in ((0.35, 4), (0.1, 1), (1.0, 10), (0.01, 1)):
        ids = sample_clients(10, p, gen)
        assert len(ids) == m == len(set(ids)) and all(0 <= i < 10 for i in ids)
    clients, test = fed_data
    h = run_federated(linear, clients, test, "fedavg", cfg(rounds=4, participation=0.35), progress=False)
    assert all(len(set(ids)) == 4 for ids in h.participants)
    assert len({tuple(ids) for ids in h.participants}) > 1


def test_eval_every_and_time_to_final(fed_data):
    clients, test = fed_data
    h = run_federated(linear, clients, test, "fedavg", cfg(rounds=5, eval_every=2), progress=False)
    assert h.round == [2, 4, 5]
    assert h.time_to_final(1.0) <= h.wall_s[-1]
    assert h.time_to_final(0.01) == h.wall_s[0]
    hh = History(round=[1, 2, 3], test_acc=[0.5, 0.9, 0.8], wall_s=[1.0, 2.0, 3.0])
    assert hh.time_to_final(1.0) == 2.0 and hh.time_to_final(0.7) == 2.0 and hh.time_to_final(0.6) == 1.0 and hh.best_acc == 0.9


@pytest.mark.parametrize("field,value", [
    ("rounds", 0), ("participation", 0.0), ("participation", 1.5), ("lr", 0.0), ("lr", -1.0),
    ("local_epochs", 0), ("batch_size", 0), ("eval_every", 0), ("momentum", 1.0),
    ("weight_decay", -1.0), ("device", "tpu"),
])
def test_bad_config(field, value):
    with pytest.raises(ValueError, match=field):
        cfg(**{field: value})


def test_make_algorithm_errors():
    with pytest.raises(ValueError, match="allowed: fedavg"):
        make_algorithm("fedfoo")
    with pytest.raises(TypeError, match="nu"):
        make_algorithm("fedprox", nu=0.1)
    with pytest.raises(ValueError, match="mu"):
        make_algorithm("fedprox", mu=-1.0)
    assert repr(make_algorithm("MOON", mu=2.0)) == "MOON(mu=2.0, tau=0.5)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_cuda_runs(fed_data, name):
    clients, test = fed_data
    model_fn = (lambda: MOONHead(D, C, hidden=16, out_dim=8)) if name == "moon" else linear
    h = run_federated(model_fn, clients, test, name, cfg(device="cuda", participation=0.5), progress=False)
    assert h.final_acc > 0.8
    h2 = run_federated(model_fn, clients, test, name, cfg(device="cuda", participation=0.5), progress=False)
    assert h.participants == h2.participants and h.bytes_up == h2.bytes_up


def test_num_threads_restored(fed_data):
    clients, test = fed_data
    before = torch.get_num_threads()
    run_federated(linear, clients[:2], test, "fedavg", cfg(rounds=1, num_threads=1), progress=False)
    assert torch.get_num_threads() == before


def test_fedntd_matches_authors_formula_with_tau_squared():
    """tau^2 * KL(q_global || p_local) over the not-true classes, batch mean (authors' NTD_Loss);
    computed here by masking instead of gathering. Without the tau^2 factor it is 4x smaller."""
    torch.manual_seed(1)
    tau, beta = 2.0, 0.7
    alg = FedNTD(beta=beta, tau=tau)
    g = linear().requires_grad_(False)
    x, y = torch.randn(16, D), torch.randint(0, C, (16,))
    logits = g(x) + torch.randn(16, C)
    mask = torch.ones(16, C, dtype=torch.bool)
    mask[torch.arange(16), y] = False
    lg, ll = g(x)[mask].view(16, C - 1), logits[mask].view(16, C - 1)
    q, p = torch.softmax(lg / tau, 1), torch.softmax(ll / tau, 1)
    expected = beta * tau ** 2 * (q * (q.log() - p.log())).sum(1).mean()
    got = alg.local_loss(local(None, g), x, y, logits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_moon_head_is_authors_projection():
    head = MOONHead(D, C)
    assert (head.l1.in_features, head.l1.out_features, head.l2.out_features, head.l3.in_features) == (D, D, 256, 256)
    torch.manual_seed(0)
    z = head.features(torch.randn(64, D))
    assert z.shape == (64, 256) and float(z.detach().min()) < 0  # z is the linear output of l2 (no ReLU)


def test_moon_first_participation_has_no_contrastive_term():
    """Authors' round 1: no previous model, contrastive logits = [positive] only, l_con = 0."""
    torch.manual_seed(0)
    model, glob = MOONHead(D, C, hidden=16, out_dim=8), MOONHead(D, C, hidden=16, out_dim=8)
    x, y = torch.randn(32, D), torch.randint(0, C, (32,))
    alg = MOON(mu=1.0, tau=0.5)
    loss = alg.training_loss(local(model, glob, {"prev": None}), x, y)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(model(x), y))


def test_moon_contrastive_term_matches_eq3():
    torch.manual_seed(0)
    model, glob, prev = (MOONHead(D, C, hidden=16, out_dim=8) for _ in range(3))
    x, y = torch.randn(32, D), torch.randint(0, C, (32,))
    alg = MOON(mu=2.0, tau=0.5)
    loss = alg.training_loss(local(model, glob, {"prev": prev.state_dict()}, spare=prev), x, y)
    z, zg, zp = model.features(x), glob.features(x), prev.features(x)
    cos = torch.nn.functional.cosine_similarity
    e_pos, e_neg = torch.exp(cos(z, zg) / 0.5), torch.exp(cos(z, zp) / 0.5)
    expected = torch.nn.functional.cross_entropy(model(x), y) + 2.0 * (-torch.log(e_pos / (e_pos + e_neg))).mean()
    torch.testing.assert_close(loss, expected)


def test_moon_round_one_equals_fedavg(fed_data):
    clients, test = fed_data
    model_fn = lambda: MOONHead(D, C, hidden=16, out_dim=8)  # noqa: E731
    a = run_federated(model_fn, clients, test, "moon", cfg(rounds=1), progress=False)
    b = run_federated(model_fn, clients, test, "fedavg", cfg(rounds=1), progress=False)
    for k in a.final_state:
        torch.testing.assert_close(a.final_state[k], b.final_state[k], rtol=0, atol=0)


def test_history_cost_and_callbacks(fed_data):
    clients, test = fed_data
    seen = []
    h = run_federated(linear, clients, test, "fedavg", cfg(rounds=2),
                      progress=False, callbacks=[lambda r, server, cost: seen.append((r, cost.bytes_up))])
    assert [r for r, _ in seen] == [1, 2] and seen[-1][1] == h.bytes_up[-1] == h.cost.bytes_up
    assert h.cost.bytes_down == h.bytes_down[-1] and h.cost.seconds == pytest.approx(h.wall_s[-1])


def test_client_batches_do_not_depend_on_the_other_clients(fed_data):
    """Each client draws its mini-batch order from its own generator: client 0's single-round
    update is the same whether it trains alone or with every other client."""
    clients, test = fed_data
    from fedlib.core.protocol import ClientStates
    from fedlib.federated.gradient import GradientClient

    def upload(ids):
        seed_everything(0)
        model = linear()
        client = GradientClient(make_algorithm("fedavg"), model, cfg(), C)
        states = ClientStates(client)
        msg = Message("server", {"state": model.state_dict()})
        return {k: client.step(clients[k], states[k], msg) for k in ids}[0]["state"]

    assert states_equal(upload([0]), upload(range(K)))


def test_feddyn_and_moon_keep_state_per_client(fed_data):
    """FedDyn's correction and MOON's previous model live in each client's own state."""
    clients, test = fed_data
    from fedlib.core.protocol import ClientStates

    states = ClientStates()
    run_federated(linear, clients[:3], test, "feddyn", cfg(rounds=2), progress=False, states=states)
    grads = [states[k]["grad"] for k in range(3)]
    assert all(g is not None for g in grads) and not torch.equal(grads[0][0], grads[1][0])
    states = ClientStates()
    run_federated(lambda: MOONHead(D, C, hidden=16, out_dim=8), clients[:3], test, "moon", cfg(rounds=1),
                  progress=False, states=states)
    assert sorted(states) == [0, 1, 2] and all(states[k]["prev"] is not None for k in range(3))
