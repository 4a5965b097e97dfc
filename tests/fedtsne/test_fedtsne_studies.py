"""fedlib.fedtsne.checks and .studies: the derivation chapter's numerical checks and the experiment
loops / tables of the benchmark, privacy and Fed-SpeClust chapters, on tiny data with real values."""
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

from fedlib.core.linalg import relative_error
from fedlib.core import privacy
from fedlib.evaluation.stats import paired_difference
from fedlib.fedtsne import chapters as ft_chapters
from fedlib.fedtsne import checks as ft_checks
from fedlib.fedtsne import dp as ft_dp
from fedlib.fedtsne import feddl as ft_feddl
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import pipelines as ft_pipelines
from fedlib.fedtsne import studies as ft_studies
from fedlib.fedtsne import verdicts as ft_verdicts


@pytest.fixture(autouse=True, scope="module")
def _blas_one_thread():
    """One BLAS / OpenMP thread for the whole module (tiny problems; a shared 2-core machine)."""
    limits = threadpool_limits(1)
    yield
    limits.restore_original_limits()


@pytest.fixture(autouse=True, scope="module")
def _own_cache(tmp_path_factory):
    """benchmark_runs keeps its centralized embeddings in FEDLIB_CACHE: a fresh one, not the repository's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDLIB_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def _blobs(n=90, m=6, seed=0, scale=4.0):
    """Three well-separated Gaussian classes in R^m (n // 3 each), min-max scaled into [0, 1]."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) // (n // 3)
    X = scale * rng.standard_normal((3, m))[y] + rng.standard_normal((n, m))
    return (X - X.min()) / np.ptp(X), y


# ------------------------------------------------------------------------------------------------
# checks.py (derivation chapter)
# ------------------------------------------------------------------------------------------------
def test_rel_error():
    assert relative_error(np.array([3.0, 4.0]) * 1.1, np.array([3.0, 4.0])) == pytest.approx(0.1, rel=1e-12)


def test_mmd_unbiasedness_u_statistic_unbiased_v_statistic_biased():
    mc = ft_checks.mmd_unbiasedness(np.random.default_rng(0), 300, dim=3, gamma=0.5, shift=0.7)
    # E k(x, y) = 3^{-3/2} exp(-0.5 d^2 / 3) for s^2 = 2, gamma = 0.5, dim = 3
    assert mc["exact"] == pytest.approx(2 * 3 ** -1.5 * (1 - math.exp(-0.5 * 0.49 / 3)), rel=1e-12)
    assert abs(mc["u_mean"] - mc["exact"]) < 4 * mc["u_se"]
    assert mc["v_mean"] - mc["exact"] > 4 * mc["u_se"]             # the diagonal adds a positive bias


def test_gradient_fd_error_small_for_eq13():
    rng = np.random.default_rng(1)
    assert ft_checks.gradient_fd_error(rng.standard_normal((12, 3)), rng.standard_normal((5, 3)), 0.3) < 1e-7


def test_gradient_identity_table_size_weights_exact_uniform_weights_not():
    X, y = _blobs()
    parts = {"skewed": [np.where(y == 0)[0][:10], np.where(y == 1)[0], np.where(y == 2)[0]]}
    X = X[np.concatenate(parts["skewed"])]
    parts = {"skewed": [np.arange(10), np.arange(10, 40), np.arange(40, 70)]}
    Y = np.random.default_rng(0).random((6, X.shape[1]))
    t = ft_checks.gradient_identity_table(X, parts, Y, ft_mmd.median_kernel_width(X)).set_index("weights")
    assert t.loc["n_p/n", "rel. error vs pooled gradient"] < 1e-12
    assert t.loc["1/P", "rel. error vs pooled gradient"] > 1e-2
    assert t.loc["n_p/n", "client sizes"] == "10-30"


def test_split_runs_landmarks_do_not_depend_on_the_split():
    X, y = _blobs()
    parts = {"IID": ft_chapters.client_split(y, 3, "iid"), "non-IID": ft_chapters.client_split(y, 3, "non_iid")}
    Y0 = np.random.default_rng(0).random((5, X.shape[1]))
    runs, gaps = ft_checks.split_runs(X, parts, 5, 10, init=Y0, gamma=2.0, seed=0)
    assert list(runs) == ["one client (pooled)", "IID", "non-IID"]
    assert max(gaps.values()) < 1e-9
    assert np.abs(runs["IID"].landmarks - Y0).max() > 1e-3         # they did move


def test_objective_curves_steps_and_decrease():
    X, y = _blobs()
    curves = ft_checks.objective_curves(X, {"IID": ft_chapters.client_split(y, 3, "iid")}, 5, 10,
                                 init=np.random.default_rng(0).random((5, X.shape[1])), gamma=2.0)
    g = curves[curves["mode"] == "gradient, Q=1"]
    a = curves[curves["mode"] == "average, Q=5"]
    assert list(g["gradient steps"]) == list(range(11)) and list(a["gradient steps"]) == [0, 5, 10]
    assert g["objective F (MMD^2)"].iloc[-1] < g["objective F (MMD^2)"].iloc[0]


def test_theorem1_denominator():
    assert [ft_checks.theorem1_denominator(q) for q in (1, 2, 5)] == [1, -5, -95]
    assert ft_checks.theorem1_denominator(2, rho_l=1.5, max_ratio=2.0) == pytest.approx(1 - 3 * 3.5)


def test_nystrom_exactness_table_squared_exact_from_m_plus_2():
    t = ft_checks.nystrom_exactness_table(np.random.default_rng(0).standard_normal((80, 4)), np.random.default_rng(1),
                                   [4, 5, 6, 9])
    sq = t.set_index("landmarks n_y")["rel. error, squared distances"]
    assert sq[6] < 1e-9 and sq[9] < 1e-9 and sq[4] > 1e-3
    assert t["rel. error, plain distances"].min() > 1e-3


def test_landmark_quality_sweep_exact_with_enough_landmarks():
    X, y = _blobs(m=4)
    sweep = ft_checks.landmark_quality_sweep(X, {"IID": ft_chapters.client_split(y, 3, "iid")}, [3, 10], 5, gamma=2.0,
                                      rng=np.random.default_rng(0))
    assert set(sweep.landmarks) == {"uniform sample (oracle)", "untrained Y^0", "FedDL, IID"}
    big = sweep[sweep.n_y == 10]
    assert big["rel. error of D_hat"].max() < 1e-6 and big["10-NN overlap"].min() == pytest.approx(1.0)
    assert sweep[sweep.n_y == 3]["rel. error of D_hat"].min() > 1e-3


def test_theorem2_table_bound_formula():
    t = ft_checks.theorem2_table(np.random.default_rng(0), n=200, dim=5, columns=[10, 40])
    rng = np.random.default_rng(0)
    d2 = ft_mmd.sq_distances(rng.standard_normal((200, 5)))
    eig = np.sort(np.linalg.eigvalsh(np.exp(-d2 / np.median(d2))))[::-1]
    assert t["stated bound"].iloc[0] == pytest.approx(np.sqrt(np.sum(eig[10:] ** 2)) + 64 ** 0.25, rel=1e-10)
    assert (t["||H - H_hat||_F"] > 0).all() and t["||H - H_hat||_F"].iloc[1] < t["||H - H_hat||_F"].iloc[0]


def test_kernel_nystrom_error_zero_with_the_data_as_landmarks():
    X, _ = _blobs(n=30)
    assert ft_checks.kernel_nystrom_error(X, X, 2.0) < 1e-8
    assert 0 < ft_checks.kernel_nystrom_error(X, X[:3], 2.0) <= len(X)


def test_theorem6_inputs():
    X = np.array([[3.0, 4.0], [0.0, 1.0]])
    Y = np.array([[0.0, 0.0], [0.0, 2.0]])
    tau_x, tau_y, ups = ft_checks.theorem6_inputs(X, Y)
    assert (tau_x, tau_y, ups) == pytest.approx((5.0, 2.0, 5.0))


def test_sensitivity_audit_within_the_kernel_bound():
    X, _ = _blobs(n=60)
    Y = X[:8] + 0.01
    gamma = 3.0
    bound = ft_dp.kernel_gradient_sensitivity(20, 8, gamma)
    audit = ft_checks.sensitivity_audit(X[:20], X, Y, gamma, np.random.default_rng(0), 15, {"kernel bound": bound})
    assert list(audit.columns) == ["replacement", "largest change", "/ kernel bound"]
    assert (audit["/ kernel bound"] <= 1 + 1e-12).all()
    assert audit["/ kernel bound"].iloc[1] > 0.1           # the adversarial pairs come close to it


def test_calibration_table_analytic_sd_buys_its_epsilon():
    t = ft_checks.calibration_table([0.5, 4.0], 1e-5, 2.0, 1.0, 0.01, 10)
    for eps, sd in zip(t.epsilon, t["analytic Gaussian sd"]):
        assert privacy.analytic_gaussian_epsilon(sd, 1e-5, 4.0) == pytest.approx(eps, rel=1e-5)
    assert (t["PLD sd, kernel Delta"] / t["PLD sd, Thm 6 Delta"]).to_numpy() == pytest.approx(0.01, rel=1e-9)
    assert t["its true epsilon"].iloc[0] < 0.5 < t["its true epsilon"].iloc[1] / 4 * 0.5 + 0.5


def test_theorem4_threshold_brackets_the_crossing():
    """The Dwork-Roth sd buys at most its epsilon up to the crossing and more beyond it (at delta = 1e-5
    about 8.4); a grid that ends before the crossing reports inf, one that starts after it NaN."""
    delta = 1e-5
    out = ft_checks.theorem4_threshold(delta, low=0.1, high=64.0, points=25)
    star = out["valid up to"]
    assert out["one crossing"] and 1.0 < star < 64.0

    def buys(eps):
        return privacy.analytic_gaussian_epsilon(ft_dp.paper_noise_sd(eps, delta, 1.0, "dp_data"), delta, 1.0)

    assert buys(star * 0.999) <= star * 0.999 and buys(star * 1.01) > star * 1.01
    assert ft_checks.theorem4_threshold(delta, low=0.1, high=2.0, points=5)["valid up to"] == math.inf
    assert math.isnan(ft_checks.theorem4_threshold(delta, low=16.0, high=64.0, points=5)["valid up to"])
    with pytest.raises(ValueError):
        ft_checks.theorem4_threshold(delta, low=2.0, high=1.0)


def test_theorem1_first_term_on_hand_made_runs():
    """The bound 4 (F0 - FS) / (S Q L) against the average squared step, L = 1/lr: held and broken by runs
    made by hand, and checked on a real gradient-mode FedDL run at step 1/L."""
    run = SimpleNamespace(step_sq_norms=np.array([0.5, 0.3]), objective=np.array([2.0, 1.5, 1.0]), lr=0.5,
                          local_steps=1)
    out = ft_checks.theorem1_first_term(run)     # L = 2: bound 4 * 1 / (2 * 1 * 2) = 1, average step 0.4
    assert out["bound"] == pytest.approx(1.0) and out["average squared step"] == pytest.approx(0.4)
    assert out["ratio"] == pytest.approx(0.4)
    broken = ft_checks.theorem1_first_term(SimpleNamespace(**{**vars(run), "objective": np.array([2.0, 1.95, 1.9])}))
    assert broken["ratio"] > 1
    assert ft_checks.theorem1_first_term(SimpleNamespace(**{**vars(run), "objective": np.ones(3)}))["ratio"] == math.inf
    X, _ = _blobs(n=60, m=4)
    res = ft_feddl.feddl([X[:30], X[30:]], 6, rounds=15, seed=0)
    real = ft_checks.theorem1_first_term(res)
    assert real["S"] == 15 and real["Q"] == 1 and real["ratio"] <= 1.0


def test_reconstruction_table_exact_from_clean_uploads_only():
    X, _ = _blobs(n=60, m=4)
    t = ft_checks.reconstruction_table(X[:10], X, np.random.default_rng(0), [3, 6], noise_sd=0.5)
    clean = t[t["upload from"].str.startswith("clean")].set_index("n_y")["rel. reconstruction error"]
    noisy = t[t["upload from"].str.startswith("perturbed")]["rel. reconstruction error"]
    assert clean[6] < 1e-8 and clean[3] > 1e-3 and noisy.min() > 0.1


def test_upload_leak_exact_with_m_plus_2_landmarks():
    X, y = _blobs(n=60, m=4)
    parts = ft_chapters.client_split(y, 3, "iid")
    err_d, err_x = ft_checks.upload_leak(X, parts, np.random.default_rng(0).random((6, 4)))
    assert err_d < 1e-8 and err_x < 1e-8
    assert ft_checks.upload_leak(X, parts, np.random.default_rng(0).random((3, 4)))[1] > 1e-3


def test_rank_study_exact_low_rank_kernels_and_never_the_gaussian():
    rng = np.random.default_rng(0)
    X, pool = rng.standard_normal((60, 3)), rng.standard_normal((16, 3))
    kernels = ft_checks.exact_rank_kernels(3, 0.3)
    assert [r for _, r in kernels.values()] == [5, 10, None]
    table = ft_checks.nystrom_rank_table(kernels, X, pool)
    spectra = ft_checks.kernel_spectra(kernels, np.vstack([pool, X]))
    summary = ft_checks.rank_summary(table)
    assert list(summary["first exact n_y"].iloc[:2]) == [5, 10] and math.isnan(summary["first exact n_y"].iloc[2])
    assert ft_checks.rank_study_holds(table, spectra, kernels, top=20) == {k: True for k in kernels}
    broken = table.assign(**{"rel. error": table["rel. error"][::-1].to_numpy()})   # the error now grows
    assert not any(ft_checks.rank_study_holds(broken, spectra, kernels, top=20).values())


def test_affine_projection():
    L = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])      # the plane z = 1
    proj, dim = ft_checks.affine_projection(np.array([[2.0, 3.0, 5.0]]), L)
    assert dim == 2 and proj == pytest.approx(np.array([[2.0, 3.0, 1.0]]))


