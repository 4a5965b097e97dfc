"""Issue 14, STSA items (fedlib.stsa.beyond): GCV and the ridge path from the aggregated
statistics, and the calibrated Gaussian mechanism for the uploads. Each identity is checked against an
independent reference (SVD / lstsq on the raw rows, scipy's normal CDF for the privacy curve)."""
import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from fedlib.core.linalg import SufficientStats, lstsq_reference, ridge_solve, synthetic_features
from fedlib.core.messages import Message
from fedlib.core.seeds import torch_generator
from fedlib.data.features import Features
from fedlib.data.streams import make_stream
from fedlib.federated.incremental import run_class_incremental
from fedlib.stsa import beyond as sb
from fedlib.stsa.algorithm import RandomFeatures, STSALearner

GRID = np.geomspace(10.0, 1e6, 6)


def _phi(n=500, d=12, m=80, c=5, seed=0, kind="mean_dominated"):
    x, y = synthetic_features(n, d, c, kind=kind, seed=seed)
    return RandomFeatures(d, m, seed)(x), y


def _features(n_per_class=40, d=10, c=6, seed=0):
    rng = np.random.default_rng(seed)
    means = 3.0 * rng.standard_normal((c, d))
    y_tr, y_te = np.repeat(np.arange(c), n_per_class), np.repeat(np.arange(c), n_per_class // 2)
    x_tr = (means[y_tr] + rng.standard_normal((len(y_tr), d))).astype(np.float32)
    x_te = (means[y_te] + rng.standard_normal((len(y_te), d))).astype(np.float32)
    return Features("toy", x_tr, y_tr, x_te, y_te, tuple(range(c)))


# ----------------------------------------------------------------------------------------------
# item 1: GCV and the ridge path
# ----------------------------------------------------------------------------------------------
def test_gcv_from_statistics_equals_bruteforce_from_rows():
    phi, y = _phi()
    st = SufficientStats.from_data(phi, y, 5)
    path = sb.RidgePath(st.gram, st.xty, len(y))
    ref = sb.gcv_bruteforce(phi, y, 5, GRID)     # SVD of Phi + augmented lstsq, never Phi^T Phi
    np.testing.assert_allclose(path.gcv(GRID), ref["gcv"], rtol=1e-8)
    np.testing.assert_allclose(path.rss(GRID), ref["rss"], rtol=1e-8)
    np.testing.assert_allclose(path.trace_hat(GRID), ref["trace"], rtol=1e-8)
    assert path.select(GRID)[0] == GRID[int(np.argmin(ref["gcv"]))]


def test_ridge_path_from_one_eigendecomposition_equals_direct_solves():
    """rel 1e-10 where cond(G + gamma I) <= 1e4; on collinear (mean-dominated) ReLU features the error
    grows like eps * cond, and stays within 100 eps cond (the derivation chapter's tolerance)."""
    eps = np.finfo(np.float64).eps
    for kind, grid, tol in (("gaussian", np.geomspace(1e-2, 1e6, 9), lambda k: 1e-10),
                            ("mean_dominated", GRID, lambda k: 100 * eps * k)):
        phi, y = _phi(seed=1, kind=kind)
        st = SufficientStats.from_data(phi, y, 5)
        path = sb.RidgePath(st.gram, st.xty, len(y))
        lam = torch.linalg.eigvalsh(st.gram)
        for g in grid:
            cond = float((lam[-1] + g) / (lam[0].clamp_min(0) + g))
            if kind == "gaussian":
                assert cond < 1e4
            ref = lstsq_reference(phi, y, 5, lam=g)          # [Phi; sqrt(g) I] W = [Y; 0], never Phi^T Phi
            w = path.weights(g)
            assert float((w - ref).abs().max() / ref.abs().max()) < tol(cond), (kind, g)
            chol = ridge_solve(st.gram, st.xty, g)
            assert float((w - chol).abs().max() / chol.abs().max()) < tol(cond), (kind, g)


def test_federated_gcv_equals_pooled_and_counts_cost_their_bytes():
    """The server's GCV after spatial + temporal aggregation (counts uploaded) is the pooled data's GCV;
    the counts add exactly K * sum_t c_t * 8 bytes to STSA's upload."""
    f = _features()
    stream = make_stream(f.y_train, f.y_test, 3, seed=0)
    lrn = sb.PathLearner(10, 6, 40, gamma_rule="gcv", grid=GRID, rf_seed=0, seed=0)
    res = run_class_incremental(lrn, stream, f.x_train, f.y_train, f.x_test, f.y_test, 3, 0.5, 0, progress=False)
    phi = lrn.features(f.x_train)
    ref = sb.gcv_bruteforce(phi, stream.relabel(f.y_train), 6, GRID)
    np.testing.assert_allclose(lrn.server.gcv_values, ref["gcv"], rtol=1e-8)
    base = STSALearner(10, 6, 40, 1.0, rf_seed=0, seed=0)
    res0 = run_class_incremental(base, stream, f.x_train, f.y_train, f.x_test, f.y_test, 3, 0.5, 0, progress=False)
    extra = res.bytes_up.sum() - res0.bytes_up.sum()
    assert extra == sb.counts_bytes(3, [t.num_classes for t in stream.tasks])


def test_gcv_study_fixed_gamma_rows_equal_separate_runs():
    """A fixed-gamma row of the study (from the GCV run's eigendecompositions) is the plain STSA run."""
    f = _features(seed=2)
    study = sb.gcv_study(f, 0.5, [0, 1], num_tasks=3, num_clients=3, M=30, grid=GRID, fixed_gammas=[100.0],
                         sweep_gammas=[10.0, 1e4], progress=False)
    runs = study["runs"]
    for seed in (0, 1):
        stream = make_stream(f.y_train, f.y_test, 3, seed=seed)
        res = run_class_incremental(STSALearner(10, 6, 30, 100.0, rf_seed=seed, seed=seed), stream, f.x_train,
                                    f.y_train, f.x_test, f.y_test, 3, 0.5, seed, progress=False)
        row = runs[(runs.seed == seed) & (runs.method == "fixed gamma = 100")].iloc[0]
        assert row.A_T == pytest.approx(100 * res.metrics["A_T"], abs=1e-9)
        assert row.A_avg == pytest.approx(100 * res.metrics["A_avg"], abs=1e-9)
        gcv_lrn = sb.PathLearner(10, 6, 30, gamma_rule="gcv", grid=GRID, rf_seed=seed, seed=seed)
        res = run_class_incremental(gcv_lrn, stream, f.x_train, f.y_train, f.x_test, f.y_test, 3, 0.5, seed,
                                    progress=False)
        row = runs[(runs.seed == seed) & (runs.method == "GCV (per stage)")].iloc[0]
        assert row.A_avg == pytest.approx(100 * res.metrics["A_avg"], abs=1e-9)
        assert row.gamma == gcv_lrn.server.chosen[-1]
    hind = runs[runs.method == "best in hindsight (test set)"].set_index("seed").A_T
    gcv = runs[runs.method == "GCV (per stage)"].set_index("seed").A_T
    assert (gcv <= hind + 1e-9).all()          # GCV picks from the same grid
    assert len(sb.gcv_paired(runs)) == runs.method.nunique() - 1


# ----------------------------------------------------------------------------------------------
# item 2: the calibrated Gaussian mechanism
# ----------------------------------------------------------------------------------------------
def _balle_wang_epsilon(mu: float, delta: float) -> float:
    """Independent: the exact epsilon of a Gaussian mechanism with Delta / sigma = mu (Balle & Wang 2018,
    Thm 8): delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), solved for eps with scipy."""
    def gap(eps):
        return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps + stats.norm.logcdf(-mu / 2 - eps / mu)) - delta
    return optimize.brentq(gap, 0.0, 500.0, xtol=1e-12)


