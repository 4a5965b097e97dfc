"""Federated distribution learning and the Nystrom step of Fed-tSNE / Fed-UMAP (Qiao et al. 2025).

FedDL (Algorithm 1) learns n_y landmarks Y (n_y, m) that every client's data X_p (n_p, m) is close to in
MMD: the server minimizes F(Y) = sum_p w_p f_p(Y) (Eq. 11), f_p the unbiased MMD^2 of Eq. 10 with the
Gaussian kernel k(a, b) = exp(-gamma ||a - b||^2):

    f_p(Y) = (1^T K_XX 1 - n_p) / (n_p (n_p-1)) - 2 1^T K_XY 1 / (n_p n_y) + (1^T K_YY 1 - n_y) / (n_y (n_y-1))
    grad f_p(Y) = -4 gamma/(n_p n_y) [K_XY^T X_p - diag(1^T K_XY) Y]
                  + 4 gamma/(n_y (n_y-1)) [K_YY Y - diag(1^T K_YY) Y]                         (Eq. 13)

Each round every client uploads its gradient (Eq. 13, "gradient" mode; the server steps Y <- Y - lr
sum_p w_p g_p, Eq. 16) or its landmarks after Q local steps (Eq. 14, "average" mode; Y <- sum_p w_p Y_p,
Eq. 15), with noise for the "+" variants (Theorems 4, 6; :mod:`fedlib.fedtsne.dp`). Then (Algorithm 2)
each client uploads its squared distances to the landmarks B_p (n_p, n_y) and the server estimates all
squared distances by Nystrom, D2 ~ B W^+ B^T with W the landmarks' own (Eqs. 21-22); Algorithm 3 does
the same with kernels.

``FedDLClient(fast=True)`` / ``FedDLServer(fast=True)`` (the defaults) compute the same quantities with
the caching and in-place arithmetic of :mod:`fedlib.fedtsne.speed`; ``fast=False`` runs what is written here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from fedlib.core import seeds, uploads
from fedlib.core.messages import Message
from fedlib.core.protocol import EMPTY, Server
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.fedtsne import speed
from fedlib.fedtsne.dp import (clip_rows, data_sensitivity, gradient_sensitivity, kernel_gradient_sensitivity,
                               project_spectral)
from fedlib.fedtsne.mmd import (as_matrix, client_median_sqdist, client_weights, gaussian_kernel, kernel_width,
                                pooled_moments, sq_distances)
from fedlib.fedtsne.nystrom import BLOCK_BYTES, NYSTROM_KINDS, distances_from_squared, nystrom, nystrom_knn

MODES = ("gradient", "average")
DTYPES = ("float64", "float32")


def mmd2_u(X, Y, gamma: float) -> float:
    """Unbiased MMD^2 f(Y) of Eq. 10 between X (n, m) and Y (n_y, m); n, n_y >= 2."""
    X, Y = as_matrix("X", X), as_matrix("Y", Y)
    if len(X) < 2 or len(Y) < 2:
        raise ValueError(f"mmd2_u needs >= 2 rows in X and in Y, got {len(X)} and {len(Y)}")
    n, ny = len(X), len(Y)
    kxx, kxy, kyy = gaussian_kernel(X, None, gamma), gaussian_kernel(X, Y, gamma), gaussian_kernel(Y, None, gamma)
    return (kxx.sum() - n) / (n * (n - 1)) - 2 * kxy.sum() / (n * ny) + (kyy.sum() - ny) / (ny * (ny - 1))


def mmd2_u_grad(X, Y, gamma: float) -> np.ndarray:
    """Gradient of Eq. 10 with respect to the landmarks (Eq. 13): X (n, m), Y (n_y, m) -> (n_y, m)."""
    X, Y = as_matrix("X", X), as_matrix("Y", Y, np.shape(X)[1])
    if len(Y) < 2:
        raise ValueError(f"n_landmarks must be >= 2, got {len(Y)}")
    n, ny = len(X), len(Y)
    kxy, kyy = gaussian_kernel(X, Y, gamma), gaussian_kernel(Y, None, gamma)
    attraction = kxy.T @ X - kxy.sum(0)[:, None] * Y
    repulsion = kyy @ Y - kyy.sum(0)[:, None] * Y
    return -4 * gamma / (n * ny) * attraction + 4 * gamma / (ny * (ny - 1)) * repulsion


def post_process(Y: np.ndarray, landmark_bounds, tau_y) -> np.ndarray:
    """Public post-processing of landmarks: clip into the box ``landmark_bounds``, then (Theorem 6)
    project into ||Y||_2 <= ``tau_y`` (None: skipped)."""
    if landmark_bounds is not None:
        Y = np.clip(Y, *landmark_bounds)
    if tau_y is not None:
        Y = project_spectral(Y, tau_y)
    return Y


def client_rng(seed: int, p: int) -> np.random.Generator:
    """Client p's private generator in a FedDL run of ``seed`` (its noise draws): stream ("feddl", p)."""
    return seeds.rng(seed, "feddl", p)