# ------------------------------------------------------------------------------------------------
# studies.py: privacy chapter
# ------------------------------------------------------------------------------------------------
def test_privacy_variants():
    v = ft_studies.privacy_variants([0.0, 1.0], [1.0, 10.0], 1e-5, 2.0, "pld")
    assert [name for name, *_ in v] == ["Fed (no noise)", "heuristic beta=1", "data perturbation eps=1",
                                        "data perturbation eps=10", "gradient perturbation eps=1",
                                        "gradient perturbation eps=10"]
    assert v[2][3] == {"epsilon": 1.0, "delta": 1e-5, "tau_x": 2.0} and v[4][3]["dp_accountant"] == "pld"


def test_public_feddl_uses_only_public_setup():
    X, y = _blobs(n=60)
    parts = ft_chapters.client_split(y, 3, "iid")
    res = ft_studies.public_feddl(X, parts, X[:10], 5, 3, 2.0, seed=1)
    assert np.array_equal(res.init_landmarks, ft_feddl.public_landmarks(X[:10], 5, 1))
    assert res.gamma == 2.0 and res.landmarks.min() >= 0 and res.landmarks.max() <= 1


def test_privacy_runs_rows_and_epsilon_spent():
    X, y = _blobs(n=60)
    parts = ft_chapters.client_split(y, 3, "iid")
    variants = ft_studies.privacy_variants([], [100.0], 1e-5, 2.0)[:2]
    runs = ft_studies.privacy_runs(X, y, parts, X[:10], variants, [0], ["tsne"], n_landmarks=8, rounds=3, gamma=2.0,
                           tsne_max_iter=250)
    assert list(runs.variant) == ["Fed (no noise)", "data perturbation eps=100"]
    assert math.isinf(runs["FedDL epsilon"].iloc[0]) and runs["FedDL epsilon"].iloc[1] <= 100
    assert runs["CA 10-NN"].between(0, 1).all() and runs["NMI"].between(0, 1).all()