@pytest.mark.parametrize("z, delta", [(1.0, 1e-5), (3.0, 1e-6), (0.7, 1e-3)])
def test_accountant_epsilon_matches_analytic_gaussian(z, delta):
    """One upload = Gaussian releases of G, C, n with multiplier z each = one Gaussian of mu = sqrt(3) / z."""
    exact = _balle_wang_epsilon(math.sqrt(3) / z, delta)
    assert sb.composed_gaussian_epsilon([z, z, z], delta) == pytest.approx(exact, rel=1e-6)
    pld = sb.upload_epsilon(z, delta)        # dp-accounting's PLD accountant (pessimistic discretization)
    assert pld == pytest.approx(exact, rel=2e-3) and pld >= exact * (1 - 1e-9)
    rdp = sb.upload_epsilon(z, delta, accountant="rdp")   # an upper bound, looser
    assert rdp >= exact * (1 - 1e-9)
    z_cal = sb.calibrate_upload(exact, delta)
    assert z_cal == pytest.approx(z, rel=1e-6)


def test_composition_over_stages_and_calibration():
    z = sb.calibrate_upload(2.0, 1e-5, stages=4)          # 12 releases
    assert _balle_wang_epsilon(math.sqrt(12) / z, 1e-5) == pytest.approx(2.0, rel=1e-6)
    assert sb.upload_epsilon(z, 1e-5, stages=4) == pytest.approx(2.0, rel=2e-3)


