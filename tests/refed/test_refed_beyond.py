"""Re-Fed beyond the paper (issue 14): the new cache rules, label noise and the experiment loop."""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.federated.gradient import FedConfig
from fedlib.data.streams import make_stream
from fedlib.federated.learner import (BALANCING, HerdingReplay, ReservoirReplay, ScoreReplay, SelectionContext, _quotas, budget_groups, el2n_scores, grand_scores, herding_order, penultimate_features, reservoir_select, select_top)
from fedlib.refed.algorithm import RefedReplay, make_learner
from fedlib.refed.beyond import (RULES, CacheNoiseAudit, flip_labels, noise_accuracy_table, noise_table,
                                        rule_table, run_rules)


class Tiny(nn.Module):
    """A two-layer net with a feature map (the shape of SmallCNN, on vectors)."""

    def __init__(self, d=5, hidden=6, c=6):
        super().__init__()
        self.fc, self.classifier = nn.Linear(d, hidden), nn.Linear(hidden, c)

    def features(self, x):
        return torch.tanh(self.fc(x))

    def forward(self, x):
        return self.classifier(self.features(x))


def pool(n=60, c=4, tasks=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    y[:c] = torch.arange(c)
    t = torch.randint(0, tasks, (n,), generator=g)
    t[:tasks] = torch.arange(tasks)
    return x, y, t


def ctx_for(model, num_old, tasks, seed=0):
    config = FedConfig(rounds=1, local_epochs=1, batch_size=8, lr=0.05, seed=seed)
    return SelectionContext(model, num_old, torch.Generator().manual_seed(seed),
                            [n for n, _ in model.named_parameters()], config, tasks)


# ---------------------------------------------------------------------------------------------
# shares and selections
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["task", "task_class", "equal"])
@pytest.mark.parametrize("budget", [0, 7, 23, 60])
def test_shares_are_exact(mode, budget):
    x, y, t = pool()
    groups = budget_groups(y, budget, mode, t)
    assert sum(k for _, k in groups) == budget and all(k <= len(idx) for idx, k in groups)
    keep = select_top(torch.randn(len(y), generator=torch.Generator().manual_seed(1)), budget, y, mode, t)
    assert len(keep) == budget == len(set(keep.tolist()))
    # the counts per task are the water-filled equal quotas over the tasks' sizes
    if mode in ("task", "task_class"):
        tasks, counts = torch.unique(t, return_counts=True)
        assert torch.equal(torch.bincount(t[keep], minlength=len(tasks)), _quotas(counts, budget, "equal"))
    if mode == "task_class":   # inside each task, the classes' counts are the equal quotas of its share
        for task, q in zip(*torch.unique(t, return_counts=True)):
            inside = t == task
            share = int((t[keep] == task).sum())
            cls, cnt = torch.unique(y[inside], return_counts=True)
            got = torch.stack([((t[keep] == task) & (y[keep] == c)).sum() for c in cls])
            assert torch.equal(got, _quotas(cnt, share, "equal"))


def test_top_k_inside_each_share():
    x, y, t = pool()
    scores = torch.randn(len(y), generator=torch.Generator().manual_seed(2))
    keep = set(select_top(scores, 20, y, "task", t).tolist())
    for idx, k in budget_groups(y, 20, "task", t):
        ranked = idx[torch.argsort(scores[idx], descending=True)]
        assert set(ranked[:k].tolist()) <= keep and not set(ranked[k:].tolist()) & keep


@pytest.mark.parametrize("policy", ["el2n", "grand", "herding", "reservoir", "refed_task", "refed_task_class"])
def test_rules_return_budget_distinct_indices(policy):
    torch.manual_seed(0)
    model = Tiny()
    x, y, t = pool()
    ctx = ctx_for(model, 4, t)
    replay = {"el2n": ScoreReplay(50, rule="el2n"), "grand": ScoreReplay(50, rule="grand"),
              "herding": HerdingReplay(50), "reservoir": ReservoirReplay(50),
              "refed_task": RefedReplay(50, pim_epochs=1, class_balanced="task"),
              "refed_task_class": RefedReplay(50, pim_epochs=1, class_balanced="task_class")}[policy]
    for budget in (0, 13, 60):
        keep, _ = replay.select(x, y, budget, ctx)
        assert len(keep) == budget == len(set(keep.tolist())) and (keep >= 0).all() and (keep < len(y)).all()
        if policy == "refed_task":
            assert torch.equal(torch.bincount(t[keep], minlength=3), _quotas(torch.bincount(t), budget, "equal"))
        if policy == "herding":   # equal class shares (iCaRL's m per class)
            assert torch.equal(torch.bincount(y[keep], minlength=4), _quotas(torch.bincount(y), budget, "equal"))


