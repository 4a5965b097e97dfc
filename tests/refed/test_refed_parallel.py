"""ScenarioRuns.prefetch: the benchmark chapter's runs in forked worker processes give the same run
dicts as the sequential calls (bit for bit, seconds aside), in the same order, with the same
storage checks; a later call of a prefetched run is served from the cache."""
from __future__ import annotations

import pickle
from functools import partial

import numpy as np
import pytest
import torch

from conftest import states_equal
from fedlib.data.streams import make_stream
from fedlib.federated.models import SmallCNN
from fedlib.refed.studies import ScenarioRuns

C, T, K, SIZE = 6, 3, 3, 12
MODEL_FN = partial(SmallCNN, 1, C, SIZE, width=4, hidden=8)
SETTINGS = dict(model_fn=MODEL_FN, num_clients=K, batch_size=16, momentum=0.0, participation=0.67, device="cpu",
                num_threads=1, memory_mode="replay", pim_epochs=2, grad_norm="exact", num_classes=C,
                method_hparams={"fedprox_replay": {"mu": 0.01}})
METHODS = ["refed", "refed_balanced", "refed_proxy", "fedavg_replay", "fedprox_replay", "fedavg", "fixed"]


@pytest.fixture(scope="module")
def scenarios():
    """A few hundred 12 x 12 images: a class-dependent bright square on noise."""
    g = np.random.RandomState(0)

    def images(n_per_class):
        y = np.repeat(np.arange(C), n_per_class)
        x = g.rand(len(y), 1, SIZE, SIZE).astype(np.float32) * 0.5
        for c in range(C):
            x[y == c, :, 2 * c:2 * c + 3, 2:6] += 1.0
        return torch.from_numpy(x), y

    x_tr, y_tr = images(50)
    x_te, y_te = images(10)
    base = {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te,
            "stream": lambda seed: make_stream(y_tr, y_te, T, seed=seed), "alpha": 1.0, "lr": 0.1, "memory": 15,
            "lam": 0.8, "rounds": 1, "first_rounds": None, "epochs": 1}
    return {"class": {"name": "toy class", **base}, "domain": {"name": "toy domain", **base, "first_rounds": 2}}


def _requests():
    main = [dict(kind=kind, method=m, seed=seed, track=True) for kind, ms in [("class", METHODS),
            ("domain", ["refed", "fedavg_replay", "fedavg"])] for seed in [0, 1] for m in ms]
    sweep = [dict(kind="class", method=m, seed=0, memory=M) for M in [8, 15, 40] for m in ["refed", "fedavg_replay"]]
    sweep += [dict(kind="class", method="refed", seed=0, alpha=0.3, lam=lam) for lam in [0.2, 0.8]]
    sweep += [dict(kind="class", method="refed", seed=0, weighting=w) for w in ["early", "late"]]
    sweep += [dict(kind="class", method="fedavg", seed=0, alpha=0.3), dict(kind="class", method="fedavg", seed=0,
                                                                           alpha=0.3, track=True)]
    return main, sweep


def _same(a: dict, b: dict):
    ra, rb = a["result"], b["result"]
    assert np.array_equal(ra.acc, rb.acc, equal_nan=True) and np.array_equal(ra.top1, rb.top1)
    assert a["row"].keys() == b["row"].keys() and a["cor"] == b["cor"] and a["tracked"] == b["tracked"]
    for k in a["row"]:   # every metric equal (NaN where not applicable), the measured seconds aside
        u, v = a["row"][k], b["row"][k]
        assert k == "wall_s" or u == v or (isinstance(u, float) and np.isnan(u) and np.isnan(v)), k
    assert a["client_stages"] == b["client_stages"] and a["method"] == b["method"]
    la, lb = a["learner"], b["learner"]
    assert states_equal(la.model.state_dict(), lb.model.state_dict())
    for ma, mb in zip(la.memory_log, lb.memory_log, strict=True):
        assert ma.keys() == mb.keys() and all(np.array_equal(ma[k], mb[k]) for k in ma)
    for pa, pb in zip(la.pim_log, lb.pim_log, strict=True):
        assert (pa is None) == (pb is None)
        if pa is not None:
            assert all(torch.equal(x["scores"], y["scores"]) and x["dist_sq"] == y["dist_sq"] for x, y in zip(pa, pb))