def test_clipping_is_enforced_and_bounds_the_sensitivity():
    phi, y = _phi(seed=3)
    norms = torch.linalg.vector_norm(phi, dim=1)
    b = float(norms.median())
    clipped = sb.clip_features(phi, b)
    new = torch.linalg.vector_norm(clipped, dim=1)
    assert float(new.max()) <= b * (1 + 1e-12)
    small = norms <= b
    assert torch.equal(clipped[small], phi[small])                          # rows within B untouched
    assert torch.allclose(new[~small], torch.full_like(new[~small], b))     # the others scaled onto the sphere
    # add/remove one sample: ||dG||_F = ||phi||^2 <= B^2, ||dC||_F = ||phi|| <= B, ||dn|| = 1
    full = SufficientStats.from_data(clipped, y, 5)
    less = SufficientStats.from_data(clipped[1:], y[1:], 5)
    assert float((full.gram - less.gram).norm()) <= b * b * (1 + 1e-12)
    assert float((full.xty - less.xty).norm()) <= b * (1 + 1e-12)
    # the client clips before computing its statistics
    f = _features()
    client = sb.StatsClient(clip_norm=0.5, seed=0)
    msg = client.step((torch.from_numpy(f.x_train), torch.from_numpy(f.y_train)), client.init_state(0),
                      Message("s", {"rf_seed": 0, "M": 30, "stage": 0, "offset": 0, "num_classes": 6}))
    assert float(torch.diagonal(msg["G"]).sum()) <= len(f.y_train) * 0.25 * (1 + 1e-12)   # tr G = sum ||phi||^2


def test_noise_std_equals_sigma_times_sensitivity():
    m, c, z, b = 150, 1000, 0.8, 2.5
    msg = Message("c", {"G": torch.zeros(m, m, dtype=torch.float64), "C": torch.zeros(m, c, dtype=torch.float64),
                        "n": torch.zeros(c, dtype=torch.float64)})
    out = sb.privatize_upload(msg, z, b, torch_generator(0, "test"))
    g = out["G"]
    assert torch.equal(g, g.T)
    off = g[torch.triu(torch.ones(m, m, dtype=torch.bool), 1)]
    assert float(off.std()) == pytest.approx(z * b * b, rel=0.03)           # sensitivity B^2
    assert float(torch.diagonal(g).std()) == pytest.approx(math.sqrt(2) * z * b * b, rel=0.2)
    assert float(out["C"].std()) == pytest.approx(z * b, rel=0.02)          # sensitivity B
    assert float(out["n"].std()) == pytest.approx(z, rel=0.12)              # sensitivity 1
    assert sb.upload_sigmas(z, b) == {"G": z * b * b, "C": z * b, "n": z}


def test_vanishing_noise_gives_non_private_stsa():
    f = _features(seed=4)
    stream = make_stream(f.y_train, f.y_test, 3, seed=0)
    args = (f.x_train, f.y_train, f.x_test, f.y_test, 3, 0.5, 0)
    base = STSALearner(10, 6, 30, 50.0, rf_seed=0, seed=0)
    r0 = run_class_incremental(base, stream, *args, progress=False)
    big = float(torch.linalg.vector_norm(base.features(f.x_train), dim=1).max()) * 2   # B above every row: no clip
    dp = sb.PathLearner(10, 6, 30, 50.0, gamma_rule="fixed", clip_norm=big, noise_multiplier=1e-20, rf_seed=0, seed=0)
    r1 = run_class_incremental(dp, stream, *args, progress=False)
    assert dp.server.psd
    assert float((dp.weights - base.weights).abs().max() / base.weights.abs().max()) < 1e-9
    np.testing.assert_array_equal(r0.acc, r1.acc)