def median_seed(seed: int, p: int) -> int:
    """Seed of client p's subsample for the median rule: stream ("median", p) of ``seed``."""
    return seeds.derive_seed(seed, "median", p)


@dataclass(frozen=True)
class FedDLClient:
    """Client program of FedDL (Algorithm 1). Holds only the run's PUBLIC configuration; client p's memory
    is its ``state`` (its generator, the data it holds after clipping / perturbation, its diagnostics).

    ``step(X_p, state, broadcast)``: set-up (empty broadcast): clip rows to ``tau_x`` ("dp_data",
    "theorem6") and, under "dp_data", add N(0, ``data_sd``^2) once (Theorem 4); upload {"n": n_p} plus
    what ``setup`` names ("moments": "sum", "sumsq" (m,); "median": "median_sqdist"). A round (broadcast
    {"landmarks" Y, "gamma", "lr"}): grad f_p(Y) (Eq. 13) plus noise; "gradient" mode uploads it,
    "average" mode runs Q local steps Y_p <- post(Y_p - lr grad f_p(Y_p)) (Eq. 14) and uploads Y_p.
    f_p(Y) and the noise sd are kept in ``state`` as diagnostics, never uploaded."""

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
    fast: bool = True
    cache: speed.RoundCache = field(default_factory=speed.RoundCache, init=False, repr=False, compare=False)

    def init_state(self, k: int) -> dict:
        return {"k": k, "rng": client_rng(self.seed, k), "data": None, "objective": [], "noise_sd": []}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        if "landmarks" not in broadcast.payload:
            return Message(f"client{state['k']}", self._setup(self._held(data, state), state))
        return self.round(state, broadcast)

    def step_many(self, datas: Sequence, states: Sequence[dict], broadcast: Message) -> list[Message]:
        """``[step(d, s, broadcast) ...]``; the fast path computes a round's distances for all at once."""
        uploads_ = speed.stacked_round(self, states, broadcast) if self.fast else None
        return uploads_ if uploads_ is not None else [self.step(d, s, broadcast) for d, s in zip(datas, states)]

    def round(self, state: dict, broadcast: Message, sq_dist: np.ndarray | None = None) -> Message:
        """One round's upload (Eq. 13 plus noise; Eq. 14's local steps in "average" mode)."""
        Y, gamma, lr = broadcast["landmarks"], broadcast["gamma"], broadcast["lr"]
        if "sensitivity" not in state:
            state["sensitivity"] = self._sensitivity(len(state["data"]), len(Y), gamma)
        value, g = self._terms(state, Y, gamma, sq_dist)
        state["objective"].append(value)
        g, sd_sum = self._noisy(state, g)
        sender = f"client{state['k']}"
        if self.mode == "gradient":
            state["noise_sd"].append(sd_sum)
            return Message(sender, {"gradient": g})
        tau_y = self.tau_y if self._theorem6 else None
        Yp = post_process(Y - lr * g, self.landmark_bounds, tau_y)
        for _ in range(self.local_steps - 1):
            g, sd = self._noisy(state, self._terms(state, Yp, gamma, fresh=True)[1])
            sd_sum += sd
            Yp = post_process(Yp - lr * g, self.landmark_bounds, tau_y)
        state["noise_sd"].append(sd_sum / self.local_steps)
        return Message(sender, {"landmarks": Yp})

    def _terms(self, state: dict, Y, gamma: float, sq_dist=None, fresh: bool = False):
        """(f_p(Y), grad f_p(Y)): Eqs. 10 and 13 (``fast``: the same, cached and in place)."""
        if not self.fast:
            return mmd2_u(state["data"], Y, gamma), mmd2_u_grad(state["data"], Y, gamma)
        return speed.client_terms(speed.RoundCache() if fresh else self.cache, state, Y, gamma,
                                  self.dtype == "float32", sq_dist)

    def objective(self, state: dict, Y: np.ndarray, gamma: float) -> float:
        """f_p(Y) (Eq. 10) on the data the client holds: a diagnostic, not an upload."""
        return speed.objective(state, Y, gamma) if self.fast else mmd2_u(state["data"], Y, gamma)

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
        """g + sd z, z ~ N(0, I) from the client's own stream; sd of the noise kind."""
        if self.noise == "heuristic":
            sd = self.beta * (speed.entry_sd(g) if self.fast else float(g.std()))
        elif self.noise == "dp_gradient":
            sd = self.noise_multiplier * state["sensitivity"]
        else:
            return g, 0.0
        if g.dtype == np.float32:         # dtype="float32": float32 normals from the client's own torch stream
            z = speed.float32_normals(state, self.seed, g.shape)
        else:
            z = state["rng"].standard_normal(g.shape)
        return (speed.add_scaled(g, z, sd) if self.fast else g + sd * z), sd