def _privacy_frame():
    rows = []
    for s, (ref, lo, hi) in enumerate([(0.9, 0.5, 0.88), (0.8, 0.45, 0.79), (0.85, 0.5, 0.86)]):
        rows += [{"noise": "none", "level": np.nan, "method": "tsne", "seed": s, "CA 10-NN": ref, "NMI": ref},
                 {"noise": "dp_data", "level": 1.0, "method": "tsne", "seed": s, "CA 10-NN": lo, "NMI": lo},
                 {"noise": "dp_data", "level": 10.0, "method": "tsne", "seed": s, "CA 10-NN": hi, "NMI": hi},
                 {"noise": "heuristic", "level": 2.0, "method": "tsne", "seed": s, "CA 10-NN": lo, "NMI": lo}]
    return pd.DataFrame(rows)


def test_paired_vs_reference_and_recovery_epsilon():
    runs = _privacy_frame()
    d = ft_studies.paired_vs_reference(runs, "CA 10-NN", "tsne", "dp_data", 1.0)
    assert d.mean == pytest.approx(-0.35 - 0.0 + (0.0), abs=0.02) and d.n == 3
    assert d.mean == paired_difference([0.5, 0.45, 0.5], [0.9, 0.8, 0.85]).mean
    assert ft_studies.paired_vs_reference(runs, "CA 10-NN", "umap", "dp_data", 1.0) is None
    assert ft_studies.recovery_epsilon(runs, "tsne", "dp_data", [10.0, 1.0]) == 10.0
    assert ft_studies.recovery_epsilon(runs, "tsne", "dp_data", [1.0]) is None


def test_beta_runs_table_and_trend():
    b = ft_studies.beta_runs(_privacy_frame())
    assert sorted(b.beta.unique()) == [0.0, 2.0]
    t = ft_studies.beta_table(b, ["tsne"], {2.0: 12.345})
    assert list(t.NMI) == ["0.850 ± 0.050", "0.483 ± 0.029"]
    assert t["nominal epsilon (RDP, seed 0, not a guarantee)"].iloc[1] == "12.3"
    assert t["paired diff vs beta=0"].iloc[1].startswith("-0.367")
    # ranks: beta (2, 2, 2, 5, 5, 5), NMI (6, 4, 5, 2.5, 1, 2.5): Pearson of the ranks by hand
    assert ft_studies.beta_trend(b, ["tsne"])["tsne"] == pytest.approx(-13.5 / np.sqrt(13.5 * 17), abs=1e-12)


def test_nominal_epsilon_is_the_least_noisy_clients():
    parts = [np.arange(10), np.arange(10, 30)]
    gamma, n_y, z = 2.0, 4, 3.0
    sd = np.array([[z * ft_dp.kernel_gradient_sensitivity(10, n_y, gamma),
                    2 * z * ft_dp.kernel_gradient_sensitivity(20, n_y, gamma)]] * 5)
    fake = SimpleNamespace(landmarks=np.zeros((n_y, 2)), noise_sd=sd)
    assert ft_studies.nominal_epsilon(fake, parts, gamma, 1e-5) == pytest.approx(
        privacy.gaussian_epsilon(np.full(5, z), 1e-5, accountant="rdp"), rel=1e-9)


# ------------------------------------------------------------------------------------------------
# studies.py: Fed-SpeClust chapter
# ------------------------------------------------------------------------------------------------
def test_speclust_data_optdigits():
    data, splits, info = ft_studies.speclust_data(["optdigits"], 200, 10, [0, 1], n_landmarks=50)
    X, y, n_classes = data["optdigits"]
    assert X.shape == (200, 64) and n_classes == 10
    assert set(splits["optdigits"]) == {0, 1} and set(splits["optdigits"][0]) == {"IID", "non-IID"}
    assert info.loc["optdigits", "non-IID: classes per client"] == 1
    with pytest.raises(ValueError, match="n_landmarks"):
        ft_studies.speclust_data(["optdigits"], 200, 10, [0], n_landmarks=300)


