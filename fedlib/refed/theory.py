"""Re-Fed's theory (Li et al., CVPR 2024, Appendix F) on instances where everything is exact.

Used by the chapter ``notebooks/refed_theory.py``. Notation: q =
q(lam) = (1 - lam) / (2 lam) (Eq. 3, :func:`fedlib.refed.algorithm.q_lambda`); the PIM objective of
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
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch import Tensor, nn

from fedlib.core import seeds
from fedlib.core.linalg import relative_error
from fedlib.core.persample import grad_sq_norms, last_layer_grad_sq_norms, reference_grad_sq_norms, vmap_grad_sq_norms
from fedlib.core.validate import check_int, check_real
from fedlib.evaluation.compare import max_state_difference, states_equal
from fedlib.federated.gradient import LinearHead
from fedlib.federated.models import SmallResNet
from fedlib.refed.algorithm import q_lambda, train_pim

__all__ = ["Quadratic", "random_quadratic", "g_rate", "repaired_schedule", "exact_pim", "prototype_images",
           "lemma1_scan", "limit_ratios", "finite_step_scan", "softmax_problem", "softmax_pim_table", "monte_carlo_z",
           "theorem31_table", "tail_growth", "eq14_table", "rate_feasibility", "repair_table", "constant_step_table",
           "task1_identity", "pim_lambda_scan", "adjacent_violations", "closed_form_table", "rank_agreement",
           "bn_resnet", "vmap_table"]


def g_rate(t, g0: float, t0: float = 1.0) -> np.ndarray:
    """g(t) = g0 sqrt(t0 / (t + t0)) for rounds t (scalar or array): Theorem 3.1's assumed rate
    E||w^t - w_hat||^2 <= g(t) (t0 = 1: g0 / sqrt(t + 1), the rate the refed_theory chapter uses)."""
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
        q, mu, d = q_lambda(lam), self.mu, len(self.h)
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


# ----------------------------------------------------------------------------------------------
# the theory chapter's tables (each a pandas DataFrame the chapter prints, plots and checks)
# ----------------------------------------------------------------------------------------------
def lemma1_scan(quad: Quadratic, lams, eps: float = 1e-6) -> pd.DataFrame:
    """Lemma 1 on a grid ``lams`` (n,) in (0, 1): one row per lambda with ``q`` (Eq. 3), the solved
    PIM's ``dist`` = ||v_hat - w_hat||^2 and ``loss`` = f(v_hat) (Eq. 10), the closed-form
    derivatives ``ddist``, ``dloss``, their central finite differences (step ``eps``) ``fd ddist``,
    ``fd dloss``, and ``envelope`` = fd dloss + (q/2) fd ddist (0 by the envelope identity)."""
    lams = np.asarray(lams, dtype=float)
    frame = pd.DataFrame([(l, *quad.dist_loss(l)) for l in lams], columns=["lambda", "dist", "loss"])
    fd = np.array([[(a - b) / (2 * eps) for a, b in zip(quad.dist_loss(l + eps), quad.dist_loss(l - eps))]
                   for l in lams])
    q = np.array([q_lambda(float(l)) for l in lams])
    frame["q"] = q
    frame["ddist"], frame["dloss"] = quad.lemma1_derivatives(lams)
    frame["fd ddist"], frame["fd dloss"] = fd[:, 0], fd[:, 1]
    frame["envelope"] = fd[:, 1] + q / 2 * fd[:, 0]
    return frame


def limit_ratios(quad: Quadratic, lam: float) -> tuple[float, float]:
    """Lemma 1's limits as ratios to their bounds (each <= 1 at every lam):
    ||v_hat - w_hat|| / (L ||a - w_hat|| / q) (-> 0 as lam -> 0) and
    ||v_hat - a|| / (q ||a - w_hat|| / (mu + q)) (-> 0 as lam -> 1), L = max h, mu = min h."""
    q, v, m = q_lambda(lam), quad.pim(lam), np.linalg.norm(quad.a - quad.w_hat)
    return (float(np.linalg.norm(v - quad.w_hat) / (float(quad.h.max()) * m / q)),
            float(np.linalg.norm(v - quad.a) / (q / (quad.mu + q) * m)))


def finite_step_scan(quad: Quadratic, lams, steps, eta: float,
                     check_every: int = 7) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The s-step PIM of Eq. 3 (the chapter's section 2.2) over the lambdas of ``lams`` with a stable
    step, eta (L + q) < 2, and every s in ``steps``. Returns ``fin`` (one row per (s, lambda): ``eta
    (L+q)``, ``dist`` = ||v_s - w_hat||^2, ``loss`` = f(v_s)), ``mono`` (per s and regime eta (L+q) <= 1
    or in (1, 2): number of ``lambdas``, ``dist non-decreasing``, ``loss non-increasing`` (tolerance
    1e-12), ``monotone`` = both) and the largest |gradient descent - closed form| over every
    ``check_every``-th lambda and every s."""
    lams = np.asarray(lams, dtype=float)
    L = float(quad.h.max())
    q = np.array([q_lambda(float(l)) for l in lams])
    lams = lams[eta * (L + q) < 2]
    err = max(np.abs(quad.pim_steps(l, s, eta) - quad.pim_steps_closed(l, s, eta)).max()
              for l in lams[::check_every] for s in steps)
    rows = []
    for s in steps:
        for l in lams:
            v = quad.pim_steps_closed(l, s, eta)
            rows.append({"s": s, "lambda": l, "eta (L+q)": eta * (L + q_lambda(float(l))),
                         "dist": float(((v - quad.w_hat) ** 2).sum()), "loss": float(quad.loss(v))})
    fin = pd.DataFrame(rows)
    mono = []
    for s, grp in fin.groupby("s"):
        for regime, part in [("eta(L+q) <= 1", grp[grp["eta (L+q)"] <= 1]), ("1 < eta(L+q) < 2", grp[grp["eta (L+q)"] > 1])]:
            mono.append({"s": s, "regime": regime, "lambdas": len(part),
                         "dist non-decreasing": bool((np.diff(part["dist"]) >= -1e-12).all()),
                         "loss non-increasing": bool((np.diff(part["loss"]) <= 1e-12).all())})
    mono = pd.DataFrame(mono)
    mono["monotone"] = mono["dist non-decreasing"] & mono["loss non-increasing"]
    return fin, mono, float(err)


