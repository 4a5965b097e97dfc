"""FedDL (Algorithm 1, Eqs. 8-16) on the one protocol of :mod:`fedlib.core.protocol`:
:class:`FedDLClient` (set-up upload, then per round the gradient of Eq. 13 or Q local steps of Eq. 14,
with the client's own noise from its own generator), :class:`FedDLServer` (weights, gamma, Y^0, the
update of Eq. 15/16), :func:`feddl` (drives them with ``simulate``; result with its measured Cost) and
the plateau rule for the number of rounds (:func:`feddl_until_plateau`)."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from fedlib.core import privacy, seeds, uploads
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import EMPTY, ClientStates, Server, simulate
from fedlib.core.validate import check_choice, check_fraction, check_int, check_positive
from fedlib.fedtsne.dp import (
    DP_MECHANISMS, DP_SENSITIVITIES, _check_epsilon_delta, _privacy_ledger, clip_rows, data_sensitivity,
    gradient_sensitivity, kernel_gradient_sensitivity, project_spectral)
from fedlib.fedtsne.mmd import (
    GAMMA_RULES, WEIGHTS, _as_matrix, _check_clients, _client_weights, _cross_terms, _pooled_moments, _sq_distances,
    _xx_term, _yy_terms, client_median_sqdist, kernel_width, lipschitz_bound)


MODES = ("gradient", "average")
INITS = ("moments", "gaussian", "uniform")
NOISES = ("none", "dp_data", "dp_gradient", "heuristic")
DTYPES = ("float64", "float32")


@dataclass
class FedDLResult:
    """Output of :func:`feddl`. ``objective[s]`` = F(Y^s) = sum_p w_p f_p(Y^s), s = 0..S (Eq. 11, a
    diagnostic computed on the data the clients hold, not uploaded); ``step_sq_norms[s-1]`` =
    ||Y^s - Y^{s-1}||_F^2; ``noise_sd``: (P,) data-noise sd (dp_data) or (S, P) mean gradient-noise sd
    per round and client; bytes are sums of ``Message.nbytes``: ``cost`` is the run's measured
    :class:`~fedlib.core.messages.Cost` (bytes up = ``upload_bytes``, set-up included; bytes down =
    ``broadcast_bytes``: each round's {Y, gamma, step} to every client; seconds of protocol work).
    ``client_data`` is client-side state (the clipped, perturbed copies under dp_data; the clipped rows
    under dp_sensitivity="theorem6") that Algorithms 2-3 upload from; it is never sent.

    Privacy: ``epsilon`` is the epsilon SPENT at ``delta`` by every client's releases during FedDL, from
    the accountant (:mod:`fedlib.core.privacy`); ``math.inf`` for noise "none" and "heuristic" (no
    guarantee). ``noise_multiplier`` = sd / sensitivity, ``sensitivity`` (P,) the l2-sensitivity each
    client's noise is calibrated to, ``privacy_ledger`` one line per kind of release and how it is
    covered."""

    landmarks: np.ndarray
    init_landmarks: np.ndarray
    objective: np.ndarray
    step_sq_norms: np.ndarray
    gamma: float
    weights: np.ndarray
    lr: float
    server_lr: float
    mode: str
    local_steps: int
    noise: str
    noise_sd: np.ndarray
    upload_bytes: int
    setup_upload_bytes: int
    broadcast_bytes: int
    seconds: float
    client_data: list = field(repr=False, default_factory=list)
    epsilon: float = math.inf
    delta: float | None = None
    noise_multiplier: float = 0.0
    sensitivity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accountant: str | None = None
    privacy_ledger: list = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)

    @property
    def rounds(self) -> int:
        return len(self.step_sq_norms)


def _post(Y: np.ndarray, landmark_bounds, tau_y) -> np.ndarray:
    """Public post-processing of landmarks: clip into the box ``landmark_bounds``, then (Theorem 6)
    project into ||Y||_2 <= ``tau_y`` (None: skipped)."""
    if landmark_bounds is not None:
        Y = np.clip(Y, *landmark_bounds)
    if tau_y is not None:
        Y = project_spectral(Y, tau_y)
    return Y


def _add_scaled(target: np.ndarray, x: np.ndarray, a: float) -> np.ndarray:
    """target + a x, written into ``target`` (an array the caller owns) by one BLAS axpy pass; x is read
    in target's dtype. Returns the sum (target itself when it is C-contiguous)."""
    from scipy.linalg.blas import get_blas_funcs

    if np.shape(x) != np.shape(target):   # BLAS would update a prefix of the flat arrays
        raise ValueError(f"cannot add an array of shape {np.shape(x)} to one of shape {np.shape(target)}")
    target = np.ascontiguousarray(target)
    flat = target.reshape(-1)
    x = np.ascontiguousarray(x, dtype=target.dtype).reshape(-1)
    return get_blas_funcs("axpy", (flat,))(x, flat, a=a).reshape(target.shape)


def _weighted_sum(arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum_p weights[p] arrays[p] (arrays of one shape and dtype) into one new array, one axpy pass over each
    upload and no temporaries (:func:`_add_scaled`; the server's aggregation of Eqs. 15-16)."""
    total = np.multiply(arrays[0], weights[0])
    for a, wp in zip(arrays[1:], weights[1:]):
        total = _add_scaled(total, a, wp)
    return total


def _entry_sd(g: np.ndarray) -> float:
    """The standard deviation of g's entries (as ``g.std()``) from two BLAS passes, sqrt(g.g/n - mean^2);
    ``g.std()`` itself when the variance is below 1e-6 mean^2, where that difference would cancel."""
    flat = g.reshape(-1)
    mean = float(flat.sum()) / flat.size
    var = float(np.dot(flat, flat)) / flat.size - mean * mean
    return math.sqrt(var) if var > 1e-6 * mean * mean else float(g.std())


def _float32_normals(state: dict, seed: int, shape) -> np.ndarray:
    """float32 N(0, 1) draws of client ``state["k"]`` for ``dtype="float32"``: from its own CPU torch
    generator, stream ("feddl", p) of ``seed`` (as :func:`client_rng`; torch draws float32 normals
    ~2.5x faster than numpy), made on the first draw and kept in ``state``."""
    import torch

    gen = state.get("torch_rng")
    if gen is None:
        gen = state["torch_rng"] = seeds.torch_generator(seed, "feddl", state["k"])
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32).numpy()


def client_rng(seed: int, p: int) -> np.random.Generator:
    """Client p's private generator in a FedDL run of ``seed`` (its noise draws): stream ("feddl", p)."""
    return seeds.rng(seed, "feddl", p)


def median_seed(seed: int, p: int) -> int:
    """Seed of client p's subsample for the median rule: stream ("median", p) of ``seed``."""
    return seeds.derive_seed(seed, "median", p)


@dataclass(frozen=True)
class FedDLClient:
    """Client program of FedDL (Algorithm 1), :class:`fedlib.core.protocol.Client`. Holds only the
    run's PUBLIC configuration; client p's memory is its ``state`` dict (its generator, the data it
    holds after clipping / perturbation, its sensitivity, its diagnostics).

    ``step(X_p, state, broadcast)``:

    * set-up (empty broadcast): clip rows to ``tau_x`` ("dp_data", "theorem6") and, under "dp_data",
      add N(0, ``data_sd``^2) once (Theorem 4); upload {"n": n_p} plus what ``setup`` names ("moments":
      "sum", "sumsq" (m,); "median": "median_sqdist", on <= ``median_points`` rows);
    * round (broadcast {"landmarks" Y (n_y, m), "gamma", "lr"}): grad f_p(Y) (Eq. 13) plus this
      client's noise; "gradient" mode uploads {"gradient" (n_y, m)} (Eq. 16), "average" mode runs Q
      local steps Y_p <- post(Y_p - lr grad f_p(Y_p)) (Eq. 14) and uploads {"landmarks" (n_y, m)}.
      f_p(Y) (Eq. 10) and the noise sd are kept in ``state`` as diagnostics, never uploaded;
    * ``step_many`` (the in-process simulator's round): the same uploads, the distance products of a
      "gradient" round's clients computed as one product (:meth:`step_many`).
    """

    seed: int = 0
    mode: str = "gradient"
    local_steps: int = 1
    noise: str = "none"
    beta: float = 1.0
    data_sd: float = 0.0
    noise_multiplier: float = 0.0
    tau_x: float | None = None
    tau_y: float | None = None
    dp_sensitivity: str = "kernel"
    landmark_bounds: tuple | None = None
    setup: tuple = ()
    median_points: int = 1000
    dtype: str = "float64"
    _yy: list = field(default_factory=lambda: [None], repr=False, compare=False)
    _ysq: list = field(default_factory=lambda: [None], repr=False, compare=False)
    _stacked: list = field(default_factory=lambda: [None], repr=False, compare=False)

    def init_state(self, k: int) -> dict:
        return {"k": k, "rng": client_rng(self.seed, k), "data": None, "objective": [], "noise_sd": []}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        if "landmarks" not in broadcast.payload:
            return Message(f"client{state['k']}", self._setup(self._held(data, state), state))
        return self._round(state, broadcast)

    def step_many(self, datas: Sequence, states: Sequence[dict], broadcast: Message) -> list[Message]:
        """The uploads of several clients in one process, ``[step(d, s, broadcast) ...]`` up to float
        round-off. A "gradient" round computes the squared distances of every client's rows to the
        landmarks by ONE product over the clients' stacked rows (kept while the same clients come back)
        instead of one small product per client; each client then finishes its round from its own
        rows of it, with its own data, state and noise stream. Otherwise it is the per-client loop."""
        Y = broadcast.payload.get("landmarks")
        xs = [state.get("x32", state["data"]) for state in states]     # None before the set-up round
        if Y is None or self.mode != "gradient" or len(states) < 2 or any(x is None for x in xs):
            return [self.step(d, s, broadcast) for d, s in zip(datas, states)]
        for state in states:
            self._prepare(state, len(Y), broadcast["gamma"])
        xs = [state.get("x32", state["data"]) for state in states]     # the float32 copies _prepare made
        if any(x.dtype != Y.dtype for x in xs):    # mixed dtypes: _cross_terms computes each in float64
            return [self._round(state, broadcast) for state in states]
        stacked = self._stacked[0]
        if stacked is None or len(stacked[0]) != len(xs) or any(a is not b for a, b in zip(stacked[0], xs)):
            bounds = np.cumsum([0] + [len(x) for x in xs])
            x_sq = np.concatenate([state["x_sq"] for state in states])
            self._stacked[0] = stacked = (xs, np.concatenate(xs), x_sq, bounds)
        _, x_all, x_sq, bounds = stacked
        d2 = _sq_distances(x_all, Y, x_sq, self._y_sq(Y))
        return [self._round(state, broadcast, d2[a:b]) for state, a, b in zip(states, bounds[:-1], bounds[1:])]

    def _prepare(self, state: dict, ny: int, gamma: float) -> None:
        """At the client's first round: its constant f_p term, squared row norms, sensitivity and (float32)
        the copy it computes its gradients from."""
        if "xx" in state:
            return
        x = state["data"]
        state["xx"] = _xx_term(x, gamma)        # constant part of f_p (diagnostic only)
        state["x_sq"] = np.einsum("ij,ij->i", x, x)   # the client's squared row norms, kept
        state["sensitivity"] = self._sensitivity(len(x), ny, gamma)
        if self.dtype == "float32":       # the client's copy it computes its gradients from
            state["x32"] = x.astype(np.float32)
            state["x_sq"] = state["x_sq"].astype(np.float32)

    def _round(self, state: dict, broadcast: Message, sq_dist: np.ndarray | None = None) -> Message:
        """One round's upload (Eq. 13 plus noise; Eq. 14's local steps in "average" mode); ``sq_dist``:
        this client's rows of the squared distances to the broadcast landmarks when already computed."""
        sender = f"client{state['k']}"
        Y, gamma, lr = broadcast["landmarks"], broadcast["gamma"], broadcast["lr"]
        self._prepare(state, len(Y), gamma)
        x = state.get("x32", state["data"])
        yy_val, yy_grad = self._yy_terms(Y, gamma)
        cross_val, cross_grad = _cross_terms(x, Y, gamma, state["x_sq"], self._y_sq(Y), sq_dist)
        state["objective"].append(state["xx"] + cross_val + yy_val)
        cross_grad += yy_grad        # the client's own fresh array: Eq. 13 summed in place
        g, sd_sum = self._noisy(state, cross_grad)
        if self.mode == "gradient":
            state["noise_sd"].append(sd_sum)
            return Message(sender, {"gradient": g})
        tau_y = self.tau_y if self._theorem6 else None
        Yp = _post(Y - lr * g, self.landmark_bounds, tau_y)
        for _ in range(self.local_steps - 1):
            g, sd = self._noisy(state, _cross_terms(x, Yp, gamma, state["x_sq"])[1] + _yy_terms(Yp, gamma)[1])
            sd_sum += sd
            Yp = _post(Yp - lr * g, self.landmark_bounds, tau_y)
        state["noise_sd"].append(sd_sum / self.local_steps)
        return Message(sender, {"landmarks": Yp})

    def objective(self, state: dict, Y: np.ndarray, gamma: float) -> float:
        """f_p(Y) (Eq. 10) on the data the client holds: a diagnostic, not an upload."""
        return state["xx"] + _cross_terms(state["data"], Y, gamma)[0] + _yy_terms(Y, gamma)[0]

    @property
    def _theorem6(self) -> bool:
        return self.noise == "dp_gradient" and self.dp_sensitivity == "theorem6"

    def _held(self, data, state: dict) -> np.ndarray:
        """The data this client computes from: clipped (and perturbed once under dp_data, Thm 4)."""
        if state["data"] is None:
            x = data
            if self.noise == "dp_data" or self._theorem6:
                x = clip_rows(x, self.tau_x)
            if self.noise == "dp_data":
                x = x + self.data_sd * state["rng"].standard_normal(x.shape)
            state["data"] = x
        return state["data"]

    def _setup(self, x: np.ndarray, state: dict) -> dict:
        payload: dict = {"n": len(x)}
        if "moments" in self.setup:
            payload["sum"] = x.sum(0)
            payload["sumsq"] = np.einsum("ij,ij->j", x, x)
        if "median" in self.setup:
            payload["median_sqdist"] = client_median_sqdist(x, self.median_points, median_seed(self.seed, state["k"]))
        return payload

    def _sensitivity(self, n_p: int, ny: int, gamma: float) -> float:
        """Delta_p of this client's releases: 2 tau_x (dp_data), Thm 6's or the kernel bound (dp_gradient)."""
        if self.noise == "dp_data":
            return data_sensitivity(self.tau_x)
        if self._theorem6:
            return gradient_sensitivity(n_p, ny, gamma, self.tau_x, self.tau_y, self.tau_x + self.tau_y)
        if self.noise == "dp_gradient":
            return kernel_gradient_sensitivity(n_p, ny, gamma)
        return 0.0

    def _noisy(self, state: dict, g: np.ndarray) -> tuple[np.ndarray, float]:
        """g + sd z with z ~ N(0, I) from the client's own stream, written into g (the client's own fresh
        gradient, :func:`_add_scaled`); sd of the noise kind."""
        if self.noise == "heuristic":
            sd = self.beta * _entry_sd(g)
        elif self.noise == "dp_gradient":
            sd = self.noise_multiplier * state["sensitivity"]
        else:
            return g, 0.0
        if g.dtype == np.float32:         # dtype="float32": float32 normals from the client's own torch stream
            z = _float32_normals(state, self.seed, g.shape)
        else:
            z = state["rng"].standard_normal(g.shape)
        return _add_scaled(g, z, sd), sd

    def _y_sq(self, Y: np.ndarray) -> np.ndarray:
        """Squared row norms of the broadcast landmarks, computed once per broadcast (as :meth:`_yy_terms`)."""
        cached = self._ysq[0]
        if cached is None or cached[0] is not Y:
            self._ysq[0] = cached = (Y, np.einsum("ij,ij->i", Y, Y))    # in Y's dtype
        return cached[1]

    def _yy_terms(self, Y: np.ndarray, gamma: float):
        """Y-Y terms of Eqs. 10 and 13: a pure function of the broadcast, computed once per broadcast
        in this simulation (every client would compute the same values)."""
        cached = self._yy[0]
        if cached is None or cached[0] is not Y or cached[1] != gamma:
            self._yy[0] = cached = (Y, gamma, _yy_terms(Y, gamma))
        return cached[2]


class FedDLServer(Server):
    """Server of FedDL (Algorithm 1), :class:`fedlib.core.protocol.Server`.

    Round 1 is the set-up: an empty broadcast; from the uploads the server takes the weights w_p,
    gamma (:func:`kernel_width` or the given number), Y^0 ("moments": N(mean, diag var) of the pooled
    moments; "gaussian"; "uniform"; or an (n_y, m) array; drawn from ``default_rng(seed)``) and the step
    (``lr="auto"``: ``lr_scale``/L, :func:`lipschitz_bound`). Every later round broadcasts {"landmarks", "gamma",
    "lr"} and updates Y <- post(Y - server_lr sum_p w_p g_p) (Eq. 16) or post(sum_p w_p Y_p) (Eq. 15).
    ``result()`` = (Y^S, Y^0, step norms ||Y^s - Y^{s-1}||_F^2).

    Every upload is checked first (:meth:`expects`): the set-up's n_p an integer >= 1 and the moments or
    median its rules need; a round's (n_y, m) array in the run's dtype, finite, from a client of the
    set-up. A round that some set-up client misses (left out over Flower) weighs the others by their
    w_p renormalized to sum 1."""

    def __init__(self, n_landmarks: int, dim: int, *, mode: str = "gradient", weights: str = "size",
                 init="moments", gamma="median", lr="auto", lr_scale: float = 1.0, server_lr=None,
                 landmark_bounds=None, tau_y: float | None = None, seed: int = 0, dtype: str = "float64"):
        self.ny, self.dim, self.mode, self.weights_rule = n_landmarks, dim, mode, weights
        check_choice("dtype", dtype, DTYPES)
        self.dtype = dtype
        self.init, self.gamma, self.lr, self.lr_scale, self.server_lr = init, gamma, lr, lr_scale, server_lr
        self.landmark_bounds, self.tau_y = landmark_bounds, tau_y
        self.rng = np.random.default_rng(seed)
        self.Y = self.Y0 = None
        self.steps: list[float] = []
        self.setup_bytes = 0
        self.clients: list[str] = []   # the set-up round's senders, in the order of ``w``

    def broadcast(self) -> Message:
        if self.Y is None:
            return EMPTY
        return Message("server", {"landmarks": self.Y, "gamma": self.gamma, "lr": self.lr})

    def expects(self) -> uploads.Expected:
        if self.Y is None:
            form: dict = {"n": uploads.Number(low=1, integer=True)}
            if (isinstance(self.init, str) and self.init == "moments") or self.gamma == "moments":
                form.update(sum=uploads.Tensor(("m",), array="numpy"),
                            sumsq=uploads.Tensor(("m",), array="numpy", low=0.0))
            if isinstance(self.gamma, str) and self.gamma == "median":
                form["median_sqdist"] = uploads.Number(low=0.0)
            return uploads.Expected((form,), {"m": self.dim}, what="FedDL set-up upload")
        entry = uploads.Tensor((self.ny, self.dim), (self.dtype,), array="numpy")
        return uploads.Expected(({"gradient" if self.mode == "gradient" else "landmarks": entry},),
                                senders=set(self.clients), what="FedDL upload")

    def absorb(self, messages: list[Message]) -> None:
        if self.Y is None:
            self._setup(messages)
            return
        w = self._round_weights(messages)
        w = w if self.dtype == "float64" else [float(wp) for wp in w]   # float32: stays float32
        if self.mode == "gradient":
            Y_new = _weighted_sum([msg["gradient"] for msg in messages], [-float(self.server_lr) * wp for wp in w])
            Y_new += self.Y
        else:
            Y_new = _weighted_sum([msg["landmarks"] for msg in messages], w)
        Y_new = _post(Y_new, self.landmark_bounds, self.tau_y)
        if self.dtype == "float64":
            self.steps.append(float(((Y_new - self.Y) ** 2).sum()))
        else:
            Y_new = Y_new.astype(np.float32, copy=False)
            self.steps.append(float(np.square(Y_new - self.Y).sum(dtype=np.float64)))
        self.Y = Y_new

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Y^S, Y^0, step norms); landmarks as float64 whatever ``dtype`` (the Nystrom step computes in float64)."""
        return np.asarray(self.Y, dtype=np.float64), np.asarray(self.Y0, dtype=np.float64), np.array(self.steps)

    def _round_weights(self, messages: list[Message]):
        """w_p of this round's senders: ``w`` itself when every set-up client answered (in order), else
        their w_p renormalized to sum 1."""
        if [m.sender for m in messages] == self.clients:
            return self.w
        index = {name: p for p, name in enumerate(self.clients)}
        w = np.array([self.w[index[m.sender]] for m in messages])
        return w / w.sum()

    def _setup(self, messages: list[Message]) -> None:
        self.clients = [msg.sender for msg in messages]
        self.setup_bytes = sum(msg.nbytes for msg in messages)
        self.w = _client_weights(np.array([msg["n"] for msg in messages], dtype=np.float64), self.weights_rule)
        if isinstance(self.gamma, str):
            self.gamma = kernel_width(self.gamma, messages, self.weights_rule)
        ny, m = self.ny, self.dim
        if isinstance(self.init, np.ndarray):
            Y = self.init.copy()
        elif self.init == "moments":
            mean, var = _pooled_moments(messages)
            Y = mean + np.sqrt(var) * self.rng.standard_normal((ny, m))
        elif self.init == "gaussian":
            Y = self.rng.standard_normal((ny, m))
        else:
            Y = self.rng.uniform(0.0, 1.0, (ny, m))
        self.Y = _post(Y, self.landmark_bounds, self.tau_y)
        if self.dtype == "float32":       # Y^0 drawn in float64 (the same draw as float64), then rounded
            self.Y = self.Y.astype(np.float32)
        self.Y0 = self.Y.copy()
        self.lr = self.lr_scale / lipschitz_bound(self.gamma, ny) if self.lr == "auto" else self.lr
        self.server_lr = self.lr if self.server_lr is None else self.server_lr


def _check_dp_options(noise, init, gamma, tau_x, tau_y, dp_sensitivity, dp_accountant, landmark_bounds):
    """The DP-specific checks of :func:`feddl` (all before any work)."""
    check_choice("dp_sensitivity", dp_sensitivity, DP_SENSITIVITIES)
    check_choice("dp_accountant", dp_accountant, privacy.ACCOUNTANTS)
    if tau_x is not None:
        tau_x = check_positive("tau_x", tau_x)
    if tau_y is not None:
        tau_y = check_positive("tau_y", tau_y)
    if landmark_bounds is not None:
        try:
            lo, hi = (float(v) for v in landmark_bounds)
        except (TypeError, ValueError):
            raise ValueError(f"landmark_bounds must be None or (low, high), got {landmark_bounds!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"landmark_bounds must be finite with low < high, got {landmark_bounds!r}")
        landmark_bounds = (lo, hi)
    if noise == "dp_data" and tau_x is None:
        raise ValueError("noise='dp_data' needs tau_x, a PUBLIC bound on the row norm (rows are clipped to it); "
                         "the data's observed max norm would be a release of its own")
    if noise == "dp_gradient":
        if isinstance(gamma, str):
            raise ValueError(f"noise='dp_gradient' needs gamma as a public number; the rule gamma={gamma!r} is "
                             "computed from the clients' data and would be released without noise")
        if isinstance(init, str) and init == "moments":
            raise ValueError("noise='dp_gradient' needs a data-free init ('gaussian', 'uniform' or a public array); "
                             "init='moments' releases the clients' first and second moments")
        if dp_sensitivity == "theorem6" and (tau_x is None or tau_y is None):
            raise ValueError("dp_sensitivity='theorem6' needs public tau_x (rows are clipped to it) and tau_y "
                             "(landmarks are projected into ||Y||_2 <= tau_y)")
    return tau_x, tau_y, landmark_bounds


def _check_feddl_args(client_data, n_landmarks, rounds, local_steps, mode, lr, server_lr, weights, init, gamma,
                      noise, beta, epsilon, delta, tau_x, tau_y, dp_sensitivity, dp_accountant, landmark_bounds,
                      median_points, dtype="float64", lr_scale=1.0) -> dict:
    """Every check of :func:`feddl`, before any work; returns the checked values."""
    check_choice("dtype", dtype, DTYPES)
    data = _check_clients(client_data)
    m = data[0].shape[1]
    ny = check_int("n_landmarks", n_landmarks, 2)
    Q = check_int("local_steps", local_steps, 1)
    check_choice("mode", mode, MODES)
    if mode == "gradient" and Q != 1:
        raise ValueError(f"local_steps={Q}: gradient mode (Eq. 16) uploads one gradient per round; use "
                         "mode='average' for Q > 1 local steps")
    check_choice("weights", weights, WEIGHTS)
    check_choice("noise", noise, NOISES)
    if isinstance(init, str):
        check_choice("init", init, INITS)
    else:
        init = _as_matrix("init", init, m)
        if init.shape != (ny, m):
            raise ValueError(f"init array must have shape (n_landmarks, m) = {(ny, m)}, got {init.shape}")
    if isinstance(gamma, str):
        check_choice("gamma", gamma, GAMMA_RULES)
    else:
        gamma = check_positive("gamma", gamma)
    if not (isinstance(lr, str) and lr == "auto"):
        if isinstance(lr, str):
            raise ValueError(f"lr must be a float > 0 or 'auto', got {lr!r}")
        lr = check_positive("lr", lr)
    lr_scale = check_positive("lr_scale", lr_scale)
    if lr_scale != 1.0 and lr != "auto":
        raise ValueError(f"lr_scale={lr_scale} scales lr='auto' (lr_scale / L) only; with lr={lr} leave it at 1")
    if noise in DP_MECHANISMS:
        epsilon, delta = _check_epsilon_delta(epsilon, delta)
    tau_x, tau_y, landmark_bounds = _check_dp_options(noise, init, gamma, tau_x, tau_y, dp_sensitivity,
                                                      dp_accountant, landmark_bounds)
    return dict(data=data, ny=ny, S=check_int("rounds", rounds, 1), Q=Q, init=init, gamma=gamma, lr=lr,
                lr_scale=lr_scale,
                server_lr=None if server_lr is None else check_positive("server_lr", server_lr),
                beta=check_positive("beta", beta, strict=False), epsilon=epsilon, delta=delta, tau_x=tau_x,
                tau_y=tau_y, landmark_bounds=landmark_bounds,
                median_points=check_int("median_points", median_points, 2))


def feddl(client_data: Sequence, n_landmarks: int = 500, *, rounds: int = 100, local_steps: int = 1,
          mode: str = "gradient", lr: float | str = "auto", lr_scale: float = 1.0,
          server_lr: float | None = None, weights: str = "size", init: str | np.ndarray = "moments",
          gamma: float | str = "median",
          noise: str = "none", beta: float = 1.0, epsilon: float | None = None, delta: float | None = None,
          tau_x: float | None = None, tau_y: float | None = None, dp_sensitivity: str = "kernel",
          dp_accountant: str = "pld", landmark_bounds: tuple | None = None, median_points: int = 1000,
          seed: int = 0, progress: bool = False, dtype: str = "float64") -> FedDLResult:
    """Federated distribution learning (Algorithm 1): fit n_y landmarks to the union of the clients'
    data by minimizing F(Y) = sum_p w_p MMD_u^2(X_p, Y) (Eqs. 8-16), run as :class:`FedDLClient` and
    :class:`FedDLServer` by :func:`fedlib.core.protocol.simulate` (one set-up round, then ``rounds``).

    client_data: P arrays (n_p, m), n_p >= 2. Options (defaults = notes Sec. 2.8 DECIDE):

    * ``mode``: "gradient" (Eq. 16, one gradient per client per round; ``local_steps`` must be 1) or
      "average" (Eqs. 14-15, ``local_steps`` = Q local steps, then weighted landmark averaging).
    * ``weights``: "size" (w_p = n_p/n, Thm 1) or "uniform" (w_p = 1/P, Alg. 1).
    * ``lr``: client step (and server step ``server_lr`` in gradient mode, default = lr); "auto" =
      ``lr_scale``/L with L the data-free bound of :func:`lipschitz_bound` (the paper's "reverse of the
      Lipschitz constant"; the bound is above the constant, so lr_scale > 1 can still descend).
    * ``init``: "moments" (Y^0 ~ N(mu, diag v) with the exact pooled mean/variance from client sums
      and sums of squares: leaks first and second moments), "gaussian" (N(0, I), data-free),
      "uniform" (U[0, 1]^m, data-free, for pixel data) or an (n_y, m) array.
    * ``gamma``: a float or a rule of :func:`kernel_width`: "median" (each client reveals the median
      squared distance within its own data, on <= ``median_points`` rows; under label skew
      within-client medians are smaller than the pooled one) or "moments" (from the pooled moments).
    * ``noise`` (Sec. 5; the guarantee is (epsilon, delta)-DP per client under replace-one adjacency,
      client sizes n_p public):

      - "none";
      - "dp_data" (Thm 4): rows clipped to the public ``tau_x``, then N(0, s^2) once with s from the
        analytic Gaussian mechanism for Delta = 2 tau_x; every later upload (median/moments set-up,
        gradients, distances) is post-processing of the perturbed data;
      - "dp_gradient" (Thm 6's setting): every gradient a client computes (T = S*Q) gets N(0, s_p^2),
        s_p = z Delta_p with z calibrated by ``dp_accountant`` ("pld" or "rdp") for T compositions.
        ``dp_sensitivity="kernel"``: Delta_p = :func:`kernel_gradient_sensitivity`, data-free, needs no
        bound. ``"theorem6"``: Delta_p = :func:`gradient_sensitivity` with rows clipped to ``tau_x`` and
        Y projected into ||Y||_2 <= ``tau_y`` at every iterate (Upsilon = tau_x + tau_y). gamma must be a
        public number and init data-free (else ValueError). Only n_p is uploaded at set-up. The later
        distance upload (Alg. 2) is NOT covered: see :func:`reconstruct_from_sq_distances`;
      - "heuristic" (the paper's experiments, Sec. 6.1): sd = ``beta`` x sd(grad f_p); data-dependent,
        no guarantee (``epsilon`` = inf).

    * ``landmark_bounds``: (low, high) or None; the server clips every landmark coordinate into this
      public box after each update (post-processing: no privacy cost).

    * ``dtype``: "float64" (default) or "float32": the arithmetic of the rounds. float32: the clients'
      gradients (Eq. 13), the broadcast landmarks, the uploads (half the bytes) and the gradient noise
      (float32 normals from the client's own torch stream ("feddl", p)); Y^0 is the float64 draw rounded,
      F(Y) is summed in float64 and the result's landmarks are float64 (the later steps compute in
      float64). About 1.8x faster per round at n_y = 200, m = 784; the landmarks differ from float64's by
      ~1e-6 relative after 50 noise-free rounds (tests/test_fedtsne.py).

    Randomness: Y^0 from ``default_rng(seed)`` (the server), client p's noise from
    :func:`client_rng` (float32: its torch stream) and its median subsample from :func:`median_seed`. ``progress`` shows a tqdm bar
    over the rounds. Returns a :class:`FedDLResult` (landmarks (n_y, m), per-round objective, measured
    :class:`~fedlib.core.messages.Cost`, epsilon spent).
    """
    run = FedDLRun.start(client_data, n_landmarks, rounds=rounds, local_steps=local_steps, mode=mode, lr=lr,
                          lr_scale=lr_scale, server_lr=server_lr, weights=weights, init=init, gamma=gamma,
                          noise=noise, beta=beta,
                          epsilon=epsilon, delta=delta, tau_x=tau_x, tau_y=tau_y, dp_sensitivity=dp_sensitivity,
                          dp_accountant=dp_accountant, landmark_bounds=landmark_bounds, median_points=median_points,
                          seed=seed, dtype=dtype)
    run.advance(run.planned, progress)
    return run.result()


@dataclass
class FedDLRun:
    """One FedDL run in progress: the client program, the server, the clients' states and the cost so
    far. :meth:`advance` runs more rounds of the protocol (the first call adds the set-up round), so a
    run can be continued exactly as one long run (:func:`feddl_until_plateau`)."""

    data: list
    client: FedDLClient
    server: FedDLServer
    states: ClientStates
    planned: int
    options: dict
    cost: Cost = field(default_factory=Cost)
    final_objective: tuple | None = None      # (S, F(Y^S)) once evaluated

    @classmethod
    def start(cls, client_data, n_landmarks, *, rounds, local_steps, mode, lr, server_lr, weights, init, gamma,
              noise, beta, epsilon, delta, tau_x, tau_y, dp_sensitivity, dp_accountant, landmark_bounds,
              median_points, seed, dtype="float64", lr_scale=1.0) -> "FedDLRun":
        a = _check_feddl_args(client_data, n_landmarks, rounds, local_steps, mode, lr, server_lr, weights, init,
                              gamma, noise, beta, epsilon, delta, tau_x, tau_y, dp_sensitivity, dp_accountant,
                              landmark_bounds, median_points, dtype, lr_scale)
        data, S, Q, delta = a["data"], a["S"], a["Q"], a["delta"]
        theorem6 = noise == "dp_gradient" and dp_sensitivity == "theorem6"
        # public, data-free calibration: the data-noise sd (Thm 4) or the multiplier z of T = S Q releases (Thm 6)
        data_sd = z_mult = 0.0
        if noise == "dp_data":
            data_sd = privacy.analytic_gaussian_sigma(a["epsilon"], delta, data_sensitivity(a["tau_x"]))
            z_mult = data_sd / data_sensitivity(a["tau_x"])
        elif noise == "dp_gradient":
            z_mult = privacy.calibrate_noise_multiplier(a["epsilon"], delta, S * Q, dp_accountant)
        need = tuple(name for name, used in [("moments", (isinstance(a["init"], str) and a["init"] == "moments")
                                              or a["gamma"] == "moments"), ("median", a["gamma"] == "median")] if used)
        client = FedDLClient(seed=seed, mode=mode, local_steps=Q, noise=noise, beta=a["beta"], data_sd=data_sd,
                             noise_multiplier=z_mult, tau_x=a["tau_x"], tau_y=a["tau_y"],
                             dp_sensitivity=dp_sensitivity, landmark_bounds=a["landmark_bounds"], setup=need,
                             median_points=a["median_points"], dtype=dtype)
        server = FedDLServer(a["ny"], data[0].shape[1], mode=mode, weights=weights, init=a["init"], gamma=a["gamma"],
                             lr=a["lr"], lr_scale=a["lr_scale"], server_lr=a["server_lr"],
                             landmark_bounds=a["landmark_bounds"],
                             tau_y=a["tau_y"] if theorem6 else None, seed=seed, dtype=dtype)
        options = dict(noise=noise, mode=mode, Q=Q, data_sd=data_sd, z_mult=z_mult, delta=delta, tau_x=a["tau_x"],
                       dp_sensitivity=dp_sensitivity, dp_accountant=dp_accountant)
        return cls(data, client, server, ClientStates(client), S, options)

    def advance(self, rounds: int, progress: bool = False) -> None:
        """Run ``rounds`` more rounds (after the set-up round when none ran yet)."""
        setup = 1 if self.server.Y is None else 0
        self.cost = self.cost + simulate(self.server, self.client, self.data, rounds + setup, states=self.states,
                                         progress=progress, desc="FedDL rounds")

    def reported_objective(self, start: int = 0) -> list[float]:
        """F(Y^s) = sum_p w_p f_p(Y^s) (Eq. 11) for s = start..S-1: the values the clients computed in
        rounds s+1 (their diagnostics, not uploads)."""
        clients = [self.states[p]["objective"][start:] for p in range(len(self.data))]
        return [float(np.dot(self.server.w, f)) for f in zip(*clients)]

    def objective(self) -> np.ndarray:
        """F(Y^s), s = 0..S so far: :meth:`reported_objective` and F(Y^S), evaluated by the clients once per
        S (a plateau check and :meth:`result` at the same round share it)."""
        S = len(self.server.steps)
        if self.final_objective is None or self.final_objective[0] != S:
            clients = [self.states[p] for p in range(len(self.data))]
            Y, gamma = np.asarray(self.server.Y, dtype=np.float64), float(self.server.gamma)
            self.final_objective = (S, float(np.dot(self.server.w,
                                                    [self.client.objective(st, Y, gamma) for st in clients])))
        return np.array(self.reported_objective() + [self.final_objective[1]])

    def result(self) -> FedDLResult:
        o, P = self.options, len(self.data)
        noise, delta, Q = o["noise"], o["delta"], o["Q"]
        Y, Y0, steps = self.server.result()
        S = len(steps)
        clients = [self.states[p] for p in range(P)]
        cost = self.cost                      # Y^S goes out with the Nystrom step (NystromServer), counted there
        sens = np.array([st["sensitivity"] for st in clients]) if noise in DP_MECHANISMS else np.zeros(P)
        noise_sd = {"none": np.zeros(0), "dp_data": np.full(P, o["data_sd"])}.get(
            noise, np.array([st["noise_sd"] for st in clients]).T.reshape(S, P))
        spent, ledger = _privacy_ledger(noise, o["z_mult"], o["data_sd"], sens, delta, self.planned * Q, o["tau_x"],
                                        o["dp_sensitivity"], o["dp_accountant"])
        return FedDLResult(landmarks=Y, init_landmarks=Y0, objective=self.objective(), step_sq_norms=steps,
                           gamma=float(self.server.gamma), weights=self.server.w, lr=float(self.server.lr),
                           server_lr=float(self.server.server_lr), mode=o["mode"], local_steps=Q, noise=noise,
                           noise_sd=noise_sd, upload_bytes=int(cost.bytes_up),
                           setup_upload_bytes=int(self.server.setup_bytes), broadcast_bytes=int(cost.bytes_down),
                           seconds=cost.seconds, client_data=[st["data"] for st in clients], epsilon=float(spent),
                           delta=None if noise not in DP_MECHANISMS else float(delta),
                           noise_multiplier=float(o["z_mult"]), sensitivity=sens,
                           accountant=o["dp_accountant"] if noise == "dp_gradient" else
                           ("analytic" if noise == "dp_data" else None), privacy_ledger=ledger, cost=cost)


def _resolve_gamma_only(data: list[np.ndarray], rule: str, weights: str, median_points: int, seed: int) -> float:
    """gamma exactly as :func:`feddl` resolves it (the same set-up uploads, :func:`kernel_width`),
    without running FedDL."""
    client = FedDLClient(seed=seed, setup=(rule,), median_points=check_int("median_points", median_points, 2))
    states = ClientStates(client)
    return kernel_width(rule, [client.step(x, states[p], EMPTY) for p, x in enumerate(data)], weights)


def plateau_share(objective, end: int | None = None, window: float = 0.1, min_window: int = 10) -> float:
    """Share of FedDL's total decrease of F made in the last rounds before round ``end``:

        (F[end - w] - F[end]) / (F[0] - F[end]),    w = max(ceil(window * end), min_window),

    for objective = (F(Y^0), ..., F(Y^S)) (``FedDLResult.objective``; F can be negative, so the
    change is measured against the total decrease, not against |F|). ``end`` defaults to S. NaN
    when fewer than w rounds ran; inf when F did not decrease."""
    F = np.asarray(objective, dtype=np.float64).ravel()
    end = len(F) - 1 if end is None else check_int("end", end, 1)
    if end >= len(F):
        raise ValueError(f"end must be <= {len(F) - 1} (the rounds in objective), got {end}")
    window = check_fraction("window", window)
    min_window = check_int("min_window", min_window, 1)
    w = max(math.ceil(window * end), min_window)
    if w > end:
        return math.nan
    total = F[0] - F[end]
    if not total > 0:
        return math.inf
    return float((F[end - w] - F[end]) / total)


def plateau_round(objective, tol: float = 0.01, window: float = 0.1, min_window: int = 10) -> int | None:
    """The first round S at which FedDL's objective has plateaued: :func:`plateau_share` <= ``tol``
    (the last max(10 %, ``min_window``) rounds made at most ``tol`` of the total decrease). None if
    no round of ``objective`` qualifies."""
    tol = check_positive("tol", tol)
    F = np.asarray(objective, dtype=np.float64).ravel()
    for end in range(1, len(F)):
        share = plateau_share(F, end, window, min_window)
        if np.isfinite(share) and share <= tol:
            return end
    return None


@dataclass
class FedDLTrace:
    """:func:`feddl_until_plateau`: ``result`` = the run as one :class:`FedDLResult` (landmarks,
    Y^0, per-round objective and step norms, bytes as one long run would count them), ``landmarks``
    {round: (n_y, m)} at round 0, the checkpoints and S, ``plateau`` (first round meeting the rule, or
    None), ``rounds`` = S run."""

    result: FedDLResult
    landmarks: dict
    plateau: int | None
    rounds: int

    @property
    def objective(self) -> np.ndarray:
        return self.result.objective

    @property
    def gamma(self) -> float:
        return self.result.gamma

    @property
    def seconds(self) -> float:
        return self.result.seconds


def feddl_until_plateau(client_data: Sequence, n_landmarks: int = 500, *, tol: float = 0.01, window: float = 0.1,
                        min_window: int = 10, check_every: int = 25, max_rounds: int = 1000,
                        checkpoints: Sequence[int] = (), stop_at_plateau: bool = True, seed: int = 0,
                        **feddl_kwargs) -> FedDLTrace:
    """Noise-free FedDL run until it is on its plateau or ``max_rounds`` (always ``max_rounds`` with
    ``stop_at_plateau=False``; the plateau is then only reported). At every multiple s of
    ``check_every`` the run stops when :func:`plateau_share` is <= ``tol`` at rounds s - 1 and s: the
    first from the values F(Y^0), ..., F(Y^{s-1}) the clients reported with rounds 1..s (their
    diagnostics), the second, evaluated only then, with F(Y^s). So the run ends after its plateau round
    (``plateau``, :func:`plateau_round`; with ``check_every=1`` usually one round after) and meets the
    rule at its last round. ONE run of the protocol, advanced chunk by chunk (the server and the
    clients keep their state between chunks): objective, step norms and measured cost are those of one
    long :func:`feddl` run. Landmarks are kept at round 0, every round in ``checkpoints`` (<= max_rounds)
    and the last round. Other keywords go to :func:`feddl`. Returns a :class:`FedDLTrace`."""
    if feddl_kwargs.get("noise", "none") != "none":
        raise ValueError("feddl_until_plateau runs noise-free FedDL only (noise='none'); a noisy objective has "
                         "no plateau to detect")
    if "rounds" in feddl_kwargs:
        raise ValueError("rounds is set by feddl_until_plateau (max_rounds, check_every)")
    options = {name: par.default for name, par in inspect.signature(feddl).parameters.items()
               if par.default is not inspect.Parameter.empty and name != "n_landmarks"}
    unknown = set(feddl_kwargs) - set(options)
    if unknown:
        raise TypeError(f"unknown FedDL keyword(s): {sorted(unknown)}")
    options.update(feddl_kwargs, rounds=max_rounds, seed=seed)
    progress = options.pop("progress")
    check_every = check_int("check_every", check_every, 1)
    max_rounds = check_int("max_rounds", max_rounds, 1)
    check_positive("tol", tol)
    stops = sorted({int(c) for c in checkpoints} | set(range(check_every, max_rounds + 1, check_every))
                   | {max_rounds})
    if stops[0] < 1 or stops[-1] > max_rounds:
        raise ValueError(f"checkpoints must lie in 1..max_rounds={max_rounds}, got {sorted(checkpoints)}")

    def settled(F, end: int) -> bool:
        share = plateau_share(F, end, window, min_window) if end >= 1 else math.nan
        return math.isfinite(share) and share <= tol

    keep = {int(c) for c in checkpoints}
    run = FedDLRun.start(client_data, n_landmarks, **options)
    done, kept, reported = 0, {}, []
    for stop in stops:
        run.advance(stop - done, progress)
        kept.setdefault(0, np.asarray(run.server.Y0, dtype=np.float64))    # float64 whatever dtype (as result())
        checked, done = len(reported), stop
        if done in keep:
            kept[done] = np.asarray(run.server.Y, dtype=np.float64)
        if stop_at_plateau and (done % check_every == 0 or done == max_rounds):
            reported += run.reported_objective(checked)          # F(Y^0), ..., F(Y^{done-1})
            if settled(reported, done - 1) and settled(run.objective(), done):
                break
    kept[done] = np.asarray(run.server.Y, dtype=np.float64)
    result = run.result()
    return FedDLTrace(result=result, landmarks=kept, plateau=plateau_round(result.objective, tol, window, min_window),
                      rounds=done)


def plateau_run(client_data: Sequence, n_landmarks: int, *, max_rounds: int = 1000, seed: int = 0,
                **feddl_kwargs) -> FedDLResult:
    """Noise-free FedDL run until its objective plateaus (:func:`feddl_until_plateau`, keywords passed on):
    the :class:`FedDLResult` of its S = ``result.rounds`` rounds, the same run as :func:`feddl` with
    ``rounds=S`` (so callers can reuse it); raises RuntimeError naming ``max_rounds`` when it has not
    plateaued within them."""
    trace = feddl_until_plateau(client_data, n_landmarks, max_rounds=max_rounds, seed=seed, **feddl_kwargs)
    if trace.plateau is None:
        raise RuntimeError(f"FedDL did not plateau within max_rounds={max_rounds}: raise max_rounds")
    return trace.result


def plateau_rounds(client_data: Sequence, n_landmarks: int, *, max_rounds: int = 1000, seed: int = 0,
                   **feddl_kwargs) -> int:
    """Rounds S after which noise-free FedDL's objective has plateaued (:func:`plateau_run`);
    raises RuntimeError naming ``max_rounds`` when it has not within them."""
    return plateau_run(client_data, n_landmarks, max_rounds=max_rounds, seed=seed, **feddl_kwargs).rounds


def public_landmarks(X_public, n_landmarks: int, seed: int, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    """Data-free Y^0 (n_y, m) from a PUBLIC sample (n_pub, m): N(mean, diag sd^2) of the public rows,
    clipped into [low, high] (pixels), drawn from stream ("public_landmarks",) of ``seed``."""
    X_public = _as_matrix("X_public", X_public)
    r = seeds.rng(seed, "public_landmarks")
    return np.clip(X_public.mean(0) + X_public.std(0) * r.standard_normal((check_int("n_landmarks", n_landmarks, 2),
                                                                           X_public.shape[1])), low, high)