def _speclust_blobs():
    """The Fed-SpeClust tests' data: 60 blobs points, and their IID and non-IID splits into 3 clients for seeds 0, 1."""
    X, y = _blobs(n=60)
    data = {"blobs": (X, y, 3)}
    splits = {"blobs": {s: {"IID": ft_chapters.client_split(y, 3, "iid", s), "non-IID": ft_chapters.client_split(y, 3, "non_iid", s)}
                        for s in (0, 1)}}
    return X, y, data, splits


@pytest.fixture(scope="module")
def speclust_small():
    X, y, data, splits = _speclust_blobs()
    variants = [("Fed", "IID", "none"), ("Fed+", "IID", "heuristic"), ("Fed", "non-IID", "none")]
    with threadpool_limits(1):
        out = ft_studies.speclust_runs(data, splits, [0, 1], variants, n_landmarks=8, gamma_rule="moments",
                               rounds={"blobs": 5}, beta=1.0)
    return out, variants


def test_speclust_runs_and_split_invariance(speclust_small):
    (runs, landmarks, objectives), variants = speclust_small
    assert len(runs) == 2 * 4 and set(landmarks) == {("blobs", s, v, sp) for s in (0, 1) for v, sp, _ in variants}
    assert runs[runs.variant == "central"]["kernel rel. error"].eq(0).all()
    assert len(objectives["blobs", 0, "Fed", "IID"]) == 6
    spread, gap, nmi_gap = ft_studies.split_invariance(runs, landmarks)
    assert spread.max() < 1e-10 and gap < 1e-8 and nmi_gap < 1e-2


def test_speclust_runs_and_landmark_sweep_in_float32_feddl(speclust_small):
    """dtype reaches FedDL (the chapter's feddl_dtype): float32 landmarks are float64's up to float32
    rounding (not equal), the splits still agree within the chapter's float32 tolerance (1e-4), and the
    gradient uploads halve; the kernel sweep takes the same dtype."""
    (runs, landmarks, _), variants = speclust_small
    X, y, data, splits = _speclust_blobs()
    with threadpool_limits(1):
        r32, lm32, _ = ft_studies.speclust_runs(data, splits, [0, 1], variants, n_landmarks=8, gamma_rule="moments",
                                        rounds={"blobs": 5}, beta=1.0, dtype="float32")
        sweep32, study32 = ft_studies.kernel_landmark_sweep(X, y, splits["blobs"][0]["IID"], [4, 8], 3, gamma_rule="moments",
                                                    rounds=5, dtype="float32")
    key = ("blobs", 0, "Fed", "IID")
    gap = np.abs(lm32[key] - landmarks[key]).max()
    assert 0 < gap < 1e-5
    _, split_gap, _ = ft_studies.split_invariance(r32, lm32)
    assert split_gap < 1e-4
    fed = (runs.variant == "Fed") & (runs.split == "IID")
    ratio = r32.loc[fed, "FedDL upload (MB)"].to_numpy() / runs.loc[fed, "FedDL upload (MB)"].to_numpy()
    assert ((ratio > 0.5) & (ratio < 0.6)).all()      # half the gradient bytes; the set-up sums stay float64
    assert np.allclose(study32["last"].feddl.landmarks, lm32[key], atol=0) and study32["assembly gap"] < 1e-8


def test_setting_cells_tables_and_paired_differences(speclust_small):
    (runs, _, _), _ = speclust_small
    cols = [("central", "pooled"), ("Fed", "IID")]
    cells = ft_studies.setting_cells(runs, ["blobs"], cols, ["NMI"])
    assert cells["blobs", ("Fed", "IID"), "NMI"].shape == (2,)
    table = ft_studies.cells_table(cells, ["blobs"], cols, ["central", "Fed"], ["NMI"], {"blobs": "B"})
    assert table.index.tolist() == [("B", "NMI")] and "±" in table.loc[("B", "NMI"), "Fed"]
    paper = pd.DataFrame({("central", "pooled", "mean"): [0.5], ("Fed", "IID", "mean"): [0.45]},
                         index=pd.MultiIndex.from_tuples([("MNIST", "NMI")]))
    pdiff, paired = ft_studies.paired_cells(cells, paper, ["blobs"], [("Fed - central", cols[1], cols[0])], ["NMI"])
    d = pdiff["blobs", "NMI", "Fed - central"]
    assert d.mean == pytest.approx(np.mean(cells["blobs", cols[1], "NMI"] - cells["blobs", cols[0], "NMI"]))
    assert paired.iloc[-1, 0] == "-0.0500"
    change = ft_studies.change_table(cells, paper, ["blobs"], cols, ["central", "Fed"], ["NMI"])
    assert change.loc[("paper", "MNIST", "NMI"), "Fed"] == pytest.approx(-0.05)
    assert change.loc[("ours", "blobs", "NMI"), "Fed"] == pytest.approx(d.mean)


def test_speclust_runs_reuse_a_known_feddl_run(speclust_small):
    """The chapter hands its first seed's noise-free IID run (the plateau search, fedtsne.plateau_run) to
    speclust_runs: the rows, landmarks and objectives equal those of a fresh run."""
    (runs, landmarks, objectives), variants = speclust_small
    X, y, data, splits = _speclust_blobs()
    known = ft_feddl.feddl([X[p] for p in splits["blobs"][0]["IID"]], 8, rounds=5, gamma="moments", seed=0)
    kw = dict(n_landmarks=8, gamma_rule="moments", rounds={"blobs": 5}, beta=1.0)
    with threadpool_limits(1):
        again, lm, obj = ft_studies.speclust_runs(data, splits, [0, 1], variants, feddl_results={("blobs", 0, "Fed", "IID"): known},
                                          **kw)
    pd.testing.assert_frame_equal(again.drop(columns="seconds"), runs.drop(columns="seconds"))
    assert all(np.array_equal(lm[k], landmarks[k]) and np.array_equal(obj[k], objectives[k]) for k in landmarks)
    assert lm["blobs", 0, "Fed", "IID"] is known.landmarks
    with pytest.raises(ValueError, match="feddl_results"):
        ft_studies.speclust_runs(data, splits, [0, 1], variants, feddl_results={("blobs", 0, "Fed+", "IID"): known}, **kw)
    with pytest.raises(ValueError, match="feddl_results"):
        ft_studies.speclust_runs(data, splits, [0, 1], variants, feddl_results={("blobs", 0, "Fed", "IID"): known},
                         **{**kw, "rounds": {"blobs": 6}})
    with pytest.raises(ValueError, match="feddl_results"):
        ft_studies.speclust_runs(data, splits, [0, 1], variants, feddl_results={("blobs", 2, "Fed", "IID"): known}, **kw)