def softmax_problem(seed: int, n: int, dim: int = 8, classes: int = 4) -> tuple[Tensor, Tensor, nn.Module]:
    """The softmax-regression instance of the chapter's section 2.3 (float64): class means
    1.5 N(0, I) (classes, dim), labels y (n,) uniform, x = means[y] + N(0, I) (n, dim), all from
    one generator seeded ``seed``; and a random linear model w (``LinearHead``, torch seed ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    means = 1.5 * torch.randn(classes, dim, generator=gen, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=gen)
    x = means[y] + torch.randn(n, dim, generator=gen, dtype=torch.float64)
    torch.manual_seed(seed)
    return x, y, LinearHead(dim, classes).double()


def softmax_pim_table(w_model: nn.Module, x: Tensor, y: Tensor, lams, *, num_classes: int, epochs: int,
                      lr: float) -> pd.DataFrame:
    """Full-batch :func:`fedlib.refed.algorithm.train_pim` (last-layer norms) against the exact PIM
    (:func:`exact_pim`, Eq. 10) for every lambda of ``lams``: ``q``, ``train_pim dist`` / ``exact
    dist`` (||v - w||^2), ``train_pim loss`` / ``exact loss`` and ``rel. gap to minimiser``
    ||v_train - v_exact|| / ||v_exact|| over the state dict. x (n, d), y (n,)."""
    rows = []
    for lam in lams:
        res = train_pim(w_model, x, y, num_classes, lam=lam, epochs=epochs, lr=lr, batch_size=len(y),
                        grad_norm="last_layer")
        v_ex, d_ex, l_ex = exact_pim(w_model, x, y, lam)
        gap = float(sum(((res.state[k] - v) ** 2).sum() for k, v in v_ex.state_dict().items()) ** 0.5
                    / sum((v ** 2).sum() for v in v_ex.state_dict().values()) ** 0.5)
        rows.append({"lambda": lam, "q": q_lambda(lam), "train_pim dist": res.dist_sq, "exact dist": d_ex,
                     "train_pim loss": res.loss, "exact loss": l_ex, "rel. gap to minimiser": gap})
    return pd.DataFrame(rows)


def monte_carlo_z(quad: Quadratic, Ls, lam: float, A: float, *, sigma: float, g0: float, horizon: int, reps: int,
                  seed: int) -> float:
    """Largest |z| = |Monte Carlo mean - exact E||v^t - v_hat||^2| / standard error over rounds
    1..``horizon`` of Theorem 3.1's iteration (:meth:`Quadratic.exact_error` against
    :meth:`Quadratic.monte_carlo_error`, ``reps`` repetitions), for the spectra evenly spaced in
    [mu, L], L in ``Ls``; each L draws from a fresh stream ``seeds.rng(seed, "monte_carlo")``."""
    z_max = 0.0
    for L in Ls:
        quad_L = quad.with_spectrum(np.linspace(quad.mu, L, len(quad.h)))
        err, _, _ = quad_L.exact_error(lam, A, sigma=sigma, g0=g0, horizon=horizon)
        mc = quad_L.monte_carlo_error(lam, A, sigma=sigma, g0=g0, horizon=horizon, reps=reps,
                                      rng=seeds.rng(seed, "monte_carlo"))
        se = mc.std(1, ddof=1) / np.sqrt(reps)
        z_max = max(z_max, float(np.max(np.abs(mc.mean(1)[1:] - err[1:]) / se[1:])))
    return z_max


def theorem31_table(quad: Quadratic, Ls, lams, A: float, *, sigma: float, g0: float,
                    horizon: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Theorem 3.1 with the paper's constants for every largest curvature L in ``Ls`` (spectrum
    evenly spaced in [mu, L]) and lambda in ``lams``: ``thm`` one row per case (``q``, ``eta_0 (L+q)``,
    ``max ratio`` of E||v^t - v_hat||^2 / g(t) and its ``argmax t``, ``final ratio``, ``paper C``
    (Eq. 15), ``ratio <= C``, ``max Lemma 2 LHS/RHS`` (Eq. 13) and its round ``at t``), and
    ``curves`` (t = 1..horizon+1, ratio, L, lambda)."""
    rows, curves = [], []
    for L in Ls:
        for lam in lams:
            err, lemma2, C = quad.with_spectrum(np.linspace(quad.mu, L, len(quad.h))).exact_error(
                lam, A, sigma=sigma, g0=g0, horizon=horizon)
            ratio = err / g_rate(np.arange(horizon + 1), g0)
            q = q_lambda(lam)
            rows.append({"L": L, "lambda": lam, "q": q, "eta_0 (L+q)": 2 * g0 * (L + q) / (A * (quad.mu + q)),
                         "max ratio": ratio.max(), "argmax t": int(ratio.argmax()), "final ratio": ratio[-1],
                         "paper C": C, "ratio <= C": bool(ratio.max() <= C),
                         "max Lemma 2 LHS/RHS": lemma2.max(), "at t": int(lemma2.argmax())})
            curves.append(pd.DataFrame({"t": np.arange(1, horizon + 2), "ratio": ratio, "L": L, "lambda": lam}))
    return pd.DataFrame(rows), pd.concat(curves)


