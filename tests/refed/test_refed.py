"""Tests for fedlib.refed.algorithm: Re-Fed cache selection (PIM, Eqs. 3-5) and the replay baselines."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import make_cfg, make_data, states_equal
from fedlib.core.persample import grad_sq_norms, last_layer_grad_sq_norms, reference_grad_sq_norms
from fedlib.federated.gradient import LinearHead, MLPHead
from fedlib.data.streams import make_stream
from fedlib.federated.incremental import run_class_incremental
from fedlib.federated.learner import FixedLearner, GradientLearner, select_top
from fedlib.refed.algorithm import LEARNERS, RefedReplay, importance_scores, make_learner, q_lambda, train_pim
from fedlib.refed.studies import rounds_to_best

D, C, T, K, SEED = 8, 6, 3, 3, 0


def cfg(**kw):
    return make_cfg(dict(rounds=3, local_epochs=1, batch_size=32, lr=0.1, participation=0.67), **kw)


def linear():
    return LinearHead(D, C)


def mlp():
    return MLPHead(D, C, hidden=16)


@pytest.fixture(scope="module")
def data():
    x_tr, y_tr, x_te, y_te = make_data()
    stream = make_stream(y_tr, y_te, T, seed=SEED)
    return stream, x_tr, y_tr, x_te, y_te


def stage_clients(data, t, beta=None):
    stream, x_tr, y_tr, _, _ = data
    pos = stream.relabel(y_tr)
    parts = stream.client_partitions(t, y_tr, K, beta, SEED)
    return [(torch.from_numpy(x_tr[p]), torch.from_numpy(pos[p])) for p in parts]


def run_stages(learner, data, stages=T, beta=None):
    stream = data[0]
    for t in range(stages):
        learner.learn_task(t, stage_clients(data, t, beta), stream.num_seen(t))
    return learner


# ----------------------------------------------------------------------------------------------
# scores and selection
# ----------------------------------------------------------------------------------------------
def test_importance_weightings_on_hand_made_norms():
    # rows = PIM iterations p = 1, 2, 3; columns = samples A (large early), B (large late)
    g = torch.tensor([[6.0, 0.0], [0.0, 3.0], [0.0, 6.0]])
    early = importance_scores(g, "early")
    assert torch.allclose(early, torch.tensor([6.0, 3.0 / 2 + 6.0 / 3], dtype=torch.float64))
    assert torch.allclose(importance_scores(g, "average"), torch.tensor([6.0, 9.0], dtype=torch.float64))
    assert torch.equal(importance_scores(g, "late"), -early)
    # early emphasis keeps A, equal weights keep B, late (reversed early ranking) keeps B
    assert select_top(early, 1).tolist() == [0]
    assert select_top(importance_scores(g, "average"), 1).tolist() == [1]
    assert select_top(importance_scores(g, "late"), 1).tolist() == [1]
    with pytest.raises(ValueError, match="weighting"):
        importance_scores(g, "middle")
    with pytest.raises(ValueError, match="grad_sq"):
        importance_scores(torch.ones(3), "early")


def test_select_top_ties_and_class_balance():
    scores = torch.tensor([1.0, 5.0, 5.0, 0.0, 3.0, 2.0])
    assert select_top(scores, 2).tolist() == [1, 2]
    assert select_top(scores, 3).tolist() == [1, 2, 4]
    assert select_top(scores, 0).tolist() == []
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    # half the budget per class: class 0 -> {1, 2}, class 1 -> {4, 5}
    assert select_top(scores, 4, labels, class_balanced=True).tolist() == [1, 2, 4, 5]
    with pytest.raises(ValueError, match="budget"):
        select_top(scores, 7)
    # equal quotas: 8 of class 0 and 2 of class 1 -> proportional 4 : 1, equal 3 : 2 (class 1 capped at 2,
    # what it cannot use goes to class 0)
    s2 = torch.arange(10.0).flip(0)
    lab = torch.tensor([0] * 8 + [1] * 2)
    assert select_top(s2, 5, lab, "proportional").tolist() == [0, 1, 2, 3, 8]
    assert select_top(s2, 5, lab, "equal").tolist() == [0, 1, 2, 8, 9]
    assert select_top(s2, 8, lab, "equal").tolist() == [0, 1, 2, 3, 4, 5, 8, 9]
    lab3 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])   # remainder to the classes with most left, then lower label
    assert np.bincount(lab3[select_top(s2, 7, lab3, "equal")].numpy()).tolist() == [3, 2, 2]
    with pytest.raises(ValueError, match="class_balanced"):
        select_top(scores, 2, labels, class_balanced="uniform")


# ----------------------------------------------------------------------------------------------
# per-sample gradient norms (Eq. 4)
# ----------------------------------------------------------------------------------------------
def test_per_sample_norms_match_autograd_loop_and_closed_form():
    torch.manual_seed(0)
    model = mlp()
    x, y = torch.randn(20, D), torch.randint(0, 4, (20,))
    names = [n for n, _ in model.named_parameters()]
    exact = grad_sq_norms(model, x, y, 4, batch_size=7)  # chunks of 7: 3 vmap calls
    assert exact.shape == (20,)
    assert torch.allclose(exact, reference_grad_sq_norms(model, x, y, 4, names), rtol=1e-5, atol=1e-7)
    last = ["classifier.weight", "classifier.bias"]
    ref = reference_grad_sq_norms(model, x, y, 4, last)
    assert torch.allclose(grad_sq_norms(model, x, y, 4, names=last), ref, rtol=1e-5, atol=1e-7)
    assert torch.allclose(last_layer_grad_sq_norms(model, x, y, 4), ref, rtol=1e-5, atol=1e-7)
    lin = linear()  # for a linear model the closed form is the exact all-parameter norm
    assert torch.allclose(last_layer_grad_sq_norms(lin, x, y, 4), grad_sq_norms(lin, x, y, 4),
                          rtol=1e-5, atol=1e-7)
    # a model whose output is not its last Linear's output is refused
    bad = torch.nn.Sequential(torch.nn.Linear(D, C), torch.nn.Tanh())
    with pytest.raises(ValueError, match="last nn.Linear"):
        last_layer_grad_sq_norms(bad, x, y, 4)


# ----------------------------------------------------------------------------------------------
# PIM (Eq. 3) and Lemma 1
# ----------------------------------------------------------------------------------------------
def test_pim_lambda_edges_and_lemma1_monotonicity():
    assert q_lambda(0.2) == pytest.approx(2.0) and q_lambda(0.8) == pytest.approx(0.125)
    for lam in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="lam"):
            q_lambda(lam)
    x_tr, y_tr, _, _ = make_data(n_train=10)
    x, y = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    torch.manual_seed(1)
    w = linear()
    before = {k: v.clone() for k, v in w.state_dict().items()}
    # full-batch GD (deterministic path); for a linear model the closed form is the exact norm
    kw = dict(epochs=60, lr=0.02, batch_size=len(y), grad_norm="last_layer")
    res = {lam: train_pim(w, x, y, C, lam=lam, **kw) for lam in (0.01, 0.2, 0.5, 0.8, 0.99)}
    assert states_equal(w.state_dict(), before)  # w untouched
    lams = sorted(res)
    dists = [res[lam].dist_sq for lam in lams]
    losses = [res[lam].loss for lam in lams]
    assert all(a < b for a, b in zip(dists, dists[1:])), dists  # ||v(lam) - w||^2 increases
    assert all(a > b for a, b in zip(losses, losses[1:])), losses  # local loss decreases
    assert res[0.01].dist_sq < 0.1 * res[0.99].dist_sq  # lam -> 0: v stays near w
    assert res[0.8].grad_sq.shape == (60, len(y)) and bool((res[0.8].grad_sq > 0).all())
    with pytest.raises(ValueError, match="lam"):
        train_pim(w, x, y, C, lam=1.0, **kw)
    with pytest.raises(ValueError, match="diverges"):  # lr * q(0.01) = 0.5 * 49.5 >= 2
        train_pim(w, x, y, C, lam=0.01, epochs=1, lr=0.5)


# ----------------------------------------------------------------------------------------------
# the learner
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,memory", [("total", 100), ("replay", 40)])
def test_cache_respects_memory_for_every_client_and_task(data, mode, memory):
    learner = make_learner("refed", linear, cfg(), num_classes=C, memory=memory, memory_mode=mode,
                           pim_epochs=2, progress=False)
    run_stages(learner, data, beta=1.0)
    assert len(learner.memory_log) == T
    for t, log in enumerate(learner.memory_log):
        if t == 0:
            assert (log["cached"] == 0).all()
            continue
        assert (log["cached"] <= log["budget"]).all() and (log["cached"] == log["budget"]).all()
        if mode == "total":
            assert (log["local"] <= memory).all()
            assert (log["cached"] == np.minimum(memory - log["new"], log["pool"])).all()
        else:
            assert (log["cached"] <= memory).all()
        assert (log["local"] == log["cached"] + log["new"]).all()
        assert len(learner.pim_log[t]) == K
    # the last local sets hold old classes (replay) and only seen labels
    labels = torch.cat([learner.cache_labels(k) for k in range(K)])
    assert int(labels.min()) < data[0].num_seen(T - 2) and int(labels.max()) < C


def test_check_memory_catches_each_modes_constraint(data):
    for mode, memory in [("total", 100), ("replay", 40)]:
        lr = run_stages(make_learner("fedavg_replay", linear, cfg(), num_classes=C, memory=memory,
                                     memory_mode=mode, progress=False), data, beta=1.0)
        assert lr.check_memory() == []
        log = lr.memory_log[-1]
        assert (log["old"] == log["cached"]).all() and (log["old"] > 0).all()
        # the composition logs add up and the cache is a sub-multiset of the pool
        assert log["old_tasks"].shape == (K, T - 1) and (log["old_tasks"].sum(1) == log["old"]).all()
        assert (log["pool_tasks"].sum(1) == log["pool"]).all() and (log["old_tasks"] <= log["pool_tasks"]).all()
        assert (log["old_classes"].sum(1) == log["old"]).all() and (log["old_classes"] <= log["pool_classes"]).all()
        # a client that stores one old sample too many (counted from the task ids) is caught
        x, y, task = lr.local_sets[0]
        lr.local_sets[0] = (torch.cat([x, x[:1]]), torch.cat([y, y[:1]]), torch.cat([task, task.new_zeros(1)]))
        log["old"][0] += 1
        log["local"][0] += 1
        found = lr.check_memory()
        assert any("min(budget, pool)" in f for f in found)
        if mode == "total":
            assert any("local set" in f and "> M" in f for f in found) == bool(log["local"][0] > memory)
        # a cache below what the rule allows (unused storage) is caught as well
        log["old"][0] -= 2
        log["local"][0] -= 2
        assert any("min(budget, pool)" in f for f in lr.check_memory())
    # in replay mode the real constraint is old samples <= M: the local set may exceed M
    lr = run_stages(make_learner("fedavg_replay", linear, cfg(), num_classes=C, memory=40, memory_mode="replay",
                                 progress=False), data, beta=1.0)
    log = lr.memory_log[-1]
    assert (log["local"] > 40).any() and (log["old"] <= 40).all()
    log["old"][0] = log["cached"][0] = 41
    assert any("> M=40" in f for f in lr.check_memory())
    assert make_learner("fedavg", linear, cfg(), num_classes=C, progress=False).check_memory() == []


def test_each_task_samples_its_own_clients(data):
    """Regression: the replay learner passed the same config (seed) to run_federated at every task, so
    every task drew the same client subsets and batch orders."""
    lr = run_stages(make_learner("fedavg_replay", linear, cfg(rounds=2, participation=0.34), num_classes=C,
                                 memory=40, memory_mode="replay", progress=False), data, beta=1.0)
    per_task = [tuple(map(tuple, h.participants)) for h in lr.histories]
    assert len(set(per_task)) == T
    # first_rounds: a longer first task, the later ones keep config.rounds
    lr = run_stages(make_learner("fedavg", linear, cfg(rounds=2), num_classes=C, first_rounds=5, progress=False),
                    data, stages=2)
    assert [len(h.participants) for h in lr.histories] == [5, 2]


def test_class_balanced_refed_gives_every_class_the_same_quota(data):
    lr = run_stages(make_learner("refed_balanced", linear, cfg(), num_classes=C, memory=40, memory_mode="replay",
                                 pim_epochs=1, progress=False), data, stages=2, beta=1.0)
    assert lr.replay.class_balanced == "equal" and lr.check_memory() == []
    selected = 0
    for k in range(K):
        pool = stage_clients(data, 0, beta=1.0)[k][1]
        _, y, task = lr.local_sets[k]
        cached = np.bincount(y[task < 1].numpy(), minlength=C)
        have = np.bincount(pool.numpy(), minlength=C)
        budget = min(40, len(pool))
        assert cached.sum() == budget and (cached <= have).all()
        # equal quotas: a class below its fair share keeps all it has, the others differ by at most one
        if budget == len(pool):
            continue
        selected += 1
        full = cached < have
        assert full.any() and np.ptp(cached[full]) <= 1 and (cached[~full & (have > 0)] <= cached[full].max()).all()
    assert selected > 0
    with pytest.raises(ValueError, match="refed_balanced.*class_balanced='equal'"):
        make_learner("refed_balanced", linear, cfg(), num_classes=C, memory=40, class_balanced=False)


def test_task1_identity_with_fedavg(data):
    c = cfg()
    refed = make_learner("refed", linear, c, num_classes=C, memory=100, progress=False)
    fedavg = make_learner("fedavg", linear, c, num_classes=C, progress=False)
    replay = make_learner("fedavg_replay", linear, c, num_classes=C, memory=100, progress=False)
    for lr in (refed, fedavg, replay):
        lr.learn_task(0, stage_clients(data, 0, beta=1.0), data[0].num_seen(0))
    assert states_equal(refed.model.state_dict(), fedavg.model.state_dict())
    assert states_equal(refed.model.state_dict(), replay.model.state_dict())
    # with n_k-weighted aggregation it is bit-identical to fcil's Finetune (plain FedAvg + masked CE)
    sized = make_learner("refed", linear, c, num_classes=C, memory=100, aggregation="size", progress=False)
    fcil = GradientLearner(linear, c, "finetune", num_classes=C, progress=False)
    for lr in (sized, fcil):
        lr.learn_task(0, stage_clients(data, 0, beta=1.0), data[0].num_seen(0))
    assert states_equal(sized.model.state_dict(), fcil.model.state_dict())
    assert not states_equal(sized.model.state_dict(), refed.model.state_dict())  # uniform != size-weighted


def test_refed_equals_random_replay_when_memory_holds_everything(data):
    c = cfg()
    big = dict(memory=10_000, memory_mode="replay", progress=False)
    refed = run_stages(make_learner("refed", linear, c, num_classes=C, pim_epochs=1, **big), data)
    rand = run_stages(make_learner("fedavg_replay", linear, c, num_classes=C, **big), data)
    assert states_equal(refed.model.state_dict(), rand.model.state_dict())
    assert (refed.memory_log[-1]["cached"] == refed.memory_log[-1]["pool"]).all()


def test_weightings_change_the_cache(data):
    caches = {}
    for w in ("early", "late"):
        lr = make_learner("refed", mlp, cfg(), num_classes=C, memory=90, weighting=w, pim_epochs=3,
                          grad_norm="last_layer", progress=False)
        run_stages(lr, data, stages=2)
        n_cached = int(lr.memory_log[1]["cached"][0])
        caches[w] = lr.pim_log[1][0]["scores"], lr.local_sets[0][0][:n_cached]
    s_early, s_late = caches["early"][0], caches["late"][0]
    assert torch.equal(s_late, -s_early)
    # same size, different samples (highest vs lowest early-emphasis scores)
    assert caches["early"][1].shape == caches["late"][1].shape
    assert not torch.equal(caches["early"][1], caches["late"][1])


def test_all_methods_run_on_the_protocol(data):
    stream, x_tr, y_tr, x_te, y_te = data
    c = cfg(rounds=2)
    results = {}
    for method in LEARNERS:
        lr = make_learner(method, linear, c, num_classes=C, memory=100, pim_epochs=1, progress=False)
        results[method] = run_class_incremental(lr, stream, x_tr, y_tr, x_te, y_te, K, None, SEED, progress=False)
        assert results[method].acc.shape == (T, T)
    fixed = results["fixed"]
    assert fixed.bytes_up[0] > 0 and (fixed.bytes_up[1:] == 0).all()
    # never predicts a class learned after task 1
    assert fixed.acc[1, 1] == 0 and fixed.acc[2, 1] == 0 and fixed.acc[2, 2] == 0
    assert fixed.acc[1, 0] == fixed.acc[2, 0] == fixed.acc[0, 0]  # frozen model
    assert results["fedewc"].bytes_up[1] > results["fedavg"].bytes_up[1]  # Fisher uploads
    assert results["refed"].bytes_up[1] == results["fedavg_replay"].bytes_up[1]  # no extra communication


def test_domain_incremental_and_eval_curves():
    streams = [make_data(seed=s, n_train=40, n_test=20, shift=1.5 * s) for s in range(3)]
    c = cfg(rounds=4)

    def clients(t):
        x, y = torch.from_numpy(streams[t][0]), torch.from_numpy(streams[t][1])
        return [(x[k::K], y[k::K]) for k in range(K)]

    def eval_data(t):
        return torch.from_numpy(streams[t][2]), torch.from_numpy(streams[t][3])

    for method in ("refed", "fedlwf", "fedewc", "fixed"):
        lr = make_learner(method, linear, c, num_classes=C, memory=100, scenario="domain", pim_epochs=1,
                          eval_data=eval_data, progress=False)
        for t in range(3):
            lr.learn_task(t, clients(t), C)
        if method == "fixed":
            assert lr.histories[1] is None and rounds_to_best(lr.histories[1]) == 0
            continue
        hist = lr.histories[-1]
        assert len(hist.test_acc) == 4 and not np.isnan(hist.test_acc).any()
        assert 1 <= rounds_to_best(hist) <= 4
        assert hist.test_acc[-1] == pytest.approx(float((lr.predict(eval_data(2)[0], C) == eval_data(2)[1]).float().mean()))
    assert lr.memory_log[-1] == {}


def test_masked_per_round_accuracy_matches_predict(data):
    stream, x_tr, y_tr, x_te, y_te = data
    pos_te = stream.relabel(y_te)

    def eval_data(t):
        idx = np.concatenate([stream.tasks[s].test_idx for s in range(t + 1)])
        return torch.from_numpy(x_te[idx]), torch.from_numpy(pos_te[idx])

    lr = make_learner("refed", linear, cfg(), num_classes=C, memory=100, pim_epochs=1, eval_data=eval_data,
                      progress=False)
    run_stages(lr, data, stages=2)
    x, y = eval_data(1)
    assert lr.histories[1].test_acc[-1] == pytest.approx(float((lr.predict(x, stream.num_seen(1)) == y).float().mean()))
    assert not lr.model._forward_hooks  # the eval mask hook is removed after the stage


def test_bad_input(data):
    c = cfg()
    for kw, match in [(dict(scenario="task"), "scenario"), (dict(weighting="middle"), "weighting"),
                      (dict(lam=1.0), "lam"), (dict(lam=0.0), "lam"), (dict(memory_mode="all"), "memory_mode"),
                      (dict(grad_norm="fisher"), "grad_norm"), (dict(memory=0), "memory"),
                      (dict(memory=None), "memory"), (dict(pim_epochs=0), "pim_epochs"),
                      (dict(class_balanced="uniform"), "class_balanced"), (dict(first_rounds=0), "first_rounds")]:
        with pytest.raises(ValueError, match=match):
            make_learner("refed", linear, c, num_classes=C, **{"memory": 100, **kw})
    with pytest.raises(ValueError, match="method"):
        make_learner("icarl", linear, c, num_classes=C)
    with pytest.raises(TypeError, match="replay"):
        GradientLearner(linear, c, num_classes=C, replay="herding")
    with pytest.raises(ValueError, match="aggregation"):
        GradientLearner(linear, c, num_classes=C, aggregation="median")
    with pytest.raises(ValueError, match="memory"):
        make_learner("fedprox_replay", linear, c, num_classes=C)
    with pytest.raises(TypeError):
        make_learner("fedavg", linear, c, num_classes=C, beta=3)
    # memory smaller than a client's new task under memory_mode="total": refused before training task 2
    lr = make_learner("refed", linear, c, num_classes=C, memory=50, pim_epochs=1, progress=False)
    lr.learn_task(0, stage_clients(data, 0), data[0].num_seen(0))
    with pytest.raises(ValueError, match="memory=50.*memory_mode='replay'"):
        lr.learn_task(1, stage_clients(data, 1), data[0].num_seen(1))
    assert len(lr.histories) == 1 and len(lr.memory_log) == 1
    with pytest.raises(ValueError, match="num_seen"):
        lr.learn_task(1, stage_clients(data, 1), data[0].num_seen(0))
    with pytest.raises(ValueError, match="in order"):
        lr.learn_task(2, stage_clients(data, 2), data[0].num_seen(2))
    with pytest.raises(ValueError, match="same 3 clients"):
        lr.learn_task(1, stage_clients(data, 1)[:2], data[0].num_seen(1))
    assert isinstance(make_learner("fixed", linear, c, num_classes=C, memory=5), FixedLearner)


def test_cache_is_client_state_and_callbacks_observe_the_run(data):
    """The replay cache lives in each client's own state across stages; on_stage_end and round
    callbacks see every stage and round (what the notebooks used to monkey-patch for)."""
    kept, rounds = [], []
    lr = make_learner("fedavg_replay", linear, cfg(rounds=2), num_classes=C, memory=40, memory_mode="replay",
                      progress=False, callbacks=[lambda r, server, cost: rounds.append(r)],
                      on_stage_end=[lambda t, learner: kept.append((t, copy.deepcopy(learner.model.state_dict())))])
    run_stages(lr, data, beta=1.0)
    assert [t for t, _ in kept] == [0, 1, 2] and rounds == [1, 2] * T
    assert states_equal(kept[-1][1], lr.model.state_dict())
    locals_ = [lr.states[k]["local"] for k in range(K)]
    assert all(loc[0] is not other[0] for i, loc in enumerate(locals_) for other in locals_[i + 1:])
    assert [len(loc[1]) for loc in locals_] == lr.memory_log[-1]["local"].tolist()
    assert all(int((loc[2] < T - 1).sum()) == lr.memory_log[-1]["old"][k] for k, loc in enumerate(locals_))
    fixed = make_learner("fixed", linear, cfg(rounds=1), num_classes=C, progress=False,
                         on_stage_end=[lambda t, learner: kept.append((t, None))])
    run_stages(fixed, data)
    assert [t for t, _ in kept[-T:]] == list(range(T))


def test_refed_selection_uses_each_clients_own_stream(data):
    """Client k's cache at stage t depends only on its own pool, the broadcast model and
    torch_generator(seed, "cache", t, k): two identical runs give identical caches, and the
    RefedReplay policy object keeps no per-client state."""
    runs = [run_stages(make_learner("refed", linear, cfg(), num_classes=C, memory=40, memory_mode="replay",
                                    pim_epochs=1, progress=False), data, stages=2) for _ in range(2)]
    for k in range(K):
        assert all(torch.equal(a, b) for a, b in zip(runs[0].local_sets[k], runs[1].local_sets[k]))
    assert isinstance(runs[0].replay, RefedReplay) and set(vars(runs[0].replay)) == {
        "memory", "memory_mode", "lam", "pim_epochs", "pim_lr", "pim_momentum", "weighting", "prox_scaling",
        "grad_norm", "class_balanced"}


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's runs (run_scenario, ScenarioRuns)
# ----------------------------------------------------------------------------------------------
def _scenario(data):
    stream, x_tr, y_tr, x_te, y_te = data
    return {"name": "toy", "x_train": torch.from_numpy(x_tr), "y_train": y_tr, "x_test": torch.from_numpy(x_te),
            "y_test": y_te, "stream": lambda seed: make_stream(y_tr, y_te, T, seed=seed), "alpha": 1.0, "lr": 0.1,
            "memory": 15, "lam": 0.8, "rounds": 2, "first_rounds": None, "epochs": 1}


SETTINGS = dict(model_fn=linear, num_clients=K, batch_size=32, momentum=0.0, participation=0.67, device="cpu",
                num_threads=1, memory_mode="replay", pim_epochs=2, grad_norm="exact", num_classes=C,
                method_hparams={"fedprox_replay": {"mu": 0.01}})


def test_run_scenario_equals_the_direct_run(data):
    from fedlib.refed.studies import run_scenario

    scen = _scenario(data)
    for method in ["refed", "fedprox_replay", "fedavg"]:
        out = run_scenario(scen, "class", method, SEED, **SETTINGS)
        # the reference: the learner built and run by hand
        stream = make_stream(scen["y_train"], scen["y_test"], T, seed=SEED)
        kw = {"memory_mode": "replay"} if method != "fedavg" else {}
        if method == "refed":
            kw.update(lam=0.8, weighting="early", pim_epochs=2, grad_norm="exact")
        if method == "fedprox_replay":
            kw["mu"] = 0.01
        config = make_cfg(dict(rounds=2, local_epochs=1, batch_size=32, lr=0.1, participation=0.67,
                               momentum=0.0, weight_decay=0.0, eval_every=10**6))
        learner = make_learner(method, linear, config, num_classes=C, memory=15, progress=False, **kw)
        ref = run_class_incremental(learner, stream, scen["x_train"], scen["y_train"], scen["x_test"],
                                    scen["y_test"], K, 1.0, SEED, progress=False)
        assert np.array_equal(out["result"].acc, ref.acc, equal_nan=True), method
        assert states_equal(out["learner"].model.state_dict(), learner.model.state_dict())
        row = out["row"]
        assert row["key"] == method and row["A_T"] == pytest.approx(ref.summary()["A_T"])
        assert row["top1_T"] == pytest.approx(100 * ref.top1[-1]) and np.isnan(row["CoR_sum"])
        assert out["cor"] == [] and not out["tracked"]
        assert out["client_stages"] == (0 if method == "fedavg" else
                                        sum(len(log["new"]) for log in learner.memory_log[1:] if len(log)))


def test_scenario_runs_cache_tracking_and_proxy(data):
    from fedlib.refed.studies import PIM_METHODS, REPLAY_METHODS, ScenarioRuns

    assert set(PIM_METHODS) <= set(REPLAY_METHODS) and "fedavg" not in REPLAY_METHODS
    runs = ScenarioRuns({"class": _scenario(data)}, **SETTINGS)
    a = runs("class", "fedavg", SEED)
    assert runs("class", "fedavg", SEED) is a                        # cached
    assert runs("class", "fedavg", SEED, memory=99, lam=0.3) is a    # memory and lambda do not apply to FedAvg
    tracked = runs("class", "fedavg", SEED, track=True)              # an untracked run does not serve a tracked one
    assert tracked is not a and tracked["tracked"] and len(tracked["cor"]) == T
    assert tracked["row"]["CoR_sum"] == sum(tracked["cor"])
    assert runs("class", "fedavg", SEED) is tracked                  # a tracked run serves an untracked request
    assert np.array_equal(tracked["result"].acc, a["result"].acc, equal_nan=True)
    proxy = runs("class", "refed_proxy", SEED, memory=10)
    assert proxy["learner"].replay.grad_norm == "last_layer" and proxy["result"].method == "refed [last-layer proxy]"
    late = runs("class", "refed", SEED, weighting="late")
    assert late["learner"].replay.weighting == "late" and late["result"].method.endswith("(late)")
    assert runs.memory_checks["runs"] == 4 and len(runs.runs) == 3   # the tracked FedAvg run replaced the untracked
    assert runs.memory_checks["client-stages"] == proxy["client_stages"] + late["client_stages"] > 0


def _same_run(a, b):
    """Two runs of run_scenario give the same results, bit for bit (seconds aside)."""
    ra, rb = a["result"], b["result"]
    assert np.array_equal(ra.acc, rb.acc, equal_nan=True) and np.array_equal(ra.top1, rb.top1)
    assert np.array_equal(ra.bytes_up, rb.bytes_up) and a["cor"] == b["cor"]
    la, lb = a["learner"], b["learner"]
    assert states_equal(la.model.state_dict(), lb.model.state_dict())
    for ha, hb in zip(la.histories, lb.histories):
        assert (ha is None) == (hb is None)
        if ha is not None:
            assert ha.round == hb.round and ha.participants == hb.participants and ha.bytes_up == hb.bytes_up
            assert np.array_equal(ha.test_acc, hb.test_acc, equal_nan=True)
    for ma, mb in zip(la.memory_log, lb.memory_log):
        assert ma.keys() == mb.keys() and all(np.array_equal(ma[k], mb[k]) for k in ma)
    for pa, pb in zip(la.pim_log, lb.pim_log):
        assert (pa is None) == (pb is None)
        if pa is not None:
            assert all(torch.equal(x["scores"], y["scores"]) for x, y in zip(pa, pb))
    assert sorted(la.states) == sorted(lb.states) or la.replay is None or lb.replay is None
    for k in set(la.states) & set(lb.states):   # the clients' mini-batch streams continue alike
        assert torch.equal(torch.randperm(50, generator=la.states[k]["batches"]),
                           torch.randperm(50, generator=lb.states[k]["batches"]))


@pytest.mark.parametrize("track", [True, False])
def test_shared_first_stage_is_bit_identical(data, track):
    """ScenarioRuns trains task 1 once for the methods with the plain loss (FirstStageShare) and the
    other runs restore it: every result equals that of runs that each train task 1 themselves."""
    from fedlib.refed.studies import ScenarioRuns

    scen = {"class": _scenario(data), "domain": {**_scenario(data), "first_rounds": 3}}
    methods = ["refed", "refed_balanced", "refed_proxy", "fedavg_replay", "fedprox_replay", "fedavg", "fixed"]
    shared = ScenarioRuns(scen, **SETTINGS)
    alone = ScenarioRuns(scen, share_first_stage=False, **SETTINGS)
    assert alone.first_stage is None
    for kind in scen:
        for method in methods:
            a, b = shared(kind, method, SEED, track=track), alone(kind, method, SEED, track=track)
            _same_run(a, b)
            assert a["result"].wall_s[0] > 0
            # the first run trains task 1, the others restore it and count its measured seconds
            assert set(a["learner"].reused_seconds) == (set() if method in ("refed", "fedprox_replay") else {0})
            assert a["result"].wall_s[0] >= a["learner"].reused_seconds.get(0, 0.0) >= 0
    # one task-1 training per scenario for the six plain-loss methods (FedProx's loss differs at task 1)
    assert shared.first_stage.misses == 2 and shared.first_stage.hits == 2 * 5 and len(shared.first_stage) == 2
    # the first boundary's PIMs (same global model and pools) are trained once for Re-Fed and class-balanced
    # Re-Fed, and for other weightings and memory sizes; the last-layer proxy's norms differ
    hits = shared.pims.hits
    assert hits >= 2 * K   # refed_balanced at boundary 1, in both scenarios
    for kw in [dict(weighting="late"), dict(memory=8), dict(lam=0.5)]:
        _same_run(shared("class", "refed", SEED, track=track, **kw), alone("class", "refed", SEED, track=track, **kw))
    assert shared.pims.hits >= hits + 2 * K   # lam=0.5 is another PIM
    # another seed or alpha is another training
    shared("class", "fedavg", SEED + 1, track=track)
    shared("class", "fedavg", SEED, alpha=0.5, track=track)
    assert shared.first_stage.misses == 4


# ----------------------------------------------------------------------------------------------
# speed-ups that must not change a bit: fused PIM norms, SmallCNN's pooling, chunked evaluation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["cnn", "mlp"])
@pytest.mark.parametrize("n, batch_size", [(70, 16), (37, 8), (64, 32)])
def test_fused_pim_equals_the_two_pass_route(monkeypatch, arch, n, batch_size):
    """train_pim's fused step (norms from the step's own backward, full mini-batches of 2^k samples)
    gives the same G^p, PIM weights, distance and loss as a separate ghost-norm pass per mini-batch."""
    import fedlib.refed.speed as refed_speed
    from fedlib.federated.models import SmallCNN

    torch.manual_seed(1)
    if arch == "cnn":
        model, x = SmallCNN(1, 10, 12, width=3, hidden=8), torch.rand(n, 1, 12, 12)
    else:
        model, x = mlp(), torch.randn(n, D)
    y = torch.randint(0, 4, (n,))
    kw = dict(lam=0.6, epochs=2, lr=0.1, batch_size=batch_size, momentum=0.5, grad_norm="exact")
    calls = []
    real = refed_speed.fused_pim_step
    monkeypatch.setattr(refed_speed, "fused_pim_step", lambda *a: calls.append(1) or real(*a))
    fused = train_pim(model, x, y, 4, generator=torch.Generator().manual_seed(3), **kw)
    assert len(calls) == 2 * (n // batch_size)   # the full mini-batches (b = batch_size, a power of two)
    monkeypatch.setattr(refed_speed, "FUSED_PIM", False)
    plain = train_pim(model, x, y, 4, generator=torch.Generator().manual_seed(3), **kw)
    assert len(calls) == 2 * (n // batch_size)
    assert torch.equal(fused.grad_sq, plain.grad_sq) and fused.dist_sq == plain.dist_sq and fused.loss == plain.loss
    assert states_equal(fused.state, plain.state)


def test_smallcnn_pooling_equals_max_pool2d():
    """SmallCNN's max_pool2 (channels-last kernel) equals F.max_pool2d(x, 2) in values and gradients,
    ties included, and a training step of the SmallCNN is bit-identical with either."""
    import torch.nn.functional as F

    import fedlib.federated.models as models

    torch.manual_seed(0)
    for shape in [(5, 3, 8, 8), (4, 2, 7, 9), (1, 1, 2, 2)]:
        x = torch.relu(torch.randn(*shape)).round(decimals=1)   # many ties (zeros and repeats)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        g = torch.randn(shape[0], shape[1], shape[2] // 2, shape[3] // 2)
        out_a, out_b = models.max_pool2(a), F.max_pool2d(b, 2)
        assert torch.equal(out_a, out_b) and out_a.is_contiguous()
        out_a.backward(g)
        out_b.backward(g)
        assert torch.equal(a.grad, b.grad) and a.grad.is_contiguous()
        with torch.no_grad():
            assert torch.equal(models.max_pool2(x), F.max_pool2d(x, 2))
    net = models.SmallCNN(1, 10, 12, width=4, hidden=8)
    x, y = torch.rand(16, 1, 12, 12).round(decimals=1), torch.randint(0, 10, (16,))

    def grads():
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        return [p.grad.clone() for p in net.parameters()]

    fast = grads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "max_pool2", lambda h: F.max_pool2d(h, 2))
        slow = grads()
    assert all(torch.equal(u, v) for u, v in zip(fast, slow))


def test_eval_chunks_and_chunked_predictions():
    from fedlib.core.batches import eval_chunks
    from fedlib.federated.models import SmallCNN

    assert eval_chunks(0) == [] and eval_chunks(5) == [(0, 5)] and eval_chunks(256) == [(0, 256)]
    for n in [257, 513, 1000, 1025]:
        chunks = eval_chunks(n)
        assert chunks[0][0] == 0 and chunks[-1][1] == n and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert all(128 <= b - a <= 256 for a, b in chunks)
    with pytest.raises(ValueError, match="n"):
        eval_chunks(-1)
    torch.manual_seed(0)
    net = SmallCNN(1, 10, 28, width=8, hidden=64).eval()
    x = torch.rand(600, 1, 28, 28)
    with torch.no_grad():   # the evaluation's chunks give the logits of one forward; tiny chunks, to round-off
        whole = net(x)
        assert torch.equal(torch.cat([net(x[a:b]) for a, b in eval_chunks(600)]), whole)
        small = torch.cat([net(x[a:b]) for a, b in eval_chunks(600, 7)])
        torch.testing.assert_close(small, whole, rtol=1e-6, atol=1e-6)
        assert torch.equal(small.argmax(1), whole.argmax(1))