def test_speclust_runs_split_check_seeds_reuse_noise_free_landmarks(speclust_small):
    """On seeds outside split_check_seeds the noise-free non-IID row takes the IID run's landmarks (the same
    up to round-off: split invariance); every number of the row equals the one of its own FedDL run."""
    (runs, landmarks, objectives), variants = speclust_small
    X, y, data, splits = _speclust_blobs()
    with threadpool_limits(1):
        short, lm, obj = ft_studies.speclust_runs(data, splits, [0, 1], variants, n_landmarks=8, gamma_rule="moments",
                                          rounds={"blobs": 5}, beta=1.0, split_check_seeds=[0])
    derived = (short.seed == 1) & (short.variant == "Fed") & (short.split == "non-IID")
    assert short.loc[derived, "FedDL"].tolist() == ["landmarks of Fed IID"] and short.loc[derived, "seconds"].isna().all()
    assert (short.loc[~derived & (short.variant != "central"), "FedDL"] == "own run").all()
    assert set(lm) == set(landmarks) - {("blobs", 1, "Fed", "non-IID")} and set(obj) == set(lm)
    cols = ["NMI", "ARI", "kernel rel. error", "final F(Y)", "gamma", "FedDL upload (MB)", "kernel upload (MB)"]
    np.testing.assert_allclose(short[cols].to_numpy(float), runs[cols].to_numpy(float), rtol=1e-9, atol=1e-12)
    spread, gap, nmi_gap = ft_studies.split_invariance(short, lm)
    assert gap < 1e-8 and nmi_gap < 1e-2
    with pytest.raises(ValueError, match="split_check_seeds"):
        ft_studies.speclust_runs(data, splits, [0, 1], variants, n_landmarks=8, gamma_rule="moments", rounds={"blobs": 5},
                         split_check_seeds=[3])
    with pytest.raises(ValueError, match="no seed"):
        ft_studies.split_invariance(short, {k: v for k, v in lm.items() if k[1] != 0})


def test_kernel_landmark_sweep_assembly_and_oracle():
    X, y = _blobs(n=60)
    sweep, info = ft_studies.kernel_landmark_sweep(X, y, ft_chapters.client_split(y, 3, "iid"), [5, 20], 3, gamma_rule="moments",
                                           rounds=5)
    assert info["assembly gap"] < 1e-8 and info["K"].shape == (60, 60)
    err = sweep.pivot(index="n_y", columns="landmarks", values="kernel rel. error")
    assert err["uniform sample (oracle, not federated)"][20] <= err["uniform sample (oracle, not federated)"][5]
    assert sweep["top share of C"].between(0, 1).all() and 0 <= info["central NMI"] <= 1
    # a known noise-free run at one n_y and the known central NMI give the same table
    parts = ft_chapters.client_split(y, 3, "iid")
    known = ft_feddl.feddl([X[p] for p in parts], 20, rounds=5, gamma="moments", seed=0)
    again, info2 = ft_studies.kernel_landmark_sweep(X, y, parts, [5, 20], 3, gamma_rule="moments", rounds=5,
                                            feddl_results={20: known}, central_nmi=info["central NMI"])
    pd.testing.assert_frame_equal(again, sweep)
    assert info2["gamma"] == info["gamma"] and info2["assembly gap"] < 1e-8 and info2["last"].feddl is known
    with pytest.raises(ValueError, match="feddl_results"):
        ft_studies.kernel_landmark_sweep(X, y, parts, [5, 20], 3, gamma_rule="moments", rounds=6, feddl_results={20: known})


# ------------------------------------------------------------------------------------------------
# studies.py: visualization benchmark
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench_small():
    X, y = _blobs(n=90)
    data = {"blobs": (X, y, ("a", "b", "c"))}
    with threadpool_limits(1):
        scorers = {"blobs": ft_chapters.EmbeddingScorer(X, y)}
        traces, conv = ft_studies.convergence_study(data, scorers, [0, 1], 3, 8, tol=0.01, window=0.1, min_window=10,
                                            check_every=20, max_rounds=40, stop_at_plateau=False,
                                            checkpoints=[10, 30])
        out = ft_studies.benchmark_runs(data, scorers, traces, [0, 1], ["tsne"], num_clients=3, n_landmarks=8, beta=1.0,
                                embed_kwargs={"tsne_max_iter": 250})
    return data, scorers, traces, conv, out


def test_convergence_study_and_plateau_tables(bench_small):
    _, _, traces, conv, _ = bench_small
    assert set(traces) == {("blobs", s, seed) for s in ("iid", "non_iid") for seed in (0, 1)}
    first = conv[conv.split == "IID"].set_index("round")
    assert list(first.index) == [0, 10, 30, 40]          # Y^0, the checkpoints and the last round
    assert first["moved"][0] == 0 and first["moved"][40] == pytest.approx(1.0)
    study = ft_studies.plateau_study(traces)
    assert (study["rounds run"] == 40).all() and (study["F(Y^S)"] < study["F(Y^0)"]).all()
    summary = ft_studies.plateau_summary(study)
    assert summary.loc[("blobs", "IID"), "rounds run"] == "40 ± 0"
    wide = conv.pivot_table(index=["dataset", "split"], columns="round", values="D-hat 10-NN")
    gain, late = ft_studies.gain_after(traces, wide, 0, at=10)
    assert len(late) == 2 and gain == pytest.approx(max(r[2] for r in late))
    assert ft_studies.late_gain_evidence(late).startswith("blobs IID: overlap")
    assert math.isnan(ft_studies.gain_after(traces, wide, 0, at=50)[0])


