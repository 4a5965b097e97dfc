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

from fedlib.core import privacy, seeds
from fedlib.core.messages import Cost
from fedlib.core.protocol import EMPTY, ClientStates, simulate
from fedlib.core.validate import check_choice, check_fraction, check_int, check_positive
from fedlib.fedtsne.algorithm import DTYPES, MODES, FedDLClient, FedDLServer
from fedlib.fedtsne.dp import DP_MECHANISMS, DP_SENSITIVITIES, check_epsilon_delta, data_sensitivity, privacy_ledger
from fedlib.fedtsne.mmd import GAMMA_RULES, WEIGHTS, as_matrix, check_clients, kernel_width

INITS = ("moments", "gaussian", "uniform")
NOISES = ("none", "dp_data", "dp_gradient", "heuristic")


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
    data = check_clients(client_data)
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
        init = as_matrix("init", init, m)
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
        epsilon, delta = check_epsilon_delta(epsilon, delta)
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
          seed: int = 0, progress: bool = False, dtype: str = "float64", fast: bool = True) -> FedDLResult:
    """Federated distribution learning (Algorithm 1): fit n_y landmarks to the union of the clients'
    data by minimizing F(Y) = sum_p w_p MMD_u^2(X_p, Y) (Eqs. 8-16), run as :class:`FedDLClient` and
    :class:`FedDLServer` by :func:`fedlib.core.protocol.simulate` (one set-up round, then ``rounds``).

    client_data: P arrays (n_p, m), n_p >= 2. Options (the defaults are our choices where the paper leaves one open):

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
      ~1e-6 relative after 50 noise-free rounds (tests/fedtsne/test_fedtsne.py).

    Randomness: Y^0 from ``default_rng(seed)`` (the server), client p's noise from
    :func:`client_rng` (float32: its torch stream) and its median subsample from :func:`median_seed`. ``progress`` shows a tqdm bar
    over the rounds. Returns a :class:`FedDLResult` (landmarks (n_y, m), per-round objective, measured
    :class:`~fedlib.core.messages.Cost`, epsilon spent). ``fast=False``: the clients and the server compute as
    :mod:`fedlib.fedtsne.algorithm` writes the equations, without :mod:`fedlib.fedtsne.speed` (float64 only).
    """
    if not fast and dtype != "float64":
        raise ValueError("dtype='float32' is a speed path: it needs fast=True")
    run = FedDLRun.start(client_data, n_landmarks, rounds=rounds, local_steps=local_steps, mode=mode, lr=lr,
                          lr_scale=lr_scale, server_lr=server_lr, weights=weights, init=init, gamma=gamma,
                          noise=noise, beta=beta,
                          epsilon=epsilon, delta=delta, tau_x=tau_x, tau_y=tau_y, dp_sensitivity=dp_sensitivity,
                          dp_accountant=dp_accountant, landmark_bounds=landmark_bounds, median_points=median_points,
                          seed=seed, dtype=dtype, fast=fast)
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
              median_points, seed, dtype="float64", lr_scale=1.0, fast=True) -> "FedDLRun":
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
                             median_points=a["median_points"], dtype=dtype, fast=fast)
        server = FedDLServer(a["ny"], data[0].shape[1], mode=mode, weights=weights, init=a["init"], gamma=a["gamma"],
                             lr=a["lr"], lr_scale=a["lr_scale"], server_lr=a["server_lr"],
                             landmark_bounds=a["landmark_bounds"],
                             tau_y=a["tau_y"] if theorem6 else None, seed=seed, dtype=dtype, fast=fast)
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
        spent, ledger = privacy_ledger(noise, o["z_mult"], o["data_sd"], sens, delta, self.planned * Q, o["tau_x"],
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


def resolve_gamma_only(data: list[np.ndarray], rule: str, weights: str, median_points: int, seed: int) -> float:
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
    X_public = as_matrix("X_public", X_public)
    r = seeds.rng(seed, "public_landmarks")
    return np.clip(X_public.mean(0) + X_public.std(0) * r.standard_normal((check_int("n_landmarks", n_landmarks, 2),
                                                                           X_public.shape[1])), low, high)