class FedDLServer(Server):
    """Server of FedDL (Algorithm 1). Round 1 is the set-up: an empty broadcast; from the uploads the server
    takes the weights w_p, gamma (:func:`~fedlib.fedtsne.mmd.kernel_width` or the given number), Y^0
    ("moments": N(mean, diag var) of the pooled moments; "gaussian"; "uniform"; or an (n_y, m) array; drawn
    from ``default_rng(seed)``) and the step (``lr="auto"``: ``lr_scale``/L, the Lipschitz bound). Every
    later round broadcasts {"landmarks", "gamma", "lr"} and updates Y <- post(Y - server_lr sum_p w_p g_p)
    (Eq. 16) or post(sum_p w_p Y_p) (Eq. 15). ``result()`` = (Y^S, Y^0, step norms ||Y^s - Y^{s-1}||_F^2).
    Uploads are checked first (:meth:`expects`); a round that some set-up client misses (left out over
    Flower) weighs the others by their w_p renormalized to sum 1."""

    def __init__(self, n_landmarks: int, dim: int, *, mode: str = "gradient", weights: str = "size",
                 init="moments", gamma="median", lr="auto", lr_scale: float = 1.0, server_lr=None,
                 landmark_bounds=None, tau_y: float | None = None, seed: int = 0, dtype: str = "float64",
                 fast: bool = True):
        check_choice("dtype", dtype, DTYPES)
        self.ny, self.dim, self.mode, self.weights_rule, self.dtype, self.fast = n_landmarks, dim, mode, weights, dtype, fast
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
        add = speed.weighted_sum if self.fast else (lambda arrays, ws: sum(wp * a for a, wp in zip(arrays, ws)))
        if self.mode == "gradient":      # Eq. 16
            Y_new = add([msg["gradient"] for msg in messages], [-float(self.server_lr) * wp for wp in w])
            Y_new += self.Y
        else:                            # Eq. 15
            Y_new = add([msg["landmarks"] for msg in messages], w)
        Y_new = post_process(Y_new, self.landmark_bounds, self.tau_y)
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
        self.w = client_weights(np.array([msg["n"] for msg in messages], dtype=np.float64), self.weights_rule)
        if isinstance(self.gamma, str):
            self.gamma = kernel_width(self.gamma, messages, self.weights_rule)
        ny, m = self.ny, self.dim
        if isinstance(self.init, np.ndarray):
            Y = self.init.copy()
        elif self.init == "moments":
            mean, var = pooled_moments(messages)
            Y = mean + np.sqrt(var) * self.rng.standard_normal((ny, m))
        elif self.init == "gaussian":
            Y = self.rng.standard_normal((ny, m))
        else:
            Y = self.rng.uniform(0.0, 1.0, (ny, m))
        self.Y = post_process(Y, self.landmark_bounds, self.tau_y)
        if self.dtype == "float32":       # Y^0 drawn in float64 (the same draw as float64), then rounded
            self.Y = self.Y.astype(np.float32)
        self.Y0 = self.Y.copy()
        self.lr = self.lr_scale / lipschitz_bound(self.gamma, ny) if self.lr == "auto" else self.lr
        self.server_lr = self.lr if self.server_lr is None else self.server_lr


def lipschitz_bound(gamma: float, n_landmarks: int) -> float:
    """Data-free bound L = (4 gamma/n_y)(n_y/(n_y-1) + 2 e^{-3/2}) on the Lipschitz constant of grad F;
    ``lr="auto"`` is 1/L."""
    check_positive("gamma", gamma)
    ny = check_int("n_landmarks", n_landmarks, 2)
    return 4.0 * gamma / ny * (ny / (ny - 1) + 2.0 * math.exp(-1.5))


# ------------------------------------------------------------------------------------------------
# the Nystrom step (Algorithm 2 step 3-4, Algorithm 3 step 3-4)
# ------------------------------------------------------------------------------------------------
def client_sq_distances(X_p, Y, sender: str = "client") -> Message:
    """Fed-tSNE/UMAP upload (Alg. 2 step 3): {"sq_distances": ||x_i - y_j||^2 (n_p, n_y)}."""
    return Message(sender, {"sq_distances": sq_distances(as_matrix("X_p", X_p), as_matrix("Y", Y))})


