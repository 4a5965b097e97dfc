"""Tests for fedlib.refed.theory (Lemma 1 and Theorem 3.1 on quadratics), each against an
independent reference: optimality conditions, finite differences, gradient-descent iterations,
Monte Carlo simulation, and the closed-form floors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.core.persample import last_layer_grad_sq_norms, reference_grad_sq_norms
from fedlib.federated.gradient import LinearHead
from fedlib.federated.models import MODEL_NAMES, SmallCNN, SmallResNet, make_model
from fedlib.refed.algorithm import q_lambda, train_pim
from fedlib.refed.theory import (Quadratic, exact_pim, g_rate, prototype_images, random_quadratic,
                                        repaired_schedule)

DIM, MU, L = 6, 0.5, 2.0
SIGMA, G0 = 0.5, 1.0


@pytest.fixture(scope="module")
def quad():
    return random_quadratic(np.random.default_rng(0), DIM, MU, L)


def test_random_quadratic_draws_in_order_and_is_valid(quad):
    r = np.random.default_rng(0)
    Q, _ = np.linalg.qr(r.standard_normal((DIM, DIM)))
    a = r.standard_normal(DIM)
    w = a + 0.5 * r.standard_normal(DIM)
    assert np.array_equal(quad.Q, Q) and np.array_equal(quad.a, a) and np.array_equal(quad.w_hat, w)
    assert np.allclose(quad.Q.T @ quad.Q, np.eye(DIM), atol=1e-12)
    assert quad.mu == MU and quad.h.max() == L
    assert np.allclose(np.linalg.eigvalsh(quad.H), np.sort(quad.h), atol=1e-12)
    assert np.allclose(quad.Q @ quad.c, quad.a - quad.w_hat)
    with pytest.raises(ValueError, match="dim"):
        random_quadratic(np.random.default_rng(0), 0, MU, L)
    with pytest.raises(ValueError, match="L"):
        random_quadratic(np.random.default_rng(0), DIM, MU, MU / 2)


def test_g_rate():
    t = np.arange(10)
    assert np.allclose(g_rate(t, 2.0), 2.0 / np.sqrt(t + 1))
    assert np.allclose(g_rate(t, 1.0, t0=4.0), np.sqrt(4.0 / (t + 4.0)))
    assert g_rate(0, 3.0, t0=7.0) == 3.0


def test_pim_satisfies_the_optimality_condition_and_its_limits(quad):
    for lam in [0.05, 0.3, 0.9]:
        q = q_lambda(lam)
        v = quad.pim(lam)
        # grad f(v) + q (v - w_hat) = 0 (Definition 1, Eq. 10)
        assert np.abs(quad.H @ (v - quad.a) + q * (v - quad.w_hat)).max() < 1e-12
        dist, loss = quad.dist_loss(lam)
        assert dist == pytest.approx(float(((v - quad.w_hat) ** 2).sum()))
        assert loss == pytest.approx(0.5 * float((v - quad.a) @ quad.H @ (v - quad.a)))
    w = quad.w_hat + 1.0
    v = quad.pim(0.5, w=w)
    assert np.abs(quad.H @ (v - quad.a) + q_lambda(0.5) * (v - w)).max() < 1e-12
    assert np.linalg.norm(quad.pim(1e-7) - quad.w_hat) < 1e-5       # lam -> 0: the global optimum
    assert np.linalg.norm(quad.pim(1 - 1e-7) - quad.a) < 1e-5        # lam -> 1: the local optimum


def test_lemma1_derivatives_match_finite_differences(quad):
    lams = np.linspace(0.05, 0.95, 19)
    ddist, dloss = quad.lemma1_derivatives(lams)
    eps = 1e-6
    fd = np.array([[(a - b) / (2 * eps) for a, b in zip(quad.dist_loss(l + eps), quad.dist_loss(l - eps))]
                   for l in lams])
    assert np.abs(fd[:, 0] - ddist).max() / np.abs(ddist).max() < 1e-6
    assert np.abs(fd[:, 1] - dloss).max() / np.abs(dloss).max() < 1e-6
    assert (ddist >= 0).all() and (dloss <= 0).all()
    q = np.array([q_lambda(l) for l in lams])
    assert np.allclose(dloss, -q / 2 * ddist)   # the envelope identity


def test_s_step_pim_closed_form_equals_gradient_descent(quad):
    eta = 0.4
    for lam in [0.3, 0.6, 0.9]:
        for s in [0, 1, 3, 25]:
            assert np.abs(quad.pim_steps(lam, s, eta) - quad.pim_steps_closed(lam, s, eta)).max() < 1e-12
    # s = 1: independent of lambda (the proximal gradient vanishes at v_0 = w_hat)
    assert np.allclose(quad.pim_steps(0.2, 1, eta), quad.pim_steps(0.8, 1, eta))
    # many stable steps converge to the exact PIM
    assert np.abs(quad.pim_steps_closed(0.5, 2000, 0.2) - quad.pim(0.5)).max() < 1e-10


def test_exact_error_matches_monte_carlo(quad):
    lam, A, T, reps = 0.8, 2 * G0, 60, 4000
    for Lx in [1.0, 4.0]:
        q4 = quad.with_spectrum(np.linspace(MU, Lx, DIM))
        err, lemma2, C = q4.exact_error(lam, A, sigma=SIGMA, g0=G0, horizon=T)
        assert err.shape == (T + 1,) and lemma2.shape == (T,)
        assert err[0] == pytest.approx(float(((q4.w_hat - q4.pim(lam)) ** 2).sum()))
        mc = q4.monte_carlo_error(lam, A, sigma=SIGMA, g0=G0, horizon=T, reps=reps, rng=np.random.default_rng(1))
        assert mc.shape == (T + 1, reps)
        se = mc.std(1, ddof=1) / np.sqrt(reps)
        z = np.abs(mc.mean(1)[1:] - err[1:]) / se[1:]
        assert z.max() < 5.0
        # the tolerance can fail: a recursion off by 10 % is rejected
        assert (np.abs(mc.mean(1)[1:] - 1.1 * err[1:]) / se[1:]).max() > 5.0


def test_exact_error_constants_follow_eq15(quad):
    lam, A = 0.5, 2 * G0
    q = q_lambda(lam)
    err, lemma2, C = quad.exact_error(lam, A, sigma=SIGMA, g0=G0, horizon=50)
    M = np.linalg.norm(quad.a - quad.w_hat)
    bc = SIGMA + q * (M + SIGMA / MU)
    B0 = bc ** 2 + q ** 2 * G0 + 2 * q * np.sqrt(G0) * bc
    assert quad.eq15_B(lam, SIGMA, G0) == pytest.approx(B0)
    assert C == pytest.approx(max(err[0] / G0, 16.0, 4 * B0 / (A * (MU + q) ** 2 * (1 - 1 / (1 + MU / q)))))
    # L <= 2 mu: Lemma 2 (Eq. 13) holds at every round
    assert lemma2.max() <= 1.0
    # and it fails for a wide spectrum (L = 4, mu = 0.5) at the first round
    _, lemma2_wide, _ = quad.with_spectrum(np.linspace(MU, 4.0, DIM)).exact_error(0.8, A, sigma=SIGMA, g0=G0,
                                                                                    horizon=5)
    assert lemma2_wide.max() > 1.0
    g = g_rate(np.arange(20), G0)
    printed, corrected = quad.eq14(lam, A, C, sigma=SIGMA, g=g)
    assert np.allclose(printed - corrected, 4 * q * np.sqrt(C) * (g - g ** 2) / (A * (MU + q)))
    with pytest.raises(ValueError, match="A"):
        quad.exact_error(lam, 0.0, sigma=SIGMA, g0=G0, horizon=5)


def test_repaired_schedule_meets_both_conditions():
    for Lx, lam in [(1.0, 0.2), (4.0, 0.8), (4.0, 0.2)]:
        A, t0 = repaired_schedule(Lx, MU, lam, G0)
        q = q_lambda(lam)
        assert 2 * G0 / (A * (MU + q)) * (Lx + q) <= 1 + 1e-12              # eta_0 (L + q) <= 1
        g = g_rate(np.arange(2000), G0, t0)
        assert np.all(A * (g[:-1] - g[1:]) <= g[:-1] ** 2 * (1 + 1e-12))  # the rate condition
        if t0 > 1:   # the smallest t0 of the grid
            assert G0 ** 2 < A * (G0 - g_rate(1, G0, t0 / 1.25))


def test_constant_step_curve_reaches_the_floor_formula(quad):
    zeta = np.random.default_rng(3).standard_normal(DIM)
    lam, eta = 0.5, 0.1
    curve, bias, variance = quad.constant_step(lam, zeta, eta=eta, sigma=SIGMA, steps=3000)
    assert curve[0] == pytest.approx(float(((quad.w_hat + zeta - quad.pim(lam)) ** 2).sum()))
    # bias = ||v_hat(w) - v_hat(w_hat)||^2 (independent: two linear solves)
    assert bias == pytest.approx(float(((quad.pim(lam, w=quad.w_hat + zeta) - quad.pim(lam)) ** 2).sum()))
    assert curve[-1] == pytest.approx(bias + variance, rel=1e-9)
    # Monte Carlo of the noisy iteration at a few steps
    r, reps = np.random.default_rng(4), 4000
    q, H, w = q_lambda(lam), quad.H, quad.w_hat + zeta
    v = np.tile(w, (reps, 1))
    for s in range(40):
        v = v - eta * ((v - quad.a) @ H + SIGMA / np.sqrt(DIM) * r.standard_normal((reps, DIM)) + q * (v - w))
    sq = ((v - quad.pim(lam)) ** 2).sum(1)
    assert abs(sq.mean() - curve[40]) < 5 * sq.std(ddof=1) / np.sqrt(reps)


def test_exact_pim_is_the_minimiser_and_train_pim_reaches_it():
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (60,), generator=gen)
    x = 2 * torch.randn(3, 4, generator=gen, dtype=torch.float64)[y] + torch.randn(60, 4, generator=gen,
                                                                                  dtype=torch.float64)
    torch.manual_seed(0)
    w = LinearHead(4, 3).double()
    before = [p.detach().clone() for p in w.parameters()]
    dists = []
    for lam in [0.3, 0.7]:
        v, dist, loss = exact_pim(w, x, y, lam)
        q = q_lambda(lam)
        obj = F.cross_entropy(v(x), y) + 0.5 * q * sum(((p - p0) ** 2).sum() for p, p0 in zip(v.parameters(), before))
        grads = torch.autograd.grad(obj, list(v.parameters()))
        assert max(float(g.abs().max()) for g in grads) < 1e-8
        with torch.no_grad():
            assert loss == pytest.approx(float(F.cross_entropy(v(x), y)))
        res = train_pim(w, x, y, 3, lam=lam, epochs=800, lr=0.25, batch_size=60, grad_norm="last_layer")
        assert res.dist_sq == pytest.approx(dist, rel=1e-3)
        dists.append(dist)
    assert dists[0] < dists[1]                                               # Lemma 1
    assert all(torch.equal(a, b) for a, b in zip(before, w.parameters()))   # w untouched


def test_prototype_images():
    protos = np.arange(3 * 1 * 2 * 2, dtype=np.float32).reshape(3, 1, 2, 2)
    x, y = prototype_images(protos, 500, np.random.default_rng(0))
    assert x.shape == (1500, 1, 2, 2) and x.dtype == np.float32
    assert y.tolist() == [0] * 500 + [1] * 500 + [2] * 500
    assert np.abs(x[y == 2].mean(0) - protos[2]).max() < 0.2
    r = np.random.default_rng(0)
    assert np.array_equal(x, protos[y] + r.standard_normal((1500, 1, 2, 2)).astype(np.float32))


def test_last_layer_closed_form_in_the_models_precision():
    torch.manual_seed(0)
    model = SmallCNN(1, 5, 8, width=2, hidden=6).double()
    x = torch.randn(9, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 3, (9,))
    names = ["classifier.weight", "classifier.bias"]
    loop = reference_grad_sq_norms(model, x, y, 3, names)
    exact = last_layer_grad_sq_norms(model, x, y, 3, dtype=None)
    assert exact.dtype == torch.float64 and ((exact - loop).abs() / loop.abs()).max() < 1e-10
    default = last_layer_grad_sq_norms(model, x, y, 3)
    assert default.dtype == torch.float32 and ((default.double() - loop).abs() / loop.abs()).max() < 1e-5


def test_make_model():
    torch.manual_seed(0)
    a = make_model("smallcnn", 1, 10, image_size=28, width=4, hidden=8)
    torch.manual_seed(0)
    b = SmallCNN(1, 10, 28, 4, 8)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    r = make_model("resnet18", 3, 10)
    assert isinstance(r, SmallResNet) and sum(p.numel() for p in r.parameters()) == 11_173_962
    assert set(MODEL_NAMES) == {"smallcnn", "resnet18"}
    with pytest.raises(ValueError, match="name"):
        make_model("vgg", 1, 10)


def test_quadratic_is_frozen(quad):
    with pytest.raises(Exception):
        quad.h = np.ones(DIM)
    assert isinstance(quad.with_spectrum(np.ones(DIM)), Quadratic)
