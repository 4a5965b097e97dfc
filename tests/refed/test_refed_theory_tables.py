"""Tests for the chapter tables of fedlib.refed.theory (sections 2-7 of the theory chapter):
each table against a direct computation or a known closed-form value."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.core.persample import grad_sq_norms, reference_grad_sq_norms
from fedlib.federated.gradient import LinearHead
from fedlib.federated.models import SmallCNN
from fedlib.refed.algorithm import q_lambda, train_pim
from fedlib.refed.theory import (adjacent_violations, bn_resnet, closed_form_table, constant_step_table,
                                        eq14_table, finite_step_scan, g_rate, lemma1_scan, limit_ratios,
                                        monte_carlo_z, pim_lambda_scan, rank_agreement,
                                        rate_feasibility, repair_table, softmax_pim_table, softmax_problem,
                                        tail_growth, task1_identity, theorem31_table, vmap_table)

from test_refed_theory import DIM, G0, L, MU, SIGMA, quad  # noqa: F401  (quad: the module fixture)


def test_lemma1_scan(quad):
    lams = np.linspace(0.05, 0.95, 19)
    f = lemma1_scan(quad, lams, eps=1e-6)
    assert list(f["lambda"]) == list(lams) and len(f) == 19
    d, loss = quad.dist_loss(lams[3])
    assert f["dist"][3] == d and f["loss"][3] == loss and f["q"][3] == q_lambda(lams[3])
    assert (f["ddist"] > 0).all() and (f["dloss"] < 0).all()
    assert np.allclose(f["fd ddist"], f["ddist"], rtol=1e-5) and np.allclose(f["fd dloss"], f["dloss"], rtol=1e-5)
    assert np.abs(f["envelope"]).max() < 1e-6 * np.abs(f["fd dloss"]).max()
    assert (np.diff(f["dist"]) > 0).all()


def test_limit_ratios(quad):
    for lam in [1e-6, 1e-3, 0.3, 0.9, 1 - 1e-6]:
        to_global, to_local = limit_ratios(quad, lam)
        assert 0 <= to_global <= 1 and 0 <= to_local <= 1
    q = q_lambda(0.5)
    v = quad.pim(0.5)
    m = np.linalg.norm(quad.a - quad.w_hat)
    assert limit_ratios(quad, 0.5)[0] == pytest.approx(np.linalg.norm(v - quad.w_hat) * q / (L * m), rel=1e-12)
    assert limit_ratios(quad, 0.5)[1] == pytest.approx(np.linalg.norm(v - quad.a) * (MU + q) / (q * m), rel=1e-12)


def test_finite_step_scan(quad):
    lams = np.linspace(0.01, 0.99, 99)
    fin, mono, err = finite_step_scan(quad, lams, [1, 3, 40], eta=0.4)
    assert err < 1e-10
    assert (fin["eta (L+q)"] < 2).all() and fin["eta (L+q)"].max() > 1   # both regimes present
    kept = int((0.4 * (L + np.array([q_lambda(l) for l in lams])) < 2).sum())
    assert len(fin) == 3 * kept and set(mono.s) == {1, 3, 40} and len(mono) == 6
    assert mono[mono.regime == "eta(L+q) <= 1"]["monotone"].all()              # Lemma 1 carries over
    assert np.ptp(fin[fin.s == 1]["dist"]) < 1e-12                             # s = 1: independent of lambda
    v = quad.pim_steps(fin["lambda"].iloc[5], 3, 0.4)
    row = fin[fin.s == 3].iloc[5]
    assert row["dist"] == pytest.approx(((v - quad.w_hat) ** 2).sum(), rel=1e-9)
    # a small step: every lambda in the first regime, monotone for every s
    _, mono_small, _ = finite_step_scan(quad, lams, [2, 5], eta=0.01)
    assert (mono_small[mono_small.regime == "eta(L+q) <= 1"]["lambdas"] > 0).all() and mono_small["monotone"].all()


def test_softmax_problem_and_pim_table():
    x, y, w = softmax_problem(0, 60, dim=5, classes=3)
    x2, y2, w2 = softmax_problem(0, 60, dim=5, classes=3)
    assert x.shape == (60, 5) and x.dtype == torch.float64 and y.max() < 3
    assert torch.equal(x, x2) and torch.equal(y, y2) and all(torch.equal(a, b) for a, b in zip(w.parameters(), w2.parameters()))
    tab = softmax_pim_table(w, x, y, [0.3, 0.7], num_classes=3, epochs=400, lr=0.25)
    assert list(tab["q"]) == [q_lambda(0.3), q_lambda(0.7)]
    assert tab["exact dist"][1] > tab["exact dist"][0] and tab["exact loss"][1] < tab["exact loss"][0]
    assert tab["rel. gap to minimiser"].max() < 1e-3
    assert np.allclose(tab["train_pim dist"], tab["exact dist"], rtol=1e-2)


def test_monte_carlo_z(quad):
    z = monte_carlo_z(quad, [L], 0.5, 2 * G0, sigma=SIGMA, g0=G0, horizon=40, reps=300, seed=0)
    assert 0 < z < 5
    assert monte_carlo_z(quad, [L], 0.5, 2 * G0, sigma=SIGMA, g0=G0, horizon=40, reps=300, seed=0) == z
    assert monte_carlo_z(quad, [L], 0.5, 2 * G0, sigma=SIGMA, g0=G0, horizon=40, reps=300, seed=1) != z


def test_theorem31_table_and_tail_growth(quad):
    thm, curves = theorem31_table(quad, [1.0, 4.0], [0.2, 0.8], 2 * G0, sigma=SIGMA, g0=G0, horizon=200)
    assert len(thm) == 4 and len(curves) == 4 * 201
    err, lemma2, C = quad.with_spectrum(np.linspace(MU, 4.0, DIM)).exact_error(0.8, 2 * G0, sigma=SIGMA, g0=G0, horizon=200)
    row = thm[(thm.L == 4.0) & (thm["lambda"] == 0.8)].iloc[0]
    ratio = err / g_rate(np.arange(201), G0)
    assert row["max ratio"] == ratio.max() and row["paper C"] == C and row["max Lemma 2 LHS/RHS"] == lemma2.max()
    assert row["eta_0 (L+q)"] == pytest.approx((4.0 + q_lambda(0.8)) / (MU + q_lambda(0.8)))
    assert thm[thm.L == 4.0]["max Lemma 2 LHS/RHS"].max() > 1       # Eq. 13 fails for L > 2 mu
    assert tail_growth(curves, 200) == pytest.approx(max(
        c["ratio"].iloc[-1] / c["ratio"].iloc[100] for _, c in curves.groupby(["L", "lambda"])))
    toy = pd.DataFrame({"L": 1.0, "lambda": 0.5, "ratio": np.r_[np.ones(5), 2.0]})
    assert tail_growth(toy, 5) == 2.0


def test_eq14_table(quad):
    thm, _ = theorem31_table(quad, [1.0], [0.5], 2 * G0, sigma=SIGMA, g0=G0, horizon=50)
    alg = eq14_table(quad, thm, 2 * G0, sigma=SIGMA, g0=G0, horizon=50)
    C = thm["paper C"][0]
    g, g1 = g_rate(np.arange(50), G0), g_rate(np.arange(1, 51), G0)
    printed, corrected = quad.eq14(0.5, 2 * G0, C, sigma=SIGMA, g=g)
    assert alg["printed: rounds failing"][0] == int((printed > C * g1).sum()) > 0     # the typo breaks the induction
    assert alg["corrected: max (14)/(C g(t+1))"][0] == pytest.approx((corrected / (C * g1)).max())
    assert alg["corrected: max (14)/(C g(t+1))"][0] <= 1
    assert bool(alg["B(t) <= B(0)"][0])


def test_rate_feasibility():
    tab = rate_feasibility(1.0, 1000, powers=[0.5, 1.0], geometric=0.99).set_index("g(t)")
    assert list(tab.index) == ["g0 (t+1)^-0.5", "g0 (t+1)^-1.0", "g0 0.99^t"]
    assert tab.loc["g0 (t+1)^-0.5", "largest admissible A"] == pytest.approx(1 / (1 - 2 ** -0.5), rel=1e-12)
    assert tab.loc["g0 (t+1)^-1.0", "largest admissible A"] == pytest.approx(1000 / 999, rel=1e-10)  # (t+2)/(t+1) at t = 998
    assert tab.loc["g0 0.99^t", "largest admissible A"] == pytest.approx(0.99 ** 998 / 0.01, rel=1e-9)
    assert list(tab["feasible"]) == [True, False, False] and (tab["needed A >= 2 g(0)"] == 2.0).all()


def test_repair_table(quad):
    rep = repair_table(quad, [1.0, 4.0], [0.2, 0.8], sigma=SIGMA, g0=G0, horizon=300)
    assert len(rep) == 4 and rep["rate condition holds"].all()
    assert rep["max Lemma 2 LHS/RHS"].max() <= 1 and rep["max ratio / C"].max() <= 1
    q = q_lambda(0.2)
    assert rep["A"][0] == pytest.approx(2 * G0 * (1.0 + q) / (MU + q))


def test_constant_step_table(quad):
    zeta = np.random.default_rng(1).standard_normal(DIM)
    const, floors = constant_step_table(quad, [0.2, 0.8], zeta, eta=0.1, sigma=SIGMA, steps=600)
    assert len(const) == 2 * 601 and list(floors["lambda"]) == [0.2, 0.8]
    assert np.allclose(floors["recursion at s=600"], floors["floor (formula)"], rtol=1e-6)
    assert floors["bias"][0] > floors["bias"][1] > 0          # the bias grows with q
    curve, bias, var = quad.constant_step(0.8, zeta, eta=0.1, sigma=SIGMA, steps=600)
    assert np.array_equal(const[const["lambda"] == 0.8]["E||v_s - v_hat||^2"], curve) and floors["variance"][1] == var


class _Kept:
    def __init__(self, weights):
        self.weights = weights


def test_task1_identity_and_adjacent_violations():
    a = {"w": torch.zeros(3)}
    b = {"w": torch.tensor([0.0, 0.5, 0.0])}
    kept = {"refed": _Kept([a, b]), "fedavg": _Kept([a, a]), "fedavg_replay": _Kept([a, b]),
            "refed (memory holds all)": _Kept([a, b]), "fedavg_replay (memory holds all)": _Kept([a, a])}
    ident = task1_identity(kept, 2)
    assert list(ident["refed == fedavg"]) == [True, False] and list(ident["max |refed - fedavg|"]) == [0.0, 0.5]
    assert list(ident["refed == fedavg_replay"]) == [True, True]
    assert list(ident["memory holds all: refed == fedavg_replay"]) == [True, False]
    f = pd.DataFrame({"client": [0, 0, 0, 1, 1, 1], "d": [1, 2, 1.5, 0, 1, 2]})
    assert adjacent_violations(f, "client", "d") == 1 and adjacent_violations(f, "client", "d", increasing=False) == 3


def test_pim_lambda_scan_and_rank_agreement():
    torch.manual_seed(0)
    w = LinearHead(4, 3)
    g = torch.Generator().manual_seed(0)
    pools = [(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (20, 30)]
    dnn = pim_lambda_scan(w, pools, 3, [0.2, 0.8], epochs=3, lr=0.1, batch_size=8)
    assert list(dnn["client"]) == [0, 0, 1, 1] and list(dnn["pool"]) == [20, 20, 30, 30]
    r = train_pim(w, *pools[1], 3, lam=0.8, epochs=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(1))
    assert dnn["||v - w||^2"][3] == r.dist_sq and dnn["pool loss"][3] == r.loss
    assert dnn["||v - w||^2"][1] > dnn["||v - w||^2"][0]
    rank = rank_agreement(w, pools, 3)
    # a linear model is all last layer: the shares are 1 and the rankings agree
    assert list(rank["pool"]) == [20, 30] and np.allclose(rank["max share"], 1.0, atol=1e-5)
    assert np.allclose(rank["Spearman(last layer, all params)"], 1.0)


def test_closed_form_and_vmap_tables():
    torch.manual_seed(0)
    cnn = SmallCNN(1, 6, 8, width=4, hidden=16)
    x = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(10) % 3
    closed = closed_form_table(cnn, x, y, 3, num_classes=6, seed=0)
    assert list(closed["model"]) == ["SmallCNN", "MLP, no bias"] * 2 and list(closed["tolerance"]) == [1e-10, 1e-10, 1e-4, 1e-4]
    assert (closed["identity vs loop"] <= closed["tolerance"]).all()
    assert (closed["fedlib grad_sq_norms(last layer) vs loop"] <= closed["tolerance"]).all()
    assert (closed["fedlib closed form vs loop"] <= 1e-5).all()
    resnet = bn_resnet(6, 0)
    bns = [m for m in resnet.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(m.running_mean.abs().max() <= 0.5 and m.running_var.min() >= 0.5 for m in bns)
    assert any(m.running_mean.abs().max() > 0 for m in bns)
    tab = vmap_table({"cnn": cnn, "resnet": resnet}, x, y, 3, batch_size=7)
    assert len(tab) == 4 and (tab["vmap vs loop"] <= tab["tolerance"]).all()
    assert (tab["ghost vs loop"] <= tab["tolerance"]).all()
    assert tab["params"][0] == sum(p.numel() for p in cnn.parameters())
    m64 = cnn.double()
    ref = reference_grad_sq_norms(m64, x.double(), y, 3)
    assert tab["ghost vs loop"][0] == pytest.approx(
        float((grad_sq_norms(m64, x.double(), y, 3, batch_size=7) - ref).abs().max() / ref.abs().max()), abs=1e-18)
