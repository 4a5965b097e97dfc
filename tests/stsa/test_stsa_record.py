"""The STSA benchmark's recorded comparison with the gradient baselines (``python -m fedlib.records
stsa_converged``): the record runs at a tiny size and holds every field, its curves are the runs'
own (they end at the runs' final accuracy), recording a curve leaves a run unchanged, and the margin
rule decides the cases it should."""
from functools import partial

import numpy as np
import pytest

from fedlib.data.features import Features
from fedlib.evaluation.records import FIELDS, load_record
from fedlib.records.__main__ import RECORDS, main, parameters
from fedlib.stsa import studies as stsa_studies


def test_stsa_record_runs_small_and_writes_every_field(tmp_path):
    assert main(["stsa_converged", "--profile", "smoke", "--out", str(tmp_path), "rounds_per_task=2",
                 "workers=1"]) == 0
    rec = load_record("stsa_converged", folder=tmp_path)
    assert set(FIELDS) <= set(rec)
    assert rec["command"] == "python -m fedlib.records stsa_converged --profile smoke rounds_per_task=2 workers=1"
    p, res = rec["parameters"], rec["results"]
    assert p["rounds_per_task"] == 2 and p["profile"] == "smoke"
    seeds = [s for s in p["seeds"] if s in p["baseline_seeds"]]
    methods = [*stsa_studies.MARGIN_METHODS, *p["baselines"]]
    assert res["seeds"] == seeds and res["methods"] == methods
    settings = [f"pretrained / {name}" for name in p["datasets"]]
    for metric in stsa_studies.MARGIN_METRICS:
        assert list(res[metric]) == settings
        for setting in settings:
            assert list(res[metric][setting]) == [str(b) for b in p["betas"]]
            for by in res[metric][setting].values():
                assert list(by) == methods
                assert all(len(v) == len(seeds) and all(0 <= a <= 100 for a in v) for v in by.values())
    for setting in settings:
        for beta, by in res["curves"][setting].items():
            assert list(by) == p["baselines"]
            for m, curves in by.items():
                assert [len(c) for c in curves] == [2] * len(seeds)   # one point per round of the last task
                # the curve is the run that gave the final accuracy: its end is the run's A_T
                assert np.allclose([c[-1] for c in curves], res["A_T"][setting][beta][m], atol=1e-9)
    # the chapter reads the record back into its comparison
    cells = stsa_studies.margin_comparison({k: res[k] for k in stsa_studies.MARGIN_METRICS},
                                           stsa_studies.MARGIN_METHODS, p["baselines"], 10.0)
    assert len(cells) == 2 * len(settings) * len(p["betas"]) * len(stsa_studies.MARGIN_METHODS)
    assert not stsa_studies.curve_plateaus(res["curves"], p["converge_pp"]).plateau.map(lambda q: q.converged).any()


def test_the_record_defaults_to_its_converged_budget():
    assert parameters("stsa_converged", "quick", {})["rounds_per_task"] == RECORDS["stsa_converged"].DEFAULTS[
        "rounds_per_task"] > parameters("stsa_converged", "quick", {"rounds_per_task": 5})["rounds_per_task"]


@pytest.fixture(scope="module")
def feats():
    """Four Gaussian classes in 8 dimensions, 150 training and 50 test samples each."""
    rng = np.random.default_rng(0)
    means = rng.normal(0, 2, (4, 8))
    draw = lambda n: (np.concatenate([m + rng.normal(0, 1, (n, 8)) for m in means]).astype(np.float32),  # noqa: E731
                      np.repeat(np.arange(4), n))
    (x, y), (xt, yt) = draw(150), draw(50)
    return Features("toy", x, y, xt, yt, tuple(range(4)))


@pytest.mark.parametrize("method", ["finetune", "fedewc", "fedlwf"])
def test_a_recorded_curve_leaves_the_run_unchanged_and_ends_at_its_accuracy(feats, method):
    run = partial(stsa_studies.run_fcil, num_tasks=2, num_clients=3, gamma=1.0, num_dummy=1,
                  fed_kwargs=dict(rounds=4, local_epochs=1, batch_size=32, lr=0.05, eval_every=10**6,
                                  batched_clients=True),
                  baseline_hparams={"fedewc": {"lam": 10.0}, "fedlwf": {"lam": 10.0}})
    plain = run(method, feats, 0.5, 0, "toy", None)
    traced, curve = run(method, feats, 0.5, 0, "toy", None, last_task_curve=True)
    np.testing.assert_array_equal(plain.acc, traced.acc)   # NaNs in the same places, bit-identical values
    assert len(curve) == 4 and curve[-1] == 100 * traced.top1[-1]
    assert curve[-1] == pytest.approx(traced.summary()["A_T"], abs=1e-9)   # equal test sets per task here
    with pytest.raises(ValueError, match="last_task_curve"):
        run("STSA", feats, 0.5, 0, "toy", 16, last_task_curve=True)


def test_the_margin_rule_decides_above_below_and_unresolved():
    seeds = 5
    rng = np.random.default_rng(0)
    noise = lambda: list(rng.normal(0, 0.3, seeds))  # noqa: E731
    base = {"finetune": list(50 + np.array(noise())), "fedlwf": list(60 + np.array(noise()))}
    by = lambda gap: {"STSA": list(60 + gap + np.array(noise())), "STSA-E": list(60 + gap + np.array(noise())), **base}  # noqa: E731
    values = {"A_T": {"s": {"1.0": by(20.0), "0.5": by(5.0), "0.1": by(10.0)}}}
    cells = stsa_studies.margin_comparison(values, ["STSA", "STSA-E"], ["finetune", "fedlwf"], 10.0)
    got = cells.set_index(["beta", "method"])
    assert (got.best == "fedlwf").all()   # the baseline of the highest mean
    assert got.loc[1.0].above.all() and not got.loc[1.0].below.any()
    assert got.loc[0.5].below.all() and not got.loc[0.5].above.any()
    assert not got.loc[0.1].above.any() and not got.loc[0.1].below.any()   # a margin of 10: unresolved
    assert got.loc[1.0, "STSA"].d.mean == pytest.approx(20.0, abs=1.0)
    table = stsa_studies.margin_table(values, cells, ["STSA", "STSA-E"], ["finetune", "fedlwf"])
    assert table.shape == (2 * 2 + 2, 3) and list(table.columns) == [("s", "1.0"), ("s", "0.5"), ("s", "0.1")]
    assert table.loc["A_T: STSA − best baseline", ("s", "1.0")].endswith("vs fedlwf")


def test_curve_plateaus_read_the_mean_curve_over_seeds():
    flat, rising = [[50.0] * 10, [52.0] * 10], [list(np.linspace(10, 40, 10))] * 2
    plateaus = stsa_studies.curve_plateaus({"s": {"0.5": {"flat": flat, "rising": rising}}}, 0.5)
    assert plateaus.set_index("method").plateau.map(lambda q: q.converged).to_dict() == {"flat": True, "rising": False}
    assert "not all converged" in stsa_studies.convergence_text(plateaus)
    assert "rising" in stsa_studies.convergence_text(plateaus)