def test_dp_study_equals_the_protocol_run():
    """The study's shared clean uploads + per-client noise give the same head as the DP learner."""
    f = _features(seed=5)
    kw = dict(num_tasks=3, num_clients=3, M=30, clip_norm=1.0, epsilons=[2.0], delta=1e-5, grid=GRID,
              fixed_gamma=5.0, aggregations=("local", "secure"), paper_noise=(0.2, 0.05), progress=False)
    runs = sb.dp_study(f, 0.5, [0], **kw)
    z = sb.calibrate_upload(2.0, 1e-5)
    stream = make_stream(f.y_train, f.y_test, 3, seed=0)
    for agg in ("local", "secure"):
        lrn = sb.PathLearner(10, 6, 30, 5.0, gamma_rule="fixed", clip_norm=1.0, noise_multiplier=z,
                             aggregation=agg, rf_seed=0, seed=0)
        res = run_class_incremental(lrn, stream, f.x_train, f.y_train, f.x_test, f.y_test, 3, 0.5, 0, progress=False)
        row = runs[(runs.setting == f"calibrated, {agg}") & (runs["gamma rule"] == "fixed gamma = 5")].iloc[0]
        assert row.A_T == pytest.approx(100 * res.metrics["A_T"], abs=1e-9)
    assert set(runs.setting) >= {"no noise, clipped (B = 1)", "paper's noise q=0.2, s=0.05"}
    assert len(sb.dp_summary(runs))


# ----------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_parameter():
    phi, y = _phi()
    st = SufficientStats.from_data(phi, y, 5)
    path = sb.RidgePath(st.gram, st.xty, len(y))
    with pytest.raises(ValueError, match="gamma_grid is empty"):
        path.select([])
    with pytest.raises(ValueError, match="gamma_grid must hold finite values > 0"):
        path.select([1.0, -2.0])
    noisy = sb.RidgePath(st.gram, st.xty, 1.0)          # N far below tr H: GCV undefined everywhere
    with pytest.raises(ValueError, match="GCV is undefined"):
        noisy.select([1e-3, 1e-2])
    with pytest.warns(RuntimeWarning, match="largest gamma"):
        assert noisy.select([1e-3, 1e-2], fallback=True)[0] == 1e-2
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="clip_norm"):
            sb.clip_features(phi, bad)
        with pytest.raises(ValueError, match="clip_norm"):
            sb.StatsClient(clip_norm=bad)
    with pytest.raises(ValueError, match="needs clip_norm"):
        sb.StatsClient(noise_multiplier=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        sb.calibrate_upload(0.0, 1e-5)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="delta"):
            sb.calibrate_upload(1.0, bad)
        with pytest.raises(ValueError, match="delta"):
            sb.upload_epsilon(1.0, bad)
    with pytest.raises(ValueError, match="gamma_rule"):
        sb.PathServer(10, 2, gamma_rule="loocv", grid=GRID)
    with pytest.raises(ValueError, match="gamma_grid is empty"):
        sb.PathServer(10, 2, gamma_rule="gcv", grid=[])
    with pytest.raises(ValueError, match="aggregation"):
        sb.PathLearner(10, 2, 20, grid=GRID, aggregation="central")
    with pytest.raises(ValueError, match="gamma_max"):
        sb.gamma_grid(10.0, 1.0, 5)
    f = _features()
    with pytest.raises(ValueError, match="epsilon"):
        sb.dp_study(f, 0.5, [0], num_tasks=3, num_clients=3, M=20, clip_norm=1.0, epsilons=[-1.0], delta=1e-5,
                    grid=GRID, fixed_gamma=1.0, progress=False)


@pytest.mark.parametrize("name, bad, message", [
    ("clip_norm", 0.0, "clip_norm must be a finite number > 0"),
    ("epsilons", [1.0, -2.0], r"epsilons\[1\] must be a finite number > 0"),
    ("delta", 1.5, "delta must be"),
    ("delta", 0.0, "delta must be"),
    ("gamma_max", 0.01, "gamma_max = 0.01 must be >= gamma_min"),
    ("fixed_gammas", [], "fixed_gammas must hold at least 1"),
    ("aggregations", ["central"], r"unknown aggregations\[0\] 'central'"),
    ("paper_noise", [0.2, 0.05, 1.0], r"paper_noise must be a \[q, s\] pair"),
    ("accountant", "moments", "unknown accountant 'moments'"),
    ("seeds", [0], "seeds must hold at least 2"),
])
def test_chapter_parameters_rejected_naming_the_parameter(name, bad, message):
    from conftest import chapter_values
    from fedlib.runner import specs

    with pytest.raises(ValueError, match=message):
        specs.check("stsa_beyond", chapter_values("stsa_beyond", **{name: bad}))
