"""Re-Fed's theory (Li et al., CVPR 2024, Appendix F) on instances where everything is exact.

Used by the chapter ``notebooks/refed_theory.py`` (notes: papers/refed.md, Sec. 3). Notation: q =
q(lam) = (1 - lam) / (2 lam) (Eq. 3, :func:`fedlib.papers.refed.q_lambda`); the PIM objective of
Definition 1 (Eq. 10) is f(v) + (q/2)||v - w||^2.

:class:`Quadratic`       f(v) = 1/2 (v - a)^T H (v - a), H = Q diag(h) Q^T (d x d), a = the local
                         optimum, w_hat = the global optimum; its exact PIM (Eq. 10), the closed-form
                         derivatives of Lemma 1, the s-step PIM of Eq. 3 (gradient descent and its
                         closed form), and Theorem 3.1's error E||v^t - v_hat||^2: the exact
                         second-moment recursion with Lemma 2's (Eq. 13) ratio and the explicit C of
                         Eq. 15 (B of Eq. 15, the two sides of Eq. 14), a Monte Carlo simulation of
                         the same iteration, and the constant-step PIM against a received model.
:func:`random_quadratic` a random instance (rotation Q, spectrum evenly spaced in [mu, L]).
:func:`g_rate`           the global rate g(t) = g0 sqrt(t0 / (t + t0)) of Theorem 3.1's assumption.
:func:`repaired_schedule` the step-size repair (A, t0) of Theorem 3.1's proof.
:func:`exact_pim`        the minimiser of Eq. 10 for a torch model (L-BFGS, mean cross-entropy).
:func:`prototype_images` synthetic images: class prototypes + Gaussian noise.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.validate import check_int, check_real
from fedlib.papers.refed import q_lambda

__all__ = ["Quadratic", "random_quadratic", "g_rate", "repaired_schedule", "exact_pim", "prototype_images"]


def g_rate(t, g0: float, t0: float = 1.0) -> np.ndarray:
    """g(t) = g0 sqrt(t0 / (t + t0)) for rounds t (scalar or array): Theorem 3.1's assumed rate
    E||w^t - w_hat||^2 <= g(t) (t0 = 1: the notes' g0 / sqrt(t + 1))."""
    return g0 * np.sqrt(t0 / (np.asarray(t, dtype=float) + t0))


@dataclass(frozen=True)
class Quadratic:
    """The strongly convex quadratic f(v) = 1/2 (v - a)^T H (v - a), H = Q diag(h) Q^T.

    ``Q`` (d, d) orthogonal, ``h`` (d,) the curvatures (mu = min h > 0, L = max h), ``a`` (d,) the
    local optimum w_hat_k, ``w_hat`` (d,) the global optimum; ``c = Q^T (a - w_hat)`` (d,). The
    distance bound M of Assumption 1 is ||a - w_hat||.
    """

    Q: np.ndarray
    h: np.ndarray
    a: np.ndarray
    w_hat: np.ndarray

    @property
    def H(self) -> np.ndarray:
        """H = Q diag(h) Q^T, (d, d)."""
        return self.Q @ np.diag(self.h) @ self.Q.T

    @property
    def c(self) -> np.ndarray:
        """c = Q^T (a - w_hat), (d,): the eigen-coordinates of the optima's difference."""
        return self.Q.T @ (self.a - self.w_hat)

    @property
    def mu(self) -> float:
        """The strong-convexity constant min h (Assumption 3)."""
        return float(self.h.min())

    def with_spectrum(self, h: np.ndarray) -> "Quadratic":
        """The same rotation and optima with curvatures ``h`` (d,)."""
        return replace(self, h=np.asarray(h, dtype=float))

    def loss(self, v: np.ndarray) -> float:
        """f(v) for v (d,)."""
        return 0.5 * (v - self.a) @ self.H @ (v - self.a)

    def pim(self, lam: float, w: np.ndarray | None = None) -> np.ndarray:
        """The exact PIM v_hat(lam) = argmin f(v) + (q/2)||v - w||^2 = (H + qI)^{-1}(H a + q w)
        (Definition 1, Eq. 10), by a linear solve; ``w`` (d,) defaults to w_hat. Returns (d,)."""
        q = q_lambda(float(lam))
        w = self.w_hat if w is None else w
        return np.linalg.solve(self.H + q * np.eye(len(self.a)), self.H @ self.a + q * w)

    def dist_loss(self, lam: float) -> tuple[float, float]:
        """(||v_hat(lam) - w_hat||^2, f(v_hat(lam))): the two quantities of Lemma 1."""
        v = self.pim(lam)
        return float(((v - self.w_hat) ** 2).sum()), float(self.loss(v))

    def lemma1_derivatives(self, lams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Closed-form Lemma 1 derivatives on a grid ``lams`` (n,) in (0, 1), each (n,):
        d||v_hat - w_hat||^2/dlam = sum_i h_i^2 c_i^2 / (lam^2 (h_i + q)^3) >= 0 and
        df(v_hat)/dlam = -(q/2) d||v_hat - w_hat||^2/dlam <= 0 (the envelope identity)."""
        lams = np.asarray(lams, dtype=float)
        q = np.array([q_lambda(float(l)) for l in lams])
        ddist = (self.h ** 2 * self.c ** 2 / (lams[:, None] ** 2 * (self.h + q[:, None]) ** 3)).sum(1)
        return ddist, -(q * ddist) / 2

    def pim_steps(self, lam: float, steps: int, eta: float) -> np.ndarray:
        """The s-step PIM of Eq. 3 with exact gradients: ``steps`` gradient-descent steps of
        constant size ``eta`` on f(v) + (q/2)||v - w_hat||^2 from v_0 = w_hat. Returns (d,)."""
        q = q_lambda(float(lam))
        H = self.H
        v = self.w_hat.copy()
        for _ in range(check_int("steps", steps, 0)):
            v = v - eta * (H @ (v - self.a) + q * (v - self.w_hat))
        return v

    def pim_steps_closed(self, lam: float, steps: int, eta: float) -> np.ndarray:
        """Closed form of :meth:`pim_steps`: v_s = w_hat + Q (h * g_s(h + q) * c) with
        g_s(u) = (1 - (1 - eta u)^s) / u (the chapter's section 2.2). Returns (d,)."""
        u = self.h + q_lambda(float(lam))
        gs = (1 - (1 - eta * u) ** steps) / u
        return self.w_hat + self.Q @ (self.h * gs * self.c)

    def exact_error(self, lam: float, A: float, *, sigma: float, g0: float, horizon: int,
                    t0: float = 1.0) -> tuple[np.ndarray, np.ndarray, float]:
        """Theorem 3.1's iteration v^{t+1} = v^t - eta_t (grad f(v^t) + xi_t + q (v^t - w^t)),
        eta_t = 2 g(t) / (A (mu + q)), xi_t ~ N(0, sigma^2/d I), w^t = w_hat + zeta_t with
        zeta_t ~ N(0, g(t)/d I) (g = :func:`g_rate`), v^0 = w_hat, by the exact recursion of the
        per-eigen-coordinate second moments. Returns ``err`` (horizon + 1,) = E||v^t - v_hat||^2,
        ``lemma2`` (horizon,) = the ratio LHS/RHS of Lemma 2 (Eq. 13) at every step (> 1: Eq. 13
        is false there), and the paper's constant C (Eq. 15, with g(0) in B)."""
        A = check_real("A", A, low=0.0)
        horizon = check_int("horizon", horizon, 0)
        h, q, mu, d = self.h, q_lambda(lam), self.mu, len(self.h)
        m = (h * self.c / (h + q)) ** 2  # e^0 = w_hat - v_hat has eigen-coordinates -h c / (h + q)
        bc = self._b_root(q, sigma)
        err, lemma2 = np.empty(horizon + 1), np.empty(horizon)
        for t in range(horizon + 1):
            err[t] = m.sum()
            if t == horizon:
                break
            g = g_rate(t, g0, t0)
            eta = 2 * g / (A * (mu + q))
            m = (1 - eta * (h + q)) ** 2 * m + eta ** 2 * (sigma ** 2 + q ** 2 * g) / d
            rhs = ((1 - eta * (mu + q)) * err[t] + eta ** 2 * bc ** 2 + eta ** 2 * q ** 2 * g
                   + 2 * eta ** 2 * q * bc * np.sqrt(g) + 2 * eta * q * np.sqrt(err[t] * g))
            lemma2[t] = m.sum() / rhs
        C = max(err[0] / g0, 16.0, 4 * self.eq15_B(lam, sigma, g0) / (A * (mu + q) ** 2 * (1 - 1 / (1 + mu / q))))
        return err, lemma2, C

    def _b_root(self, q: float, sigma: float) -> float:
        # sigma + q (M + sigma / mu), M = ||a - w_hat|| (Assumption 1)
        return sigma + q * (float(np.linalg.norm(self.a - self.w_hat)) + sigma / self.mu)

    def eq15_B(self, lam: float, sigma: float, g) -> np.ndarray:
        """B(t) = (sigma + q(M + sigma/mu))^2 + q^2 g + 2 q sqrt(g) (sigma + q(M + sigma/mu)) of Eq. 15
        for g = g(t) (scalar or array, same shape returned); M = ||a - w_hat||."""
        q = q_lambda(lam)
        bc = self._b_root(q, sigma)
        return bc ** 2 + q ** 2 * g + 2 * q * np.sqrt(g) * bc

    def eq14(self, lam: float, A: float, C: float, *, sigma: float, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The right side of Eq. 14 at E||v^t - v_hat||^2 = C g(t), for g = g(t) (T,): (printed,
        corrected), printed with the typo g(t) in the last term, corrected with g(t)^2. The induction
        of Theorem 3.1 closes at round t when the value is <= C g(t+1)."""
        q, mu = q_lambda(lam), self.mu
        base = (1 - 2 * g / A) * C * g + 4 * g ** 2 / (A ** 2 * (mu + q) ** 2) * self.eq15_B(lam, sigma, g)
        printed = base + 4 * q * np.sqrt(C) * g / (A * (mu + q))
        corrected = base + 4 * q * np.sqrt(C) * g ** 2 / (A * (mu + q))
        return printed, corrected

    def constant_step(self, lam: float, zeta: np.ndarray, *, eta: float, sigma: float,
                      steps: int) -> tuple[np.ndarray, float, float]:
        """The PIM as the algorithm runs it (the chapter's section 3.3): ``steps`` steps of constant size
        ``eta`` against the received model w = w_hat + ``zeta`` (d,), gradient noise N(0, sigma^2/d I),
        from v_0 = w. Returns E||v_s - v_hat||^2 for s = 0..steps (steps + 1,) by the exact recursion
        of the per-eigen-coordinate mean and variance, and the limit's bias sum_i (q zt_i/(h_i+q))^2
        (zt = Q^T zeta) and variance sum_i eta^2 sigma^2/d / (1 - (1 - eta(h_i+q))^2)."""
        steps = check_int("steps", steps, 0)
        q, h, d = q_lambda(lam), self.h, len(self.h)
        zt = self.Q.T @ zeta
        bias_i = (q * zt / (h + q)) ** 2
        var_i = eta ** 2 * sigma ** 2 / d / (1 - (1 - eta * (h + q)) ** 2)
        v_hat = self.pim(lam)
        mean = self.Q.T @ (self.w_hat + zeta - v_hat)   # e_0 = w - v_hat, per eigen-coordinate
        var = np.zeros(d)
        target = self.Q.T @ (self.pim(lam, w=self.w_hat + zeta) - v_hat)  # the fixed point of the mean
        curve = np.empty(steps + 1)
        for s in range(steps + 1):
            curve[s] = float((mean ** 2 + var).sum())
            mean = target + (1 - eta * (h + q)) * (mean - target)
            var = (1 - eta * (h + q)) ** 2 * var + eta ** 2 * sigma ** 2 / d
        return curve, float(bias_i.sum()), float(var_i.sum())

    def monte_carlo_error(self, lam: float, A: float, *, sigma: float, g0: float, horizon: int, reps: int,
                          rng: np.random.Generator) -> np.ndarray:
        """The iteration of :meth:`exact_error` (t0 = 1) simulated ``reps`` times with noise from
        ``rng``: ||v^t - v_hat||^2 per round and repetition, (horizon + 1, reps)."""
        horizon, reps = check_int("horizon", horizon, 0), check_int("reps", reps, 1)
        h, q, mu, d = self.h, q_lambda(lam), self.mu, len(self.h)
        H = self.H
        vh = np.linalg.solve(H + q * np.eye(d), H @ self.a + q * self.w_hat)
        v = np.tile(self.w_hat, (reps, 1))
        out = np.empty((horizon + 1, reps))
        for t in range(horizon + 1):
            out[t] = ((v - vh) ** 2).sum(1)
            if t == horizon:
                break
            g = g_rate(t, g0)
            eta = 2 * g / (A * (mu + q))
            w_t = self.w_hat + np.sqrt(g / d) * rng.standard_normal((reps, d))
            grad = (v - self.a) @ H + sigma / np.sqrt(d) * rng.standard_normal((reps, d))
            v = v - eta * (grad + q * (v - w_t))
        return out


def repaired_schedule(L: float, mu: float, lam: float, g0: float) -> tuple[float, float]:
    """The repair of Theorem 3.1's proof (the chapter's section 3.2, item 4): A = 2 g0 (L + q)/(mu + q),
    so that eta_t (L + q) <= 1, and the smallest t0 in {1.25^k} with A (g(0) - g(1)) <= g(0)^2 for
    g = :func:`g_rate` (g0, t0). Returns (A, t0)."""
    q = q_lambda(lam)
    A = 2 * g0 * (L + q) / (mu + q)
    t0 = 1.0
    while g0 ** 2 < A * (g0 - g_rate(1, g0, t0)):
        t0 *= 1.25
    return A, t0


def random_quadratic(rng: np.random.Generator, dim: int, mu: float, L: float, spread: float = 0.5) -> Quadratic:
    """A random :class:`Quadratic` in dimension ``dim``: Q from the QR of a Gaussian (dim, dim)
    matrix, curvatures evenly spaced in [mu, L], a ~ N(0, I), w_hat = a + spread N(0, I) (drawn
    from ``rng`` in this order)."""
    dim = check_int("dim", dim, 1)
    mu = check_real("mu", mu, low=0.0)
    L = check_real("L", L, low=mu, strict=False)
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    a = rng.standard_normal(dim)
    w_hat = a + spread * rng.standard_normal(dim)
    return Quadratic(Q, np.linspace(mu, L, dim), a, w_hat)


def exact_pim(w_model: nn.Module, x: Tensor, y: Tensor, lam: float) -> tuple[nn.Module, float, float]:
    """The exact PIM of Definition 1 (Eq. 10) for a torch model: argmin_v mean CE(v(x), y) +
    (q/2)||v - w||^2 from a copy of ``w_model`` (left untouched), by L-BFGS to machine precision
    (use float64). x (n, ...), y (n,). Returns (v, ||v - w||^2, mean CE of v)."""
    v = copy.deepcopy(w_model)
    anchor = [p.detach().clone() for p in w_model.parameters()]
    opt = torch.optim.LBFGS(v.parameters(), lr=1, max_iter=1000, tolerance_grad=1e-13, tolerance_change=1e-16,
                            history_size=50, line_search_fn="strong_wolfe")
    q = q_lambda(lam)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(v(x), y) + 0.5 * q * sum(((p - p0) ** 2).sum() for p, p0 in zip(v.parameters(), anchor))
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    with torch.no_grad():
        dist = float(sum(((p - p0) ** 2).sum() for p, p0 in zip(v.parameters(), anchor)))
        return v, dist, float(F.cross_entropy(v(x), y))


def prototype_images(protos: np.ndarray, n_per: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n_per`` images per class: x = protos[y] + N(0, 1) noise (float32), y sorted by class.
    protos (C, ...) -> x (C n_per, ...), y (C n_per,)."""
    n_per = check_int("n_per", n_per, 0)
    y = np.repeat(np.arange(len(protos)), n_per)
    x = protos[y] + rng.standard_normal((len(y),) + protos.shape[1:]).astype(np.float32)
    return x, y