def tail_growth(curves: pd.DataFrame, horizon: int) -> float:
    """Largest ratio(horizon) / ratio(horizon // 2) over the (L, lambda) cases of
    :func:`theorem31_table`'s ``curves``: <= 1 + small when E||v^t - v_hat||^2 / g(t) stays bounded."""
    return max(float(c["ratio"].iloc[-1] / c["ratio"].iloc[horizon // 2]) for _, c in curves.groupby(["L", "lambda"]))


def eq14_table(quad: Quadratic, thm: pd.DataFrame, A: float, *, sigma: float, g0: float, horizon: int) -> pd.DataFrame:
    """The algebra of Eqs. 14 -> 15 (the chapter's section 3.2, items 1-2) at the paper's C of each case
    of ``thm`` (:func:`theorem31_table`), rounds t < ``horizon``: the first round where the printed
    (14) exceeds C g(t+1) (-1: none), the number of such rounds, the corrected (14)'s largest ratio
    to C g(t+1), and whether B(t) <= B(0) (Eq. 15)."""
    t_ax = np.arange(horizon)
    rows = []
    for L, lam, C in thm[["L", "lambda", "paper C"]].itertuples(index=False):
        g, g1 = g_rate(t_ax, g0), g_rate(t_ax + 1, g0)
        Bt = quad.eq15_B(lam, sigma, g)
        printed, corrected = quad.eq14(lam, A, C, sigma=sigma, g=g)
        bad = np.flatnonzero(printed > C * g1)
        rows.append({"L": L, "lambda": lam, "printed (14) <= C g(t+1) fails from t": int(bad[0]) if len(bad) else -1,
                     "printed: rounds failing": len(bad),
                     "corrected: max (14)/(C g(t+1))": float((corrected / (C * g1)).max()),
                     "B(t) <= B(0)": bool((Bt <= Bt[0] + 1e-15).all())})
    return pd.DataFrame(rows)


def rate_feasibility(g0: float, horizon: int, powers=(0.25, 0.5, 0.75, 1.0, 1.5), geometric: float = 0.99) -> pd.DataFrame:
    """Item 3 of the chapter's section 3.2: for g(t) = g0 (t+1)^-p (p in ``powers``) and g0 ``geometric``^t,
    t < ``horizon``, the largest A with A (g(t) - g(t+1)) <= g(t)^2 for all t, against the A >= 2 g(0)
    that the induction needs. Columns ``g(t)``, ``largest admissible A``, ``needed A >= 2 g(0)``, ``feasible``."""
    tt = np.arange(horizon, dtype=float)
    rates = {f"g0 (t+1)^-{p}": g0 * (tt + 1) ** -p for p in powers}
    rates[f"g0 {geometric}^t"] = g0 * geometric ** tt
    rows = []
    for name, g in rates.items():
        a_max = float(np.min(g[:-1] ** 2 / (g[:-1] - g[1:])))
        rows.append({"g(t)": name, "largest admissible A": a_max, "needed A >= 2 g(0)": 2 * g0, "feasible": a_max >= 2 * g0})
    return pd.DataFrame(rows)


def repair_table(quad: Quadratic, Ls, lams, *, sigma: float, g0: float, horizon: int) -> pd.DataFrame:
    """Item 4 of the chapter's section 3.2: the repaired proof (:func:`repaired_schedule`'s A and t0) for
    every L in ``Ls`` and lambda in ``lams``: ``A``, ``t0``, whether the rate condition
    A (g(t) - g(t+1)) <= g(t)^2 holds, the largest Lemma 2 (Eq. 13) LHS/RHS and the largest
    E||v^t - v_hat||^2 / (C g(t)) (all <= 1 when the repair works)."""
    rows = []
    for L in Ls:
        for lam in lams:
            A_fix, t0 = repaired_schedule(L, quad.mu, lam, g0)
            g = g_rate(np.arange(horizon + 1), g0, t0)
            a_ok = bool(np.all(A_fix * (g[:-1] - g[1:]) <= g[:-1] ** 2 * (1 + 1e-12)))
            err, lemma2, C = quad.with_spectrum(np.linspace(quad.mu, L, len(quad.h))).exact_error(
                lam, A_fix, sigma=sigma, g0=g0, horizon=horizon, t0=t0)
            rows.append({"L": L, "lambda": lam, "A": A_fix, "t0": t0, "rate condition holds": a_ok,
                         "max Lemma 2 LHS/RHS": lemma2.max(), "max ratio / C": float((err / g).max() / C)})
    return pd.DataFrame(rows)


def constant_step_table(quad: Quadratic, lams, zeta: np.ndarray, *, eta: float, sigma: float,
                        steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:meth:`Quadratic.constant_step` for every lambda of ``lams`` (the chapter's section 3.3): the
    curves (lambda, s, E||v_s - v_hat||^2) and the floors (lambda, q, bias, variance, floor (formula)
    = bias + variance, the recursion at s = ``steps``)."""
    rows, floor_rows = [], []
    for lam in lams:
        curve, bias, variance = quad.constant_step(lam, zeta, eta=eta, sigma=sigma, steps=steps)
        rows.append(pd.DataFrame({"lambda": lam, "s": np.arange(steps + 1), "E||v_s - v_hat||^2": curve}))
        floor_rows.append({"lambda": lam, "q": q_lambda(lam), "bias": bias, "variance": variance,
                           "floor (formula)": bias + variance, f"recursion at s={steps}": curve[-1]})
    return pd.concat(rows, ignore_index=True), pd.DataFrame(floor_rows)


# ----------------------------------------------------------------------------------------------
# the implementation checks (the chapter's sections 4-7)
# ----------------------------------------------------------------------------------------------
def task1_identity(kept: dict, num_tasks: int) -> pd.DataFrame:
    """Per stage, bit-identity of the global weights kept (``KeepWeights`` of
    :func:`fedlib.refed.studies.run_methods`) by the runs ``refed``, ``fedavg``, ``fedavg_replay``,
    ``refed (memory holds all)`` and ``fedavg_replay (memory holds all)``: Re-Fed is FedAvg on task 1
    (nothing cached yet), and random replay when the memory holds every pool."""
    rows = []
    for t in range(num_tasks):
        rows.append({"stage": t + 1,
                     "refed == fedavg": states_equal(kept["refed"].weights[t], kept["fedavg"].weights[t]),
                     "max |refed - fedavg|": max_state_difference(kept["refed"].weights[t], kept["fedavg"].weights[t]),
                     "refed == fedavg_replay": states_equal(kept["refed"].weights[t], kept["fedavg_replay"].weights[t]),
                     "memory holds all: refed == fedavg_replay": states_equal(
                         kept["refed (memory holds all)"].weights[t], kept["fedavg_replay (memory holds all)"].weights[t])})
    return pd.DataFrame(rows)


def pim_lambda_scan(w_model: nn.Module, pools, num_seen: int, lams, *, epochs: int, lr: float,
                    batch_size: int = 16) -> pd.DataFrame:
    """Lemma 1 for a network's PIM (the chapter's section 5): :func:`fedlib.refed.algorithm.train_pim` from
    ``w_model`` on every client's pool (``pools`` [(x (n_k, ...), y (n_k,))], client k's mini-batch
    order from ``torch.Generator().manual_seed(k)`` for every lambda: paired) for every lambda of
    ``lams``. Columns client, pool, lambda, ``||v - w||^2``, ``pool loss``."""
    rows = []
    for k, (xk, yk) in enumerate(pools):
        for lam in lams:
            r = train_pim(w_model, xk, yk, num_seen, lam=lam, epochs=epochs, lr=lr, batch_size=batch_size,
                          generator=torch.Generator().manual_seed(k))
            rows.append({"client": k, "pool": len(yk), "lambda": lam, "||v - w||^2": r.dist_sq, "pool loss": r.loss})
    return pd.DataFrame(rows)


def adjacent_violations(frame: pd.DataFrame, by: str, column: str, increasing: bool = True) -> int:
    """Number of adjacent rows (within each group of ``by``, in frame order) where ``column`` falls
    (``increasing``) or rises (not ``increasing``): 0 when it is monotone in every group."""
    sign = -1 if increasing else 1
    return sum(int((sign * np.diff(g[column]) > 0).sum()) for _, g in frame.groupby(by))


def closed_form_table(cnn: nn.Module, x: Tensor, y: Tensor, num_seen: int, *, num_classes: int,
                      seed: int) -> pd.DataFrame:
    """The last-layer closed form ||pi - e_y||^2 (||h||^2 + 1) (the chapter's section 6) against a
    per-sample autograd loop, for ``cnn`` (a model with a ``classifier`` layer) and a bias-free MLP
    (torch seed ``seed``; input x[0].numel(), 16 tanh units, ``num_classes`` outputs), in float64
    (tolerance 1e-10) and float32 (1e-4). x (n, ...), y (n,) < num_seen. Per (model, dtype): the max
    relative errors of the identity in the model's precision, of ``last_layer_grad_sq_norms``
    (float32 by design) and of ``grad_sq_norms`` on the last layer, and the tolerance."""
    rows = []
    for dtype, tol in [(torch.float64, 1e-10), (torch.float32, 1e-4)]:
        xd = x.to(dtype)
        torch.manual_seed(seed)
        nobias = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 16), nn.Tanh(), nn.Linear(16, num_classes, bias=False))
        for name, model, layer, names in [("SmallCNN", cnn, "classifier", ["classifier.weight", "classifier.bias"]),
                                          ("MLP, no bias", nobias, "3", ["3.weight"])]:
            m_ = copy.deepcopy(model).to(dtype)
            loop = reference_grad_sq_norms(m_, xd, y, num_seen, names)
            rows.append({"model": name, "dtype": str(dtype)[6:],
                         "identity vs loop": relative_error(
                             last_layer_grad_sq_norms(m_, xd, y, num_seen, m_.get_submodule(layer), dtype=None), loop),
                         "fedlib closed form vs loop": relative_error(last_layer_grad_sq_norms(m_, xd, y, num_seen), loop),
                         "fedlib grad_sq_norms(last layer) vs loop": relative_error(
                             grad_sq_norms(m_, xd, y, num_seen, names=names), loop),
                         "tolerance": tol})
    return pd.DataFrame(rows)


def rank_agreement(w_model: nn.Module, pools, num_seen: int) -> pd.DataFrame:
    """Exact all-parameter norms (Eq. 4) against the last-layer closed form on every client's pool
    (``pools`` [(x, y)]): per client the pool size, the Spearman rank correlation, the median and the
    largest share of the last layer in ||grad||^2 (<= 1: its coordinates are a subset)."""
    rows = []
    for k, (xk, yk) in enumerate(pools):
        full = grad_sq_norms(w_model, xk, yk, num_seen)
        last = last_layer_grad_sq_norms(w_model, xk, yk, num_seen)
        rows.append({"client": k, "pool": len(yk), "Spearman(last layer, all params)": float(spearmanr(last.numpy(), full.numpy())[0]),
                     "last-layer share of ||grad||^2 (median)": float((last / full).median()),
                     "max share": float((last / full).max())})
    return pd.DataFrame(rows)


def bn_resnet(num_classes: int, seed: int) -> nn.Module:
    """A small ``SmallResNet`` (1 channel, widths (4, 8), one block per stage, BatchNorm; torch seed
    ``seed``) whose running means ~ U(-0.5, 0.5) and variances ~ U(0.5, 2) are non-trivial."""
    torch.manual_seed(seed)
    resnet = SmallResNet(1, num_classes, widths=(4, 8), blocks=(1, 1), norm="batch")
    for mod in resnet.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return resnet


def vmap_table(models: dict, x: Tensor, y: Tensor, num_seen: int, batch_size: int = 7) -> pd.DataFrame:
    """Both vectorised per-sample norms, chunks of ``batch_size``: ``grad_sq_norms`` (ghost norms from
    layer inputs and output gradients) and ``vmap_grad_sq_norms`` (``torch.func.vmap``), against one
    backward pass per sample, for every model of ``models`` {name: model} in float64 (tolerance 1e-10)
    and float32 (1e-4): model, dtype, params, ``ghost vs loop``, ``vmap vs loop`` (max relative
    errors), tolerance."""
    rows = []
    for name, model in models.items():
        for dtype, tol in [(torch.float64, 1e-10), (torch.float32, 1e-4)]:
            m_ = copy.deepcopy(model).to(dtype)
            xd = x.to(dtype)
            ref = reference_grad_sq_norms(m_, xd, y, num_seen)
            ghost = grad_sq_norms(m_, xd, y, num_seen, batch_size=batch_size)
            vm = vmap_grad_sq_norms(m_, xd, y, num_seen, batch_size=batch_size)
            rows.append({"model": name, "dtype": str(dtype)[6:], "params": sum(p.numel() for p in m_.parameters()),
                         "ghost vs loop": relative_error(ghost, ref), "vmap vs loop": relative_error(vm, ref),
                         "tolerance": tol})
    return pd.DataFrame(rows)