def test_prefetch_equals_the_sequential_calls(scenarios):
    main, sweep = _requests()
    seq = ScenarioRuns(scenarios, **SETTINGS)
    for r in main + sweep:
        seq(**r)
    one, two = ScenarioRuns(scenarios, **SETTINGS), ScenarioRuns(scenarios, **SETTINGS)
    info1 = one.prefetch(main, workers=1, progress=False)
    info2 = two.prefetch(main, workers=2, progress=False)
    # the default groups: one per (kind, seed), the class groups (more runs) first
    assert info1["runs"] == info2["runs"] == len(main) and info2["groups"] == 4 and info2["processes"] == 2
    assert info1["processes"] == 1 and len(info2["cpu_seconds"]) == 4 and min(info2["cpu_seconds"]) > 0
    by_method = lambda r: (r["method"], r.get("alpha"))   # sweep groups that spread over the workers
    info = two.prefetch(sweep, workers=2, group=by_method, progress=False)
    one.prefetch(sweep, workers=1, group=by_method, progress=False)
    # held runs are not run again (the tracked main runs serve memory 15 and the early weighting)
    assert info["runs"] == len(sweep) - 3 and info["processes"] == 2
    for runs in (one, two):
        assert list(runs.runs) == list(seq.runs)                  # the order of the sequential calls
        assert runs.memory_checks == seq.memory_checks
        before = dict(runs.memory_checks)
        for r in main + sweep:
            out = runs(**r)
            _same(out, seq(**r))
            assert out is runs.runs[runs.key(**{k: v for k, v in r.items() if k != "track"})]
        assert runs.memory_checks == before                        # every call was served from the cache
        assert runs.prefetch(main + sweep, workers=2, progress=False)["runs"] == 0
    # the first boundary's PIMs came back: a later Re-Fed run with another memory reuses them
    hits = two.pims.hits
    two("class", "refed", 1, memory=9)
    assert two.pims.hits >= hits + K
    # a run dict pickles whole (what a worker sends back)
    assert pickle.loads(pickle.dumps(two.runs[next(iter(two.runs))]))["row"]["key"] == "refed"


def test_prefetch_refuses_bad_arguments(scenarios):
    runs = ScenarioRuns(scenarios, **SETTINGS)
    req = [dict(kind="class", method="fedavg", seed=0)]
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="workers"):
            runs.prefetch(req, workers=bad, progress=False)
    with pytest.raises(ValueError, match="requests"):
        runs.prefetch(req[0], workers=1, progress=False)
    with pytest.raises(ValueError, match="request"):
        runs.prefetch([dict(kind="class", method="fedavg")], workers=1, progress=False)
    with pytest.raises(ValueError, match="request"):
        runs.prefetch([dict(kind="class", method="fedavg", seed=0, rounds=3)], workers=1, progress=False)
    with pytest.raises(ValueError, match="kind"):
        runs.prefetch([dict(kind="other", method="fedavg", seed=0)], workers=1, progress=False)
    assert runs.runs == {} and runs.memory_checks == {"runs": 0, "client-stages": 0}


def test_chapter_spec_checks_workers():
    from conftest import chapter_values
    from fedlib.runner import specs

    assert chapter_values("refed_benchmark")["workers"] is None
    for ok in (None, 1, 2):
        specs.check("refed_benchmark", chapter_values("refed_benchmark", workers=ok))
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValueError, match="workers must be an integer >= 1 or null"):
            specs.check("refed_benchmark", chapter_values("refed_benchmark", workers=bad))
    with pytest.raises(ValueError, match="workers must be 1 with device 'cuda'"):
        specs.check("refed_benchmark", chapter_values("refed_benchmark", workers=2, device="cuda"))
    specs.check("refed_benchmark", chapter_values("refed_benchmark", workers=None, device="cuda"))


def test_prefetch_summary_names_runs_groups_processes_and_cpu():
    from fedlib.refed.studies import prefetch_summary

    line = prefetch_summary({"runs": 7, "groups": 3, "processes": 2, "seconds": 12.4, "cpu_seconds": [10.0, 8.2, 3.9]},
                            "main runs")
    assert line == ("main runs: 7 runs in 3 group(s) on 2 process(es), 12 s (22 s CPU; per group, in the order sent: "
                    "10, 8, 4 s)")