def test_step_study_table_and_steps_converged(bench_small):
    """The step study's runs are the convergence study's at lr_scale c; the table's columns follow from the
    traces (F's largest rise, the overlap at round ``at`` and at the end); steps_converged lists the steps
    at which nothing gains more than ``gain`` after ``at``, whether F descends there or not."""
    data, scorers, traces, conv, _ = bench_small
    rule = dict(tol=0.01, window=0.1, min_window=10, check_every=20, max_rounds=40, stop_at_plateau=False,
                checkpoints=[10, 30])
    with threadpool_limits(1):
        step_traces, step_conv = ft_studies.step_study(data, scorers, 0, 3, 8, [2.0, 64.0], progress=False, **rule)
    assert set(step_traces) == {("blobs", s, c) for s in ("iid", "non_iid") for c in (2.0, 64.0)}
    X, y, _ = data["blobs"]
    parts = ft_chapters.client_split(y, 3, "non_iid", 0)
    direct = ft_feddl.feddl([X[p] for p in parts], 8, rounds=40, lr_scale=2.0, seed=0)
    np.testing.assert_array_equal(step_traces["blobs", "non_iid", 2.0].result.landmarks, direct.landmarks)
    assert list(step_conv[(step_conv.step == 2.0) & (step_conv.split == "IID")]["round"]) == [0, 10, 30, 40]

    table = ft_studies.step_table(traces, conv, step_traces, step_conv, 0, at=10)
    assert list(table["step (x 1/L)"]) == [1.0, 2.0, 64.0] * 2 and list(table.split) == ["IID"] * 3 + ["non-IID"] * 3
    for _, row in table.iterrows():
        tr = (traces["blobs", {"IID": "iid", "non-IID": "non_iid"}[row.split], 0] if row["step (x 1/L)"] == 1 else
              step_traces["blobs", {"IID": "iid", "non-IID": "non_iid"}[row.split], row["step (x 1/L)"]])
        F = tr.objective
        top, total = max(0.0, max(F[s + 1] - F[s] for s in range(len(F) - 1))), F[0] - min(F)
        rise = top / total if total > 0 else math.inf
        assert row["largest rise of F"] == pytest.approx(rise) and row["F descends"] == (rise <= 1e-3)
        assert row["rounds run"] == 40 and row["F(Y^S)"] == F[-1]
        q = conv if row["step (x 1/L)"] == 1 else step_conv[step_conv.step == row["step (x 1/L)"]]
        q = q[q.split == row.split].set_index("round")["D-hat 10-NN"]
        assert row["gain after 10"] == pytest.approx(q[40] - q[10])
    assert table["F descends"].iloc[:2].all() and not table["F descends"].iloc[2]   # 64/L overshoots
    assert ft_studies.step_table(traces, conv, step_traces, step_conv, 0, at=40)["gain after 40"].isna().all()

    # step_summary and steps_converged on a table made by hand: the steps that gain <= gain everywhere (a run
    # stopped by round 50, NaN, gains nothing), on both sides of the bound
    made = pd.DataFrame({"step (x 1/L)": [1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0],
                         "F descends": [True, True, True, True, True, True, False, False],
                         "gain after 50": [0.1, 0.0, 0.03, np.nan, 0.01, np.nan, 0.0, 0.0],
                         "at the end": [0.8, 0.6, 0.9, 0.7, 0.9, 0.9, 0.5, 0.5],
                         "rounds run": [300, 100, 150, 50, 80, 40, 20, 20]})
    summary = ft_studies.step_summary(made)
    assert list(summary["descends"]) == [True, True, True, False]
    assert summary["largest_gain"].tolist() == [0.1, 0.03, 0.01, 0.0]
    assert summary.loc[1.0, "end"] == pytest.approx(0.7) and summary.loc[2.0, "rounds"] == 100
    assert ft_verdicts.steps_converged(summary, 0.02) == [4.0, 8.0]
    assert ft_verdicts.steps_converged(summary, 0.05) == [2.0, 4.0, 8.0]
    assert ft_verdicts.steps_converged(summary, 0.03) == [2.0, 4.0, 8.0]        # the bound itself is converged
    assert ft_verdicts.steps_converged(summary.assign(largest_gain=[0.1, 0.2, 0.3, 0.4]), 0.02) == []
    with pytest.raises(ValueError):
        ft_verdicts.steps_converged(summary, 0.0)


def test_benchmark_runs(bench_small):
    *_, (results, dist_q, costs, keep_Z, checks) = bench_small
    assert checks["scorer vs embedding_report"] < 1e-12 and checks["Y^0 split gap"] <= 1e-10
    assert len(results) == 2 * (1 + 5) and set(dist_q.variant) == {"untrained", "Fed", "Fed+"}
    assert len(costs) == 2 * 4 and (costs["distance upload MiB"] == 90 * 8 * 8 / 2**20).all()
    assert keep_Z["blobs", "tsne", "Fed", "IID", 0].shape == (90, 2)


def test_paired_differences_tables_and_selection(bench_small):
    *_, (results, dist_q, _, _, _) = bench_small
    comps = [("Fed IID - central", ("Fed", "IID"), ("central", "pooled"))]
    d = ft_studies.paired_differences(results, comps, "NMI", dataset="blobs")["Fed IID - central"]
    a = results[(results.variant == "Fed") & (results.split == "IID")].sort_values("seed")["NMI"].to_numpy()
    b = results[results.variant == "central"].sort_values("seed")["NMI"].to_numpy()
    assert d.mean == pytest.approx(np.mean(a - b))
    paper = pd.DataFrame({("Fed", "IID", "mean"): [0.7], ("central", "pooled", "mean"): [0.8]},
                         index=pd.MultiIndex.from_tuples([("t-SNE", "NMI")]))
    pdiff, table = ft_studies.paired_metric_table(results, comps, ["blobs"], ["t-SNE"], ["NMI"], {"blobs": lambda: paper})
    assert table["paper: difference of means"].iloc[0] == pytest.approx(-0.1)
    assert ft_studies.select_differences(pdiff, ["blobs"], ["t-SNE"], "NMI", ["Fed IID - central"]) == {
        ("blobs", "t-SNE", "Fed IID - central"): pdiff["blobs", "t-SNE", "NMI", "Fed IID - central"]}


def test_distance_verdicts_and_metric_tables(bench_small):
    data, _, _, _, (results, dist_q, _, _, _) = bench_small
    train_gain = {"blobs": paired_difference([0.9, 0.8], [0.5, 0.45])}
    (message, ok), = ft_studies.distance_verdicts(dist_q, data, 8, train_gain)       # m + 2 = 8 <= n_y = 8: exact
    assert ok and message.startswith("blobs: m + 2 = 8 <= n_y = 8")
    (message, ok), = ft_studies.distance_verdicts(dist_q, data, 7, train_gain)       # not exact: trained > Y^0
    assert ok and "trained - untrained" in message
    tables = ft_studies.metric_tables(results, data, [0, 1], ["NMI"], [("t-SNE", "NMI")], [("central", "pooled")], {})
    title, table = tables["blobs"]
    assert "no table" in title and table.shape == (1, 1)
    assert ft_studies.data_sizes(data, [0, 1]).loc["blobs"].tolist() == [90, 6, 3, 2]