def client_kernel(X_p, Y, gamma: float, sender: str = "client") -> Message:
    """Fed-SpeClust upload (Alg. 3 step 3): {"kernel": K_{X_p,Y} (n_p, n_y)}."""
    return Message(sender, {"kernel": gaussian_kernel(as_matrix("X_p", X_p), as_matrix("Y", Y), gamma)})


def nystrom_distances(B_sq, W_sq, **inverse_kw) -> np.ndarray:
    """Alg. 2 step 4 on SQUARED distances (Eq. 22): sqrt(clip_0(B W^+ B^T)) with zero diagonal, (n, n)."""
    return distances_from_squared(nystrom(B_sq, W_sq, **inverse_kw))


def nystrom_kernel(C, W, **inverse_kw) -> np.ndarray:
    """Alg. 3 step 4: K_hat = clip_0(sym(C W^+ C^T)), (n, n)."""
    return np.maximum(nystrom(C, W, **inverse_kw), 0.0)


@dataclass(frozen=True)
class NystromClient:
    """Client program of the final upload: from the broadcast landmarks Y (n_y, m), client p uploads
    {"sq_distances": D_p (n_p, n_y)} (Alg. 2 step 3) or, for ``kind="kernel"``, {"kernel": K_{X_p,Y}}
    with the broadcast gamma (Alg. 3 step 3)."""

    kind: str = "distances"

    def init_state(self, k: int) -> dict:
        return {"k": k}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        sender = f"client{state['k']}"
        if self.kind == "distances":
            return client_sq_distances(data, broadcast["landmarks"], sender)
        return client_kernel(data, broadcast["landmarks"], broadcast["gamma"], sender)


class NystromServer(Server):
    """Server of the Nystrom step: broadcasts Y (and gamma for ``kind="kernel"``), stacks the clients'
    blocks B = [D_1; ...; D_P] (Eq. 21) and ``result()`` is the estimate in the clients' stacked row order:
    sqrt(clip_0(B W^+ B^T)) with W = D_YY (Eq. 22) or clip_0(C W^+ C^T) with W = K_YY (Alg. 3 step 4). With
    ``neighbors=k`` the server never forms the n x n estimate: ``result()`` is its k nearest neighbours
    (indices, values) (:func:`~fedlib.fedtsne.nystrom.nystrom_knn`). Keywords go to
    :func:`~fedlib.fedtsne.nystrom.landmark_pinv`. Each upload is checked first: one (n_p, n_y) float64
    block, finite, squared distances >= 0 or kernel values in [0, 1]."""

    def __init__(self, landmarks, kind: str = "distances", gamma: float | None = None, *,
                 neighbors: int | None = None, block_bytes: float = BLOCK_BYTES, **inverse_kw):
        check_choice("kind", kind, NYSTROM_KINDS)
        self.Y, self.kind, self.inverse_kw = as_matrix("landmarks", landmarks), kind, inverse_kw
        self.gamma = check_positive("gamma", gamma) if kind == "kernel" else None
        self.neighbors = None if neighbors is None else check_int("neighbors", neighbors, 1)
        self.block_bytes = check_positive("block_bytes", block_bytes)
        self.estimate = None

    def broadcast(self) -> Message:
        payload = {"landmarks": self.Y}
        if self.kind == "kernel":
            payload["gamma"] = self.gamma
        return Message("server", payload)

    def expects(self) -> uploads.Expected:
        key, high = ("sq_distances", None) if self.kind == "distances" else ("kernel", 1.0)
        entry = uploads.Tensor(("n", len(self.Y)), ("float64",), array="numpy", low=0.0, high=high)
        return uploads.Expected(({key: entry},), local=("n",), what="Nystrom upload")

    def absorb(self, messages: list[Message]) -> None:
        if self.kind == "distances":
            B, W = np.vstack([msg["sq_distances"] for msg in messages]), sq_distances(self.Y)   # Eq. 21
        else:
            B, W = np.vstack([msg["kernel"] for msg in messages]), gaussian_kernel(self.Y, None, self.gamma)
        if self.neighbors is not None:
            self.estimate = nystrom_knn(B, W, self.neighbors, self.kind, block_bytes=self.block_bytes,
                                        **self.inverse_kw)
        elif self.kind == "distances":
            self.estimate = nystrom_distances(B, W, **self.inverse_kw)                    # Eq. 22
        else:
            self.estimate = nystrom_kernel(B, W, **self.inverse_kw)

    def result(self):
        """The estimate (n, n), or with ``neighbors`` its (indices, values) (n, k), stacked row order."""
        return self.estimate