def test_el2n_equals_direct_computation():
    torch.manual_seed(1)
    model = Tiny().double()
    x, y, _ = pool()
    x = x.double()
    y = y.clamp(max=2)
    logits = model(x).detach().numpy()[:, :3]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    direct = np.linalg.norm(p - np.eye(3)[y.numpy()], axis=1)
    np.testing.assert_allclose(el2n_scores(model, x, y, 3).numpy(), direct, rtol=1e-6)


def test_grand_equals_per_sample_autograd_loop():
    torch.manual_seed(2)
    model = Tiny()
    x, y, _ = pool(n=25)
    params = list(model.parameters())
    loop = []
    for i in range(len(y)):   # one backward per sample, all parameters
        loss = F.cross_entropy(model(x[i:i + 1])[:, :4], y[i:i + 1])
        loop.append(torch.sqrt(sum(g.pow(2).sum() for g in torch.autograd.grad(loss, params))))
    np.testing.assert_allclose(grand_scores(model, x, y, 4).numpy(), torch.stack(loop).detach().numpy(), rtol=1e-5)


def brute_force_herding(phi: np.ndarray, k: int) -> list[int]:
    """iCaRL's greedy by enumeration: at step j try every unchosen i and keep the one whose running
    mean is closest to the class mean."""
    phi = phi / np.linalg.norm(phi, axis=1, keepdims=True)
    mu, chosen = phi.mean(0), []
    for j in range(1, k + 1):
        best, best_d = None, np.inf
        for i in range(len(phi)):
            if i in chosen:
                continue
            d = np.linalg.norm(mu - (phi[chosen].sum(0) + phi[i]) / j)
            if d < best_d:
                best, best_d = i, d
        chosen.append(best)
    return chosen


def test_herding_is_icarl_greedy_sequence():
    phi = np.random.default_rng(3).normal(size=(12, 4))
    assert herding_order(torch.from_numpy(phi), 12).tolist() == brute_force_herding(phi, 12)
    # the greedy is not the exhaustive optimum, but its first pick is: the sample closest to the mean
    unit = phi / np.linalg.norm(phi, axis=1, keepdims=True)
    assert herding_order(torch.from_numpy(phi), 1).item() == int(np.argmin(np.linalg.norm(unit - unit.mean(0), axis=1)))


def test_herding_uses_the_output_layers_input():
    model = Tiny()
    x = torch.randn(9, 5)
    assert torch.allclose(penultimate_features(model, x), model.features(x).detach())


def test_reservoir_keeps_class_balance():
    for trial in range(40):
        g = torch.Generator().manual_seed(trial)
        counts = torch.randint(1, 30, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
        labels = torch.repeat_interleave(torch.arange(len(counts)), counts)
        labels = labels[torch.randperm(len(labels), generator=g)]
        budget = int(torch.randint(0, len(labels) + 1, (1,), generator=g))
        keep = reservoir_select(labels, budget, torch.Generator().manual_seed(trial))
        assert len(keep) == budget == len(set(keep.tolist()))
        got, fair = torch.bincount(labels[keep], minlength=len(counts)), _quotas(counts, budget, "equal")
        assert (got - fair).abs().max() <= 1, (counts, budget, got, fair)
        # the largest classes differ by at most one and a class below the fair share keeps all of it
        assert got.max() - got[counts > got].min() <= 1 if (counts > got).any() else True
    # repeatable with the generator's seed
    lab = torch.arange(50) % 3
    assert torch.equal(reservoir_select(lab, 20, torch.Generator().manual_seed(5)),
                       reservoir_select(lab, 20, torch.Generator().manual_seed(5)))


# ---------------------------------------------------------------------------------------------
# label noise
# ---------------------------------------------------------------------------------------------
def test_flip_labels_exact_fraction_within_tasks():
    y = np.repeat(np.arange(6), 25)
    stream = make_stream(y, y, 3, seed=0)
    for frac in (0.0, 0.1, 0.37):
        noisy, flipped = flip_labels(y, stream, frac, seed=4)
        assert np.array_equal(noisy != y, flipped)
        for t, task in enumerate(stream.tasks):
            n_t = len(task.train_idx)
            assert flipped[task.train_idx].sum() == (round(frac * n_t) if t < 2 else 0)
            assert np.isin(noisy[task.train_idx], task.classes).all()      # labels stay in the task
    a, b = flip_labels(y, stream, 0.2, seed=4), flip_labels(y, stream, 0.2, seed=4)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[1], flip_labels(y, stream, 0.2, seed=5)[1])


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan")])
def test_flip_labels_rejects_bad_fraction(bad):
    y = np.repeat(np.arange(4), 5)
    with pytest.raises(ValueError, match="fraction"):
        flip_labels(y, make_stream(y, y, 2), bad, seed=0)