def test_client_and_landmark_sweeps():
    X, y = _blobs(n=90)
    with threadpool_limits(1):
        sc = ft_chapters.EmbeddingScorer(X, y)
        clients = ft_studies.client_sweep(X, y, [("iid", 3), ("non_iid", 3)], [0], sc, n_landmarks=8, rounds=3, beta=1.0,
                                  embed_kwargs={"tsne_max_iter": 250})
        lm, q = ft_studies.landmark_sweep(X, y, ["iid"], [4, 8], ["Fed"], ["tsne"], [0], sc, num_clients=3, rounds=3,
                                  beta=1.0, embed_kwargs={"tsne_max_iter": 250})
    assert list(clients.method) == ["Fed-tSNE", "Fed-tSNE+"] * 2 and set(clients.split) == {"IID", "non-IID"}
    assert (clients["rounds"] == 3).all() and not clients["reused"].any() and (q["rounds"] == 3).all()
    assert list(lm.n_y) == [4, 8] and list(lm.method) == ["Fed-tSNE"] * 2
    exact = q[(q.n_y == 8) & (q.estimate != "FedDL landmarks, plain")]["D-hat rel. error"]
    assert exact.max() < 1e-6 and q[q.estimate == "FedDL landmarks, plain"]["D-hat rel. error"].min() > 1e-3


def test_sweeps_follow_the_plateau_rule_and_skip_runs_made_elsewhere():
    """rounds="plateau": the noise-free sweep run stops by the main runs' rule, Fed+ runs as many rounds;
    a skipped run is left out."""
    X, y = _blobs(n=90)
    parts = ft_chapters.client_split(y, 3, "iid", 0)
    rule = dict(tol=0.01, window=0.1, min_window=10, check_every=20, max_rounds=2000)
    fds = ft_studies.sweep_feddl(X, parts, 8, ["Fed", "Fed+"], 0, rounds="plateau", beta=1.0, plateau=rule)
    tr = ft_feddl.feddl_until_plateau([X[p] for p in parts], 8, seed=0, **rule)
    assert tr.plateau is not None and fds["Fed"].rounds == fds["Fed+"].rounds == tr.rounds
    assert np.array_equal(fds["Fed"].landmarks, tr.result.landmarks)
    plus = ft_pipelines.learn_landmarks(X, parts, "Fed+", 8, tr.rounds, beta=1.0, seed=0)
    assert np.array_equal(fds["Fed+"].landmarks, plus.landmarks)
    assert list(ft_studies.sweep_feddl(X, parts, 8, ["Fed+"], 0, rounds="plateau", beta=1.0, plateau=rule)) == ["Fed+"]
    fixed = ft_studies.sweep_feddl(X, parts, 8, ["Fed"], 0, rounds=7, beta=1.0)
    assert fixed["Fed"].rounds == 7
    with pytest.raises(RuntimeError, match="max_rounds=5"):
        ft_studies.sweep_feddl(X, parts, 8, ["Fed"], 0, rounds="plateau", beta=1.0, plateau={**rule, "max_rounds": 5,
                                                                                       "check_every": 5})
    with pytest.raises(ValueError, match="rounds"):
        ft_studies.sweep_feddl(X, parts, 8, ["Fed"], 0, rounds="forever", beta=1.0)

    sc = ft_chapters.EmbeddingScorer(X, y)
    kw = dict(n_landmarks=8, rounds="plateau", beta=1.0, embed_kwargs={"tsne_max_iter": 250}, plateau=rule)
    fresh = ft_studies.client_sweep(X, y, [("iid", 3), ("iid", 2)], [0], sc, **kw)
    assert not fresh["reused"].any() and (fresh[fresh.clients == 3]["rounds"] == tr.rounds).all()
    Z = ft_pipelines.embed("tsne", X, parts, 8, seed=0, feddl_result=fds["Fed"], tsne_max_iter=250).embedding
    assert fresh.iloc[0]["NMI"] == sc(Z, 0)["NMI"]
    skipped = ft_studies.client_sweep(X, y, [("iid", 3), ("iid", 2)], [0], sc, skip={("iid", 3, 0)}, **kw)
    pd.testing.assert_frame_equal(skipped, fresh[fresh.clients == 2].reset_index(drop=True))


def test_trace_embeddings_at_rounds_0_and_S_are_the_untrained_and_fed_main_runs(bench_small):
    """The chapter's figure of the embedding as FedDL trains takes rounds 0 and S from the main runs: the same
    landmarks, clients, seed and t-SNE settings give the same embeddings."""
    data, _, traces, _, (_, _, _, keep_Z, _) = bench_small
    X, y, _ = data["blobs"]
    tr = traces["blobs", "iid", 0]
    parts = ft_chapters.client_split(y, 3, "iid", 0)
    Z = ft_studies.trace_embeddings(X, parts, tr, [0, 10, tr.rounds], 0, 8, embed_kwargs={"tsne_max_iter": 250})
    np.testing.assert_array_equal(Z[0], keep_Z["blobs", "tsne", "untrained", "any", 0])
    np.testing.assert_array_equal(Z[tr.rounds], keep_Z["blobs", "tsne", "Fed", "IID", 0])
    assert Z[10].shape == (90, 2)    # (blobs in 6 dimensions, 8 landmarks: D-hat is exact at every round)
    with pytest.raises(ValueError, match=r"rounds \[20\] were not kept"):
        ft_studies.trace_embeddings(X, parts, tr, [20], 0, 8)


def test_main_run_rows_are_the_client_sweep_rows_of_the_main_runs(bench_small):
    """The benchmark's main runs give the client sweep's rows at k = num_clients (same data, clients, rule,
    t-SNE settings: the same runs), so the sweep does not run them again."""
    data, scorers, _, _, (results, _, costs, _, _) = bench_small
    X, y, _ = data["blobs"]
    keys = {("iid", 3, 0), ("non_iid", 3, 1)}
    rows = ft_studies.main_run_rows(results, costs, "blobs", keys)
    # the main runs of bench_small: 40 rounds, no plateau stop
    fresh = ft_studies.client_sweep(X, y, [("iid", 3), ("non_iid", 3)], [0, 1], scorers["blobs"], n_landmarks=8, rounds=40,
                            beta=1.0, embed_kwargs={"tsne_max_iter": 250})
    fresh = fresh[[(s, c, seed) in {("IID", 3, 0), ("non-IID", 3, 1)}
                   for s, c, seed in zip(fresh.split, fresh.clients, fresh.seed)]]
    assert rows["reused"].all() and len(rows) == 4
    pd.testing.assert_frame_equal(rows.drop(columns="reused"),
                                  fresh.drop(columns="reused").sort_values(["split", "seed"]).reset_index(drop=True),
                                  check_like=True)
    with pytest.raises(ValueError, match="no main run for blobs, iid, seed 7"):
        ft_studies.main_run_rows(results, costs, "blobs", {("iid", 3, 7)})


