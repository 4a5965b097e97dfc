"""AFL exactness (AA law, RI process) on random data, with tolerances a wrong formula fails."""
import time
import warnings

import numpy as np
import pytest
import torch

from fedlib.afl import algorithm as afl
from fedlib.afl import studies as afl_studies
from fedlib.afl import speed as afl_speed
from fedlib.core.linalg import (SufficientStats, gram_report, normal_equations_tolerance, relative_error, ridge_fit, ridge_solve, synthetic_features)
from fedlib.data.partition import make_partition

N, D, C = 1500, 24, 5
EPS64, EPS32 = np.finfo(np.float64).eps, np.finfo(np.float32).eps


def lstsq(x, y, num_classes=C):
    """Independent reference: NumPy's SVD least squares on X itself (not the normal equations)."""
    return torch.from_numpy(np.linalg.lstsq(np.asarray(x, dtype=np.float64), np.eye(num_classes)[y], rcond=None)[0])


@pytest.fixture(scope="module")
def data():
    x, y = synthetic_features(N, D, C, "gaussian", seed=3)
    return x, y, lstsq(x, y)


def test_stats_add_across_clients(data):
    x, y, _ = data
    parts = np.array_split(np.arange(N), 7)
    total = SufficientStats.zeros(D, C)
    for p in parts:
        total += SufficientStats.from_data(x[p], y[p], C)
    whole = SufficientStats.from_data(x, y, C, chunk=100)
    assert total.n == N
    torch.testing.assert_close(total.gram, whole.gram, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(total.xty, whole.xty, rtol=1e-12, atol=1e-10)


def test_ridge_fit_matches_numpy(data):
    x, y, _ = data
    y1 = np.eye(C)[y]
    expected = np.linalg.solve(x.T @ x + 3.0 * np.eye(D), x.T @ y1)
    np.testing.assert_allclose(ridge_fit(x, y, C, 3.0).numpy(), expected, rtol=1e-10, atol=1e-12)


def test_client_update_is_local_ridge(data):
    x, y, _ = data
    msg = afl.client_update(x[:40], y[:40], C, gamma=2.0, packed=False)   # the paper's upload
    y1 = np.eye(C)[y[:40]]
    np.testing.assert_allclose(msg["C"].numpy(), x[:40].T @ x[:40] + 2.0 * np.eye(D), rtol=1e-12)
    np.testing.assert_allclose(msg["W"].numpy(), np.linalg.solve(msg["C"].numpy(), x[:40].T @ y1), rtol=1e-9)
    assert msg.nbytes == (D * D + D * C) * 8 + 8


def test_packed_upload_is_the_upper_triangle_and_halves_the_bytes_of_c(data):
    x, y, _ = data
    full = afl.client_update(x[:40], y[:40], C, gamma=2.0, packed=False)
    packed = afl.client_update(x[:40], y[:40], C, gamma=2.0)   # the default
    assert "C" not in packed.payload and packed["C_packed"].shape == (D * (D + 1) // 2,)
    rows, cols = torch.triu_indices(D, D)
    # the packed triangle is formed block by block (afl_speed.packed_gram): the full C's upper triangle to round-off
    assert relative_error(packed["C_packed"], full["C"][rows, cols]) < 1e-14 and torch.equal(packed["W"], full["W"])
    restored = afl.upload_gram(packed)
    assert torch.equal(restored, restored.T) and relative_error(restored.triu(), full["C"].triu()) < 1e-14
    # measured bytes: C goes from d^2 to d(d+1)/2 float64 numbers, W and gamma are unchanged
    assert packed.nbytes == (D * (D + 1) // 2 + D * C) * 8 + 8
    assert full.nbytes - packed.nbytes == (D * D - D * (D + 1) // 2) * 8 == D * (D - 1) // 2 * 8


def test_pack_unpack_round_trip_and_bad_lengths():
    a = torch.randn(7, 7, dtype=torch.float64)
    s = a + a.T
    p = afl_speed.pack_symmetric(s)
    assert p.shape == (28,) and afl_speed.packed_length(7) == 28 and afl_speed.packed_dim(p) == 7
    assert torch.equal(afl_speed.unpack_symmetric(p), s)
    with pytest.raises(ValueError, match="d\\(d\\+1\\)/2 entries, got shape \\(27,\\)"):
        afl_speed.unpack_symmetric(p[:-1])
    with pytest.raises(ValueError, match="7 x 7 matrix has 28 entries"):
        afl_speed.unpack_symmetric(p[:21], 7)


def test_empty_client_uploads_gamma_identity():
    msg = afl.client_update(np.zeros((0, D)), np.zeros(0, dtype=int), C, gamma=1.5)
    torch.testing.assert_close(afl.upload_gram(msg), 1.5 * torch.eye(D, dtype=torch.float64))
    assert float(msg["W"].abs().max()) == 0.0


@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
@pytest.mark.parametrize("k", [1, 2, 7, 60])
def test_aggregate_equals_joint_least_squares(data, server, k):
    x, y, w_joint = data
    parts = make_partition(y, k, "iid", seed=k)
    res = afl.run_afl(x, y, parts, C, gamma=1.0, server=server)
    tol = 1e-10 if server == "one_solve" else 1e-7
    assert relative_error(res.weights, w_joint) < tol
    assert res.num_clients == k and len(res.upload_bytes) == k


def test_one_round_delivery_is_identical(data):
    x, y, _ = data
    parts = make_partition(y, 7, "dirichlet", alpha=0.5, seed=3)
    for server in ["pairwise", "one_solve"]:
        streamed = afl.run_afl(x, y, parts, C, gamma=1.0, server=server)
        once = afl.run_afl(x, y, parts, C, gamma=1.0, server=server, one_round=True)
        assert torch.equal(streamed.weights, once.weights)
        assert once.cost.bytes_up == streamed.cost.bytes_up
    with pytest.raises(ValueError, match="order"):
        afl.run_afl(x, y, parts, C, one_round=True, order=[1, 0, 2, 3, 4, 5, 6])


@pytest.mark.parametrize("alpha", [1.0, 0.01])
def test_heterogeneity_and_order_invariance(data, alpha):
    x, y, w_joint = data
    parts = make_partition(y, 40, "dirichlet", alpha=alpha, seed=1)
    order = np.random.default_rng(0).permutation(40)
    for server in ["pairwise", "one_solve"]:
        w = afl.run_afl(x, y, parts, C, gamma=1.0, server=server, order=order).weights
        assert relative_error(w, w_joint) < 1e-7


def test_aa_weights_corrected_sign_identities(data):
    x, y, _ = data
    a, b = (afl.client_update(x[p], y[p], C, 0.0, packed=False)["C"] for p in np.array_split(np.arange(N), 2))
    w_a, w_b = afl.aa_weights(a, b, sign=+1)
    s_inv_a = torch.linalg.solve(a + b, a)
    assert float((w_a - s_inv_a).abs().max()) < 1e-10
    assert float((w_a + w_b - torch.eye(D, dtype=torch.float64)).abs().max()) < 1e-10


def test_printed_sign_fails(data):
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 2)
    printed = afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise", sign=-1, restore=False)
    corrected = afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise", sign=+1, restore=False)
    assert relative_error(corrected.weights, w_joint) < 1e-10
    assert relative_error(printed.weights, w_joint) > 0.5


def test_without_ri_is_ridge_with_k_gamma(data):
    x, y, w_joint = data
    k, gamma = 30, 0.7
    parts = make_partition(y, k, "iid", seed=0)
    res = afl.run_afl(x, y, parts, C, gamma=gamma, restore=False)
    assert relative_error(res.weights, ridge_fit(x, y, C, k * gamma)) < 1e-10
    assert relative_error(res.weights, w_joint) > 1e-3  # the penalty K*gamma is visible
    assert res.gamma_sum == pytest.approx(k * gamma)
    restored = afl.ri_restore(res.weights_regularized, res.gram_regularized, res.gamma_sum)
    assert relative_error(restored, w_joint) < 1e-10


def test_rank_deficient_clients_need_ri(data):
    """N_k < d: gamma = 0 with the paper's recursion (pinv) breaks, RI restores exactness."""
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 100)  # 15 samples per client < d = 24
    broken = afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise", inverse="pinv")
    fixed = afl.run_afl(x, y, parts, C, gamma=1.0, server="pairwise")
    assert float((broken.weights - w_joint).abs().sum()) > 1e-3
    assert relative_error(fixed.weights, w_joint) < 1e-7


def test_one_solve_exact_at_gamma_zero(data):
    """C_k X_k^+ Y_k = X_k^T Y_k even for rank-deficient clients: one-solve is exact at gamma = 0."""
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 100)
    res = afl.run_afl(x, y, parts, C, gamma=0.0, server="one_solve")
    assert relative_error(res.weights, w_joint) < 1e-8


def test_singular_pooled_gram_warns():
    x, y = synthetic_features(10, 20, 3, seed=0)  # N < d
    with pytest.warns(RuntimeWarning, match="singular"):
        afl.run_afl(x, y, [np.arange(5), np.arange(5, 10)], 3, gamma=1.0)


def test_ridge_solve_handles_negative_shift():
    g = torch.diag(torch.tensor([5.0, 6.0], dtype=torch.float64))
    out = ridge_solve(g, torch.eye(2, dtype=torch.float64), lam=-1.0)
    torch.testing.assert_close(out, torch.diag(torch.tensor([0.25, 0.2], dtype=torch.float64)))


@pytest.mark.parametrize("kwargs, match", [
    ({"gamma": -1.0}, "gamma"),
    ({"server": "recursive"}, "server"),
    ({"sign": 2, "server": "pairwise"}, "sign"),
    ({"inverse": "inv", "server": "pairwise"}, "inverse"),
    ({"order": [0, 0]}, "order"),
])
def test_bad_input(data, kwargs, match):
    x, y, _ = data
    parts = [np.arange(0, 100), np.arange(100, 200)]
    with pytest.raises(ValueError, match=match):
        afl.run_afl(x, y, parts, C, **kwargs)


def test_labels_out_of_range():
    with pytest.raises(ValueError, match="num_classes"):
        afl.client_update(np.ones((3, 2)), np.array([0, 1, 5]), 3)


def test_client_update_dual_form_for_small_clients(data):
    """N_k < d uses X^T (X X^T + gamma I)^{-1} Y: must equal the primal ridge solve."""
    x, y, _ = data
    msg = afl.client_update(x[:10], y[:10], C, gamma=0.5)
    y1 = np.eye(C)[y[:10]]
    primal = np.linalg.solve(x[:10].T @ x[:10] + 0.5 * np.eye(D), x[:10].T @ y1)
    np.testing.assert_allclose(msg["W"].numpy(), primal, rtol=1e-9, atol=1e-12)


# ---- references independent of the normal equations, on ill-conditioned features ----------------
@pytest.mark.parametrize("condition", [1e5, 1e8, 1e10])
@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
def test_afl_matches_lstsq_on_ill_conditioned_features(condition, server):
    """Tolerance derived from the conditioning: safety * cond(X^T X) * eps; the unrestored ridge
    (a wrong answer) must fall outside it."""
    x, y = synthetic_features(2000, D, C, "ill_conditioned", seed=1, condition=condition)
    ref = lstsq(x, y)
    kappa = np.linalg.cond(x.T @ x)
    assert kappa == pytest.approx(condition, rel=0.05)
    tol = normal_equations_tolerance(kappa)
    parts = make_partition(y, 30, "iid", seed=0)
    res = afl.run_afl(x, y, parts, C, gamma=1.0, server=server)
    assert relative_error(res.weights, ref) < tol
    assert relative_error(res.weights_regularized, ref) > 100 * tol  # K*gamma ridge is visibly off


@pytest.mark.parametrize("condition", [1e3, 1e5])
def test_afl_float32_statistics_match_lstsq(condition):
    """float32 accumulation (the authors' code): error within 2 cond * eps32 of lstsq on the same
    (float32-rounded) features; float64 accumulation is 1e7x tighter."""
    x, y = synthetic_features(2000, D, C, "ill_conditioned", seed=2, condition=condition)
    x32 = x.astype(np.float32)
    ref = lstsq(x32, y)
    kappa = np.linalg.cond(x32.astype(np.float64).T @ x32.astype(np.float64))
    parts = make_partition(y, 30, "iid", seed=0)
    w32 = afl.run_afl(x32, y, parts, C, gamma=1.0, dtype=torch.float32).weights
    w64 = afl.run_afl(x32, y, parts, C, gamma=1.0).weights
    assert w32.dtype == torch.float32
    assert relative_error(w32.double(), ref) < normal_equations_tolerance(kappa, torch.float32)
    assert relative_error(w64, ref) < normal_equations_tolerance(kappa)


def test_one_solve_gamma0_matches_lstsq_ill_conditioned():
    x, y = synthetic_features(2000, D, C, "ill_conditioned", seed=3, condition=1e8)
    parts = np.array_split(np.arange(2000), 100)  # 20 samples per client < d
    res = afl.run_afl(x, y, parts, C, gamma=0.0, server="one_solve")
    assert relative_error(res.weights, lstsq(x, y)) < normal_equations_tolerance(1e8)


# ---- rank handling of ridge_solve / gram_report ----------------------------------------------------
def test_tiny_live_feature_keeps_its_weight(data):
    """A live column scaled by 1e-8 is not 'dead': its weight scales by 1e8, as lstsq says."""
    x, y, _ = data
    xs = x.copy()
    xs[:, 3] *= 1e-8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = ridge_fit(xs, y, C, 0.0)
    ref = lstsq(xs, y)
    assert float(ref[3].abs().max()) > 1e6
    assert relative_error(w, ref) < 1e-6


def test_duplicated_column_warns_and_returns_min_norm(data):
    x, y, _ = data
    xd = np.hstack([x, x[:, :1]])
    with pytest.warns(RuntimeWarning, match="rank 24 of 25"):
        w = ridge_fit(xd, y, C, 0.0)
    ref = lstsq(xd, y)  # minimum-norm: splits the weight equally over the two copies
    assert relative_error(w, ref) < 1e-8
    torch.testing.assert_close(w[0], w[-1])
    report = gram_report(SufficientStats.from_data(xd, y, C).gram)
    assert report["rank"] == D and report["condition number"] == float("inf")


def test_dead_features_get_zero_weight_without_warning(data):
    x, y, w_ref = data
    xz = np.hstack([x, np.zeros((N, 2))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = ridge_fit(xz, y, C, 0.0)
        res = afl.run_afl(xz, y, make_partition(y, 40, "iid", seed=0), C, gamma=1.0)
    assert float(w[D:].abs().max()) == 0.0 and float(res.weights[D:].abs().max()) == 0.0
    assert relative_error(w[:D], w_ref) < 1e-10 and relative_error(res.weights[:D], w_ref) < 1e-10
    report = gram_report(SufficientStats.from_data(xz, y, C).gram)
    assert report["zero features"] == 2 and report["rank"] == D and report["condition number"] > 0


def test_pairwise_gamma0_rank_deficient_clear_error(data):
    x, y, _ = data
    parts = np.array_split(np.arange(N), 100)  # N_k = 15 < d = 24
    with pytest.raises(ValueError, match="gamma > 0.*one_solve"):
        afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise")


def test_rcond_validated():
    with pytest.raises(ValueError, match="rcond"):
        ridge_solve(torch.eye(2, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64), rcond=2.0)


def test_pairwise_gamma0_fails_before_any_client_work(data, monkeypatch):
    x, y, _ = data
    calls = []
    monkeypatch.setattr(afl, "client_update", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="N_k < d"):
        afl.run_afl(x, y, np.array_split(np.arange(N), 100), C, gamma=0.0, server="pairwise")
    assert not calls


def test_pairwise_gamma0_collinear_client_clear_error(data):
    """N_k >= d but a duplicated feature: C_k is singular although Cholesky may pass on round-off."""
    x, y, _ = data
    xd = np.hstack([x, x[:, :1]])
    with pytest.raises(ValueError, match="numerical rank 24 < d = 25"):
        afl.run_afl(xd, y, np.array_split(np.arange(N), 2), C, gamma=0.0, server="pairwise")


# ----------------------------------------------------------------------------------------------
# the one protocol: AFLClient + servers driven by simulate(), measured cost
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
def test_run_afl_cost_is_measured_and_nothing_is_broadcast(data, server):
    from fedlib.core.protocol import EMPTY

    x, y, _ = data
    parts = make_partition(y, 6, "iid", seed=0)
    res = afl.run_afl(x, y, parts, C, gamma=1.0, server=server)
    # each client: W (d, C), the upper triangle of C (d(d+1)/2 numbers), gamma; float64
    assert res.cost.bytes_up == sum(res.upload_bytes) == 6 * ((D * (D + 1) // 2 + D * C) * 8 + 8) == res.total_upload_bytes
    assert res.cost.bytes_down == 0 and afl.make_server(server).broadcast() is EMPTY
    assert res.cost.seconds >= res.server_seconds > 0
    paper = afl.run_afl(x, y, parts, C, gamma=1.0, server=server, packed=False)   # full C (d, d)
    assert paper.cost.bytes_up == 6 * ((D * D + D * C) * 8 + 8)
    assert paper.cost.bytes_up - res.cost.bytes_up == 6 * D * (D - 1) // 2 * 8


def test_server_seconds_count_the_final_solve_once():
    """The server's share of the seconds is absorb + solve + restoration, each once, and never more
    than the run's seconds (the final solve was counted twice, which made it exceed them at random)."""
    from fedlib.core.messages import Cost

    class SlowSolve:
        seconds, count, gamma_sum, upload_bytes = 0.0, 1, 0.0, []

        def result(self):
            t0 = time.perf_counter()
            time.sleep(0.2)
            self.seconds += time.perf_counter() - t0
            return torch.eye(2), torch.eye(2)

    res = afl._finish(SlowSolve(), restore=False, cost=Cost())
    assert 0.2 <= res.server_seconds <= res.cost.seconds < 0.35


def test_client_program_step_equals_client_update(data):
    x, y, _ = data
    client = afl.AFLClient(C, gamma=2.0)
    state = client.init_state(3)
    msg = client.step((x[:50], y[:50]), state, afl.make_server().broadcast())
    ref = afl.client_update(x[:50], y[:50], C, gamma=2.0, client="client3")
    assert msg.sender == "client3" and torch.equal(msg["W"], ref["W"]) and torch.equal(msg["C_packed"], ref["C_packed"])
    paper = afl.AFLClient(C, gamma=2.0, packed=False).step((x[:50], y[:50]), state, afl.make_server().broadcast())
    assert torch.equal(paper["C"], afl.client_update(x[:50], y[:50], C, gamma=2.0, packed=False)["C"])


@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
def test_receive_of_a_list_equals_one_by_one(data, server):
    x, y, _ = data
    uploads = [afl.client_update(x[p], y[p], C) for p in np.array_split(np.arange(N), 4)]
    together, apart = afl.make_server(server), afl.make_server(server)
    together.receive(uploads)
    for u in uploads:
        apart.receive([u])
    assert together.count == apart.count == 4 and together.gamma_sum == 4.0
    torch.testing.assert_close(together.result()[0], apart.result()[0], rtol=0, atol=0)


def test_aggregate_of_uploads_equals_run_afl(data):
    x, y, _ = data
    parts = make_partition(y, 5, "dirichlet", alpha=0.5, seed=2)
    uploads = [afl.client_update(x[p], y[p], C) for p in parts]
    res = afl.aggregate(uploads)
    assert torch.equal(res.weights, afl.run_afl(x, y, parts, C).weights)
    assert res.cost.bytes_up == sum(u.nbytes for u in uploads)


def test_benchmark_helpers(data):
    import pandas as pd

    _, y, _ = data
    parts = afl_studies.SettingPartitions(y)
    first = parts(("alpha", 0.5), 10, 0)
    assert parts(("alpha", 0.5), 10, 0) is first and sum(len(p) for p in first) == N
    assert sum(len(p) for p in parts(("shards", 2), 10, 0)) == N and len(parts(("iid", None), 7, 1)) == 7
    assert [afl_studies.setting_label(s) for s in [("alpha", 0.1), ("shards", 2), ("iid", None)]] == ["α=0.1", "s=2", "IID"]
    with pytest.raises(ValueError, match="unknown setting kind 'beta'"):
        parts(("beta", 1.0), 10, 0)
    frame = pd.DataFrame({"setting": ["a"] * 3 + ["b"], "method": ["m"] * 4, "seed": [2, 0, 1, 0],
                          "accuracy": [0.2, 0.0, 0.1, 0.9]})
    np.testing.assert_array_equal(afl_studies.seed_ordered_accuracies(frame, "a", "m"), [0.0, 0.1, 0.2])


def test_run_baselines_measures_the_per_round_upload(data):
    x, y, _ = data
    xt, yt = torch.from_numpy(x[:200]).float(), torch.from_numpy(y[:200])
    parts = afl_studies.SettingPartitions(y)
    config = dict(rounds=2, local_epochs=1, batch_size=32, lr=0.05, device="cpu", eval_every=1)
    runs, curves = afl_studies.run_baselines("t", [(("iid", None), "fedavg", 0, 0)], parts, 4,
                                     (torch.from_numpy(x).float(), torch.from_numpy(y)), (xt, yt), C, config,
                                     progress=False)
    head = (D * C + C) * 4   # a float32 linear head with bias (+ what the method adds, e.g. the sample count)
    assert head <= runs.loc[0, "upload bytes/client/round"] <= head + 64
    assert list(curves.method.unique()) == ["fedavg"] and 0 <= runs.loc[0, "accuracy"] <= 1


def test_qr_reference_equals_lstsq_and_zeroes_dead_columns(data):
    from fedlib.core.linalg import qr_reference

    x, y, w_joint = data
    assert relative_error(qr_reference(x, y, C), w_joint) < 1e-10
    dead = np.hstack([x, np.zeros((N, 1))])
    w = qr_reference(dead, y, C)
    assert float(w[-1].abs().max()) == 0.0 and relative_error(w[:-1], w_joint) < 1e-10


def test_lstsq_reference_with_lam_is_ridge(data):
    from fedlib.core.linalg import lstsq_reference

    x, y, _ = data
    expected = np.linalg.solve(x.T @ x + 4.0 * np.eye(D), x.T @ np.eye(C)[y])
    np.testing.assert_allclose(lstsq_reference(x, y, C, lam=4.0).numpy(), expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
        lstsq_reference(x, y, C, lam=-1.0)


def test_table1_recipe_breaks_without_ri_only_when_clients_are_rank_deficient():
    x, y = synthetic_features(400, 16, 3, "gaussian", seed=0)
    ref = torch.from_numpy(np.linalg.lstsq(x, np.eye(3)[y], rcond=None)[0])
    table = afl_studies.table1_deviations(x, y, 3, [2, 10, 40], ref)
    assert list(table.index) == [2, 10, 40] and list(table["N_k"]) == [200, 40, 10]
    assert (table["ΔW w/ RI (ours)"] < 1e-8).all()
    assert table.loc[2, "ΔW w/o RI (ours)"] < 1e-8 and table.loc[40, "ΔW w/o RI (ours)"] > 1e-3


# ----------------------------------------------------------------------------------------------
# packed uploads (upper triangle of C_k^r) against the paper's full C_k^r
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
@pytest.mark.parametrize("gamma", [1.0, 0.0])
def test_packed_and_full_uploads_give_the_same_head(data, server, gamma):
    x, y, w_joint = data
    if server == "pairwise" and gamma == 0:
        parts = np.array_split(np.arange(N), 3)   # N_k >= d: C_k invertible
    else:
        parts = make_partition(y, 12, "dirichlet", alpha=0.5, seed=4)
    packed = afl.run_afl(x, y, parts, C, gamma=gamma, server=server)
    full = afl.run_afl(x, y, parts, C, gamma=gamma, server=server, packed=False)
    assert relative_error(packed.weights, full.weights) < 1e-12
    assert relative_error(packed.weights_regularized, full.weights_regularized) < 1e-12
    assert relative_error(packed.weights, w_joint) < (1e-10 if server == "one_solve" else 1e-7)
    assert torch.equal(packed.gram_regularized, packed.gram_regularized.T)


def test_one_solve_server_packed_sums_equal_the_full_ones(data, monkeypatch):
    """The one-pass packed product (compiled kernel) gives the sums of the paper's form, sum_k C_k and
    sum_k C_k W_k, to round-off; a mixed round equals both; the torch fallback (no numba, or a GPU)
    equals the kernels for both forms."""
    x, y, _ = data
    parts = make_partition(y, 9, "iid", seed=1)
    full = [afl.client_update(x[p], y[p], C, packed=False) for p in parts]
    packed = [afl.client_update(x[p], y[p], C) for p in parts]
    ref = afl.OneSolveServer()
    ref.receive(full)
    srv = afl.OneSolveServer()
    srv.receive(packed)
    sym = ref.gram.triu() + ref.gram.triu(1).T   # the packed form keeps the upper triangle
    assert float((srv.gram - sym).abs().max()) <= 1e-12 * float(sym.abs().max())
    assert relative_error(srv.rhs, ref.rhs) < 1e-12
    expected = sum(u["C"] @ u["W"] for u in full)
    assert relative_error(ref.rhs, expected) < 1e-12 and torch.equal(ref.gram, sum(u["C"] for u in full))
    mixed = afl.OneSolveServer()
    mixed.receive([u if k % 2 else f for k, (u, f) in enumerate(zip(packed, full))])
    assert relative_error(mixed.result()[0], ref.result()[0]) < 1e-12 and mixed.count == 9
    monkeypatch.setattr(afl_speed, "_KERNELS", {"packed": None, "full": None})   # as without numba, or on a GPU
    for uploads, kernel_server in [(packed, srv), (full, ref)]:
        fallback = afl.OneSolveServer()
        fallback.receive(uploads)
        assert relative_error(fallback.rhs, kernel_server.rhs) < 1e-12 and torch.equal(fallback.gram, kernel_server.gram)


@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
@pytest.mark.parametrize("packed", [True, False])
def test_statistics_upload_gives_the_same_head_and_bytes(data, server, packed):
    """statistics=True uploads B_k = X_k^T Y_k in place of W_k^r: the same bytes, the same head (against the
    joint least-squares head from numpy lstsq), the one-solve server's sums equal sum_k C_k and sum_k X_k^T Y_k;
    a round may mix both kinds of upload."""
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 3) if server == "pairwise" else make_partition(y, 12, "dirichlet",
                                                                                          alpha=0.5, seed=4)
    stats = afl.run_afl(x, y, parts, C, gamma=1.0, server=server, packed=packed, statistics=True)
    heads = afl.run_afl(x, y, parts, C, gamma=1.0, server=server, packed=packed)
    assert relative_error(stats.weights, heads.weights) < 1e-10
    assert relative_error(stats.weights, w_joint) < (1e-10 if server == "one_solve" else 1e-7)
    assert stats.upload_bytes == heads.upload_bytes
    uploads = [afl.client_update(x[p], y[p], C, packed=packed, statistics=True) for p in parts]
    assert all("W" not in u.payload for u in uploads)
    targets = np.eye(C)[y]
    for u, p in zip(uploads, parts):
        np.testing.assert_allclose(u["B"].numpy(), x[p].T @ targets[p], rtol=1e-12, atol=1e-12)
    if server == "one_solve":
        srv = afl.OneSolveServer()
        srv.receive(uploads)
        np.testing.assert_allclose(srv.rhs.numpy(), x[np.concatenate(parts)].T @ targets[np.concatenate(parts)],
                                   rtol=1e-12, atol=1e-10)
        mixed = afl.aggregate([u if k % 2 else afl.client_update(x[p], y[p], C, packed=packed)
                               for k, (u, p) in enumerate(zip(uploads, parts))])
        assert relative_error(mixed.weights, heads.weights) < 1e-10


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_solve_server_threads_split_the_work_exactly(data, threads):
    """Threads own disjoint classes / rows: the sums do not depend on the thread count beyond round-off
    and are bit-identical from run to run."""
    x, y, _ = data
    parts = make_partition(y, 4, "iid", seed=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [afl.aggregate([afl.client_update(x[p], y[p], C, packed=pk) for p in parts]) for pk in (True, False)]
        torch.set_num_threads(threads)
        many = [afl.aggregate([afl.client_update(x[p], y[p], C, packed=pk) for p in parts]) for pk in (True, False)]
        again = [afl.aggregate([afl.client_update(x[p], y[p], C, packed=pk) for p in parts]) for pk in (True, False)]
    finally:
        torch.set_num_threads(before)
    for a, b, c in zip(one, many, again):
        assert relative_error(a.weights, b.weights) < 1e-12 and torch.equal(b.weights, c.weights)


def test_one_solve_packed_float32_uploads(data):
    x, y, _ = data
    parts = make_partition(y, 5, "iid", seed=0)
    w32 = afl.run_afl(x, y, parts, C, dtype=torch.float32).weights
    w32_full = afl.run_afl(x, y, parts, C, dtype=torch.float32, packed=False).weights
    assert w32.dtype == torch.float32 and relative_error(w32.double(), w32_full.double()) < 1e-5


@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
def test_malformed_upload_is_refused_with_a_clear_error(data, server):
    from fedlib.core.messages import Message

    x, y, _ = data
    good = afl.client_update(x[:100], y[:100], C)
    short = Message("client7", {"W": good["W"], "C_packed": good["C_packed"][:-1], "gamma": 1.0})
    with pytest.raises(ValueError, match=r"refused AFL upload from 'client7': entry 'C_packed' has shape \(299,\), "
                                         r"expected \(300,\)"):
        afl.make_server(server).receive([short])
    full = afl.client_update(x[:100], y[:100], C, packed=False)
    both = Message("c", {"W": good["W"], "C_packed": good["C_packed"], "C": full["C"], "gamma": 1.0})
    with pytest.raises(ValueError, match="unexpected 'C(_packed)?'"):
        afl.aggregate([good, both], server=server)
    wrong = Message("c", {"W": good["W"], "C": full["C"][:, :-1], "gamma": 1.0})
    with pytest.raises(ValueError, match=r"entry 'C' has shape \(24, 23\), expected \(24, 24\)"):
        afl.aggregate([wrong], server=server)
    stats = afl.client_update(x[:100], y[:100], C, statistics=True)
    for payload, why in (({"W": good["W"], "B": stats["B"], "C_packed": good["C_packed"], "gamma": 1.0}, "unexpected"),
                         ({"C_packed": good["C_packed"], "gamma": 1.0}, "missing 'W'"),
                         ({"B": stats["B"][0], "C_packed": good["C_packed"], "gamma": 1.0},
                          r"entry 'B' has shape \(5,\), expected \(d, C\)")):
        with pytest.raises(ValueError, match=why):
            afl.aggregate([Message("c", payload)], server=server)


def test_ri_ablation_heads_from_one_aggregate_equal_full_runs():
    """ri_ablation's shortcut: the server state at gamma from the run at gamma_0 (C^r + K (gamma - gamma_0) I,
    the same B) gives the same heads as the protocol re-run at gamma, before and after RI (eq. 15)."""
    g = np.random.RandomState(3)
    x, labels = g.randn(400, 12), g.randint(0, 4, 400)
    parts = np.array_split(g.permutation(400), 7)
    base = afl.run_afl(x, labels, parts, 4, gamma=0.0)
    rhs = base.gram_regularized @ base.weights_regularized
    for gamma in (0.5, 20.0):
        full = afl.run_afl(x, labels, parts, 4, gamma=gamma)
        gram = base.gram_regularized + 7 * gamma * torch.eye(12, dtype=torch.float64)
        w_r = ridge_solve(gram, rhs)
        assert relative_error(w_r, full.weights_regularized) < 1e-10
        assert relative_error(afl.ri_restore(w_r, gram, 7 * gamma), full.weights) < 1e-10


@pytest.mark.parametrize("method", ["fedavg", "feddisco"])
def test_per_round_upload_with_one_round_and_sparse_evaluation(data, method):
    """rounds=1 (one record: the increment is counted from the start, less FedDisco's setup uploads)
    and eval_every > 1 (records several rounds apart) give the per-round upload of every round."""
    x, y, _ = data
    xt, yt = torch.from_numpy(x[:200]).float(), torch.from_numpy(y[:200])
    parts = afl_studies.SettingPartitions(y)
    train = (torch.from_numpy(x).float(), torch.from_numpy(y))
    per_round = {}
    for rounds, every in [(1, 1), (3, 1), (3, 2), (4, 3)]:
        config = dict(rounds=rounds, local_epochs=1, batch_size=32, lr=0.05, device="cpu", eval_every=every)
        runs, _ = afl_studies.run_baselines("t", [(("iid", None), method, 0, 0)], parts, 4, train, (xt, yt), C, config,
                                    progress=False)
        per_round[(rounds, every)] = runs.loc[0, "upload bytes/client/round"]
    head = (D * C + C) * 4
    assert head <= per_round[(1, 1)] <= head + 64
    assert len(set(per_round.values())) == 1, per_round


def test_packed_gram_equals_the_packed_product(data, monkeypatch):
    """A client's packed upload formed block by block of the triangle (afl_speed.packed_gram) is the packed
    BLAS product to round-off, for sizes around the block width, and the same upload as the full C."""
    x, y, _ = data
    for n in (1, 5, 23, 150):
        xt = torch.from_numpy(x[:n])
        for dim in (D, 3, afl_speed._GRAM_BLOCK + 5):
            xd = torch.randn(n, dim, dtype=torch.float64)
            expected = afl_speed.pack_symmetric(xd.T @ xd, shift=0.5)
            got = afl_speed.packed_gram(xd, shift=0.5)
            assert float((got - expected).abs().max()) <= 1e-13 * float(expected.abs().max()), (n, dim)
        packed, full = (afl.client_update(x[:n], y[:n], C, gamma=0.5, packed=pk) for pk in (True, False))
        assert relative_error(afl.upload_gram(packed), full["C"]) < 1e-14 and torch.equal(packed["W"], full["W"])
    monkeypatch.setattr(afl_speed, "_KERNELS", {"packed": None, "full": None})   # without numba: the product, packed
    assert torch.equal(afl_speed.packed_gram(xt, 0.5), afl_speed.pack_symmetric(xt.T @ xt, 0.5))


def test_baselines_in_forked_workers_equal_the_runs_one_by_one(data):
    """run_baselines with workers=2 (RunCache.federated_many through fork_map) gives the same
    histories and final weights as one process, for every method kind (MOON's head included);
    a repeated job is a cache hit in both."""
    import pandas as pd

    x, y, _ = data
    train = torch.from_numpy(x).float(), torch.from_numpy(y)
    test = torch.from_numpy(x[:200]).float(), torch.from_numpy(y[:200])
    parts = afl_studies.SettingPartitions(y)
    config = dict(rounds=2, local_epochs=1, batch_size=32, lr=0.05, device="cpu", eval_every=1, batched_clients=True)
    jobs = [(("alpha", 0.5), m, s, 0) for m in ("fedavg", "moon", "fedprox") for s in (0, 1)]
    jobs.append(jobs[0])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the workers' setting (fedlib.core.parallel): the same kernels in both
    try:
        caches = [afl_studies.RunCache(), afl_studies.RunCache()]
        one, _ = afl_studies.run_baselines("t", jobs, parts, 5, train, test, C, config, moon_hidden=8, progress=False,
                                   cache=caches[0])
        two, _ = afl_studies.run_baselines("t", jobs, parts, 5, train, test, C, config, moon_hidden=8, progress=False,
                                   cache=caches[1], workers=2)
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(one.drop(columns=[c for c in one if "seconds" in c]),
                                  two.drop(columns=[c for c in two if "seconds" in c]))
    assert caches[0].hits == caches[1].hits == 1
    h1 = [caches[0].federated(m, parts(st, 5, ps), s, config, 8, train, test, C) for st, m, s, ps in jobs]
    h2 = [caches[1].federated(m, parts(st, 5, ps), s, config, 8, train, test, C) for st, m, s, ps in jobs]
    for a, b in zip(h1, h2):
        assert a.test_acc == b.test_acc
        for k in a.final_state:
            assert torch.equal(a.final_state[k], b.final_state[k])


def test_numpy_references_run_on_one_blas_thread(data, monkeypatch):
    """The QR and lstsq references limit NumPy's BLAS to one thread (its threads busy-wait beside
    another chapter: the afl_beyond QR cell took 25.6 s instead of about 3 s)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from fedlib.core import linalg

    seen = []

    def spy(f):
        def wrapped(*args, **kwargs):
            seen.append({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
            return f(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(np.linalg, "qr", spy(np.linalg.qr))
    monkeypatch.setattr(np.linalg, "lstsq", spy(np.linalg.lstsq))
    x, y, _ = data
    with threadpool_limits(limits=2, user_api="blas"):   # what a kernel gets on 2 cores
        linalg.qr_reference(x, y, C)
        linalg.lstsq_reference(x, y, C)
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {2}   # restored
    assert seen == [{1}, {1}]


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("statistics", [True, False])
def test_the_one_pass_server_equals_the_readable_one(data, packed, statistics):
    """fedlib.afl.speed (packed uploads, compiled one-pass sums) against the server as the paper writes it
    (fast=False: sum_k C_k^r and sum_k C_k^r W_k^r by torch): the same sums and heads to round-off."""
    x, y, w_joint = data
    parts = make_partition(y, 7, "dirichlet", alpha=0.5, seed=2)
    fast = afl.run_afl(x, y, parts, C, packed=packed, statistics=statistics)
    plain = afl.run_afl(x, y, parts, C, packed=packed, statistics=statistics, fast=False)
    assert relative_error(fast.gram_regularized, plain.gram_regularized) < 1e-14
    assert relative_error(fast.weights_regularized, plain.weights_regularized) < 1e-12
    assert relative_error(plain.weights, w_joint) < 1e-10