def test_bad_rule_and_balancing_raise():
    with pytest.raises(ValueError, match="rule"):
        ScoreReplay(10, rule="loss")
    with pytest.raises(ValueError, match="class_balanced"):
        HerdingReplay(10, class_balanced="per_client")
    with pytest.raises(ValueError, match="tasks"):
        select_top(torch.rand(5), 2, torch.zeros(5, dtype=torch.long), "task")
    with pytest.raises(ValueError, match="rule"):
        run_rules({}, ["refed", "loss"], [0], settings={}, lam_local=0.99)
    assert {"task", "task_class"} <= set(BALANCING)


def test_noise_audit_counts_flipped_samples():
    x = torch.randn(8, 3)
    y = np.array([0, 1, 0, 1, 2, 3, 2, 3])
    flipped = np.array([1, 0, 0, 1, 0, 0, 1, 0], dtype=bool)
    audit = CacheNoiseAudit(x, y, flipped, class_order=np.array([2, 3, 0, 1]))
    # re-indexed labels: original 0 -> 2, 1 -> 3, 2 -> 0, 3 -> 1
    assert audit.flags(x[[0, 3, 4]], torch.tensor([2, 3, 0])).tolist() == [True, True, False]
    with pytest.raises(KeyError):
        audit.flags(x[:1], torch.tensor([3]))   # a sample with a label it never had


# ---------------------------------------------------------------------------------------------
# the experiment loop at a tiny size
# ---------------------------------------------------------------------------------------------
def test_experiment_loop_runs_tiny():
    from fedlib.federated.models import make_model
    from fedlib.refed.studies import make_scenario

    rng = np.random.default_rng(0)
    y_tr, y_te = np.repeat(np.arange(4), 24), np.repeat(np.arange(4), 6)
    x_tr = (rng.integers(0, 255, (96, 8, 8)) // 2 + 40 * y_tr[:, None, None]).astype(np.uint8)
    x_te = (rng.integers(0, 255, (24, 8, 8)) // 2 + 40 * y_te[:, None, None]).astype(np.uint8)
    sc = make_scenario("tiny", x_tr, y_tr, x_te, y_te, partial(make_stream, y_tr, y_te, 2), alpha=100.0, lr=0.05,
                       memory=8, lam=0.8, rounds=1, first_rounds=None, epochs=1)
    settings = dict(model_fn=partial(make_model, "smallcnn", 1, 4, image_size=8, width=2, hidden=8), num_clients=2,
                    batch_size=16, momentum=0.0, participation=1.0, device="cpu", num_threads=1,
                    memory_mode="replay", pim_epochs=1, grad_norm="exact")
    rules = list(RULES)
    clean = run_rules(sc, rules, [0, 1], settings=settings, lam_local=0.99, progress=False)
    assert len(clean) == 2 * len(rules) and clean.A_T.between(0, 100).all()
    table = rule_table(clean, [0, 1])
    assert list(table.index) == rules
    noisy = run_rules(sc, ["refed", "random", "grand"], [0, 1], settings=settings, lam_local=0.99, noise=0.25,
                      progress=False)
    # two clients, one boundary, pool = the first task's 48 samples, a quarter of them flipped
    assert (noisy["pool"] == 48).all() and (noisy["pool_noisy"] == 12).all() and (noisy["cache"] == 16).all()
    assert noisy.cache_rate.between(0, 100).all() and np.allclose(noisy.pool_rate, 25.0)
    assert len(noise_table(noisy, [0, 1])) == 3 and len(noise_accuracy_table(clean, noisy, [0, 1])) == 3
    # every rule runs on the same first task: identical accuracy after task 1 (no cache yet) is implied by
    # make_learner's shared seeding; the learners of the new rules are ordinary LEARNERS
    lr = make_learner("herding", settings["model_fn"], FedConfig(rounds=1, local_epochs=1), num_classes=4, memory=5)
    assert isinstance(lr.replay, HerdingReplay)


def test_workers_give_the_same_rows():
    from fedlib.federated.models import make_model
    from fedlib.refed.studies import make_scenario

    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(4), 16)
    x = (rng.integers(0, 255, (64, 8, 8)) // 2 + 40 * y[:, None, None]).astype(np.uint8)
    sc = make_scenario("tiny", x, y, x, y, partial(make_stream, y, y, 2), alpha=100.0, lr=0.05, memory=6, lam=0.8,
                       rounds=1, first_rounds=None, epochs=1)
    settings = dict(model_fn=partial(make_model, "smallcnn", 1, 4, image_size=8, width=2, hidden=8), num_clients=2,
                    batch_size=16, momentum=0.0, participation=1.0, device="cpu", num_threads=1,
                    memory_mode="replay", pim_epochs=1, grad_norm="exact")
    kw = dict(settings=settings, lam_local=0.99, noise=0.25, progress=False)
    one = run_rules(sc, ["refed", "grand"], [0, 1], workers=1, **kw)
    two = run_rules(sc, ["refed", "grand"], [0, 1], workers=2, **kw)
    cols = ["rule", "seed", "A_T", "A_avg", "pool_noisy", "cache_noisy"]
    pd.testing.assert_frame_equal(one[cols], two[cols])