def test_paper_drop_check_splits_gamma_control():
    t = pd.DataFrame({("Fed", "IID", "mean"): [0.7, 0.9], ("central", "pooled", "mean"): [0.8, 0.85]},
                     index=pd.MultiIndex.from_tuples([("t-SNE", "CA"), ("UMAP", "CA")]))
    assert ft_studies.paper_drop([t], "CA", [(("Fed", "IID"), ("central", "pooled"))]) == pytest.approx(-0.1)
    X, y = _blobs(n=60)
    ft_studies.check_splits(y, [("iid", 3), ("non_iid", 3)])
    with pytest.raises(ValueError, match="num_clients"):
        ft_studies.check_splits(y, [("non_iid", 4)])
    assert ft_studies.gamma_control(X, y, 3, 5, 5, 2.0) < 1e-8


def test_benchmark_studies_in_forked_workers_equal_one_process():
    """workers=2 (fork_map) gives exactly the rows, embeddings and FedDL landmarks of workers=1."""
    X, y = _blobs(n=90)
    data = {"blobs": (X, y, ("a", "b", "c"))}
    rule = dict(tol=0.01, window=0.1, min_window=10, check_every=20, max_rounds=40, stop_at_plateau=False,
                checkpoints=[10, 30])
    out = {}
    with threadpool_limits(1):
        for workers in (1, 2):
            scorers = {"blobs": ft_chapters.EmbeddingScorer(X, y)}
            traces, conv = ft_studies.convergence_study(data, scorers, [0, 1], 3, 8, workers=workers, progress=False, **rule)
            bench = ft_studies.benchmark_runs(data, scorers, traces, [0, 1], ["tsne"], num_clients=3, n_landmarks=8, beta=1.0,
                                      embed_kwargs={"tsne_max_iter": 250}, workers=workers, progress=False)
            kw = dict(rounds=3, beta=1.0, embed_kwargs={"tsne_max_iter": 250}, workers=workers, progress=False)
            clients = ft_studies.client_sweep(X, y, [("iid", 3), ("non_iid", 3), ("iid", 4)], [0], scorers["blobs"],
                                      n_landmarks=8, skip={("iid", 3, 0)}, **kw)
            lm = ft_studies.landmark_sweep(X, y, ["iid", "non_iid"], [4, 8], ["Fed", "Fed+"], ["tsne"], [0], scorers["blobs"],
                                   num_clients=3, **kw)
            out[workers] = traces, conv, bench, clients, lm
        # the convergence runs and both sweeps in one fork_map (the notebook's call): the same results
        kw.pop("workers"), kw.pop("progress")
        plans = [ft_studies.convergence_study(data, scorers, [0, 1], 3, 8, plan=True, **rule),
                 ft_studies.client_sweep(X, y, [("iid", 3), ("non_iid", 3), ("iid", 4)], [0], scorers["blobs"], n_landmarks=8,
                                 skip={("iid", 3, 0)}, plan=True, **kw),
                 ft_studies.landmark_sweep(X, y, ["iid", "non_iid"], [4, 8], ["Fed", "Fed+"], ["tsne"], [0], scorers["blobs"],
                                   num_clients=3, plan=True, **kw),
                 ft_studies.step_study(data, scorers, 0, 3, 8, [2.0], plan=True, **rule)]
        (t3, c3), *together, (steps_forked, step_conv_forked) = ft_studies.run_sweeps(plans, 2, progress=False)
        steps_one, step_conv_one = ft_studies.step_study(data, scorers, 0, 3, 8, [2.0], progress=False, **rule)
    pd.testing.assert_frame_equal(step_conv_forked, step_conv_one)
    for key, tr in steps_one.items():
        np.testing.assert_array_equal(tr.result.landmarks, steps_forked[key].result.landmarks)
    (t1, c1, b1, cl1, lm1), (t2, c2, b2, cl2, lm2) = out[1], out[2]
    assert list(t1) == list(t2) == list(t3)
    for key in t1:
        assert t1[key].rounds == t2[key].rounds == t3[key].rounds
        assert set(t1[key].landmarks) == set(t2[key].landmarks) == set(t3[key].landmarks)
        for s in t1[key].landmarks:
            np.testing.assert_array_equal(t1[key].landmarks[s], t2[key].landmarks[s])
            np.testing.assert_array_equal(t1[key].landmarks[s], t3[key].landmarks[s])
    pd.testing.assert_frame_equal(c1, c2)
    pd.testing.assert_frame_equal(c1, c3)
    for a, b in zip(b1[:3], b2[:3]):      # results, D-hat quality, costs: every column but the seconds
        pd.testing.assert_frame_equal(a.drop(columns=[c for c in a if "s" == c.split()[-1] or c == "seconds"]),
                                      b.drop(columns=[c for c in b if "s" == c.split()[-1] or c == "seconds"]))
    assert list(b1[3]) == list(b2[3]) and b1[4] == b2[4]
    for key in b1[3]:
        np.testing.assert_array_equal(b1[3][key], b2[3][key])
    pd.testing.assert_frame_equal(cl1, cl2)
    assert not cl1["reused"].any() and len(cl1) == 4 and set(cl1.clients) == {3, 4}
    for a, b in zip(lm1, lm2):
        pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(together[0], cl1)
    for a, b in zip(together[1], lm1):
        pd.testing.assert_frame_equal(a, b)
    with pytest.raises(ValueError, match="workers"):
        ft_studies.landmark_sweep(X, y, ["iid"], [4], ["Fed"], ["tsne"], [0], scorers["blobs"], num_clients=3, rounds=3,
                          beta=1.0, workers=0)


def test_benchmark_workers_parameter_is_checked_before_any_work():
    from conftest import chapter_values
    from fedlib.runner import specs

    specs.check("fedtsne_benchmark", chapter_values("fedtsne_benchmark", workers=None))
    specs.check("fedtsne_benchmark", chapter_values("fedtsne_benchmark", workers=2))
    for bad in (0, 1.5, "two"):
        with pytest.raises(ValueError, match="workers"):
            specs.check("fedtsne_benchmark", chapter_values("fedtsne_benchmark", workers=bad))
