"""Fed-tSNE speed: federated against centralized t-SNE, and FedDL's client gradient vectorized
against a per-point Python loop.

Prints, in one run on this machine:

1. Fed-tSNE (Algorithm 2: FedDL, distance uploads, Nystrom estimate on squared distances, sklearn
   t-SNE on it) against centralized t-SNE (the same sklearn t-SNE on the exact distances) on the
   same points: by default 10,000 Fashion-MNIST images (stratified subset of train + test, pixels
   / 255), 10 IID clients, n_y = 500 landmarks, 25 FedDL rounds (a fixed count for timing; the chapter runs to a plateau),
   perplexity 30 and sklearn's default 1000 t-SNE iterations. Wall time of each (and of FedDL and
   the Nystrom step alone), the time ratio, and CA 10-NN (k-NN accuracy in the embedding, 70/30
   split; ``fedlib.evaluation.embedding.knn_accuracy``) of both embeddings.
2. The clients' work in one FedDL round at the paper's scale: every client computes the gradient
   of its MMD^2 term (Eq. 13) at the current landmarks. ``fedlib.fedtsne.algorithm.mmd2_u_grad`` (vectorized:
   two matrix products and an elementwise exp) against :func:`mmd2_u_grad_loop`, the same gradient
   as a Python loop over landmarks and points, one m-vector per (landmark, point) pair. Default:
   40,000 images (a second stratified subset) split IID over 10 clients of 4,000 (the paper's
   setting), the 500 landmarks and gamma of the FedDL run above. Both times (summed over the
   clients), their ratio, and the max relative difference of the two gradients over all clients
   (check < 1e-10).
3. FedDL in float32 against float64 (``feddl(dtype=...)``) at the fedtsne_benchmark chapter's quick
   sizes: 1,000 points (a third stratified subset), 10 IID clients, n_y = 200, 50 rounds, noise-free
   and with the paper's heuristic noise (Fed+): seconds per round of each (process CPU time, one
   process, BLAS threads as set by the caller), the relative difference of the noise-free landmarks
   after the 50 rounds (check < 1e-4) and CA 10-NN of Fed-tSNE on each run's landmarks
   (:func:`feddl_dtype_rows`, also callable alone).

    python -m fedlib.fedtsne.bench_speed [--points 10000] [--rounds 25] [--loop-points 40000] [--out FILE]

The report goes to ``book/benchmarks/fedtsne_speed.txt`` unless ``--out`` says otherwise
(``--out -``: print only).
"""
from __future__ import annotations

import os

# OpenMP threads wait passively: on a shared machine, spinning sklearn/numba threads slow each
# other down by up to 10x. Set before sklearn is imported (a value the caller set is kept).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info

from fedlib.core.linalg import relative_error
from fedlib.core.seeds import derive_seed
from fedlib.data.datasets import load_dataset
from fedlib.data.partition import make_partition
from fedlib.evaluation import benchmark as bench  # noqa: E402
from fedlib.evaluation.benchmark import timed  # noqa: E402
from fedlib.evaluation.embedding import knn_accuracy
from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import feddl as ft_feddl
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import pipelines as ft_pipelines

__all__ = ["mmd2_u_grad_loop", "load_points", "relative_error", "feddl_dtype_rows", "main"]


def mmd2_u_grad_loop(X, Y, gamma: float) -> np.ndarray:
    """Eq. 13 column by column, written out as loops:

        grad_{y_j} f = -(4 gamma/(n n_y)) sum_i k(x_i, y_j)(x_i - y_j)
                       + (4 gamma/(n_y (n_y-1))) sum_{i != j} k(y_i, y_j)(y_i - y_j),

    k(a, b) = exp(-gamma ||a - b||^2). One Python iteration per (landmark, point) and per
    (landmark, landmark) pair, numpy only for the m-vector arithmetic. X (n, m), Y (n_y, m) ->
    (n_y, m), float64. The naive reference for ``fedlib.fedtsne.algorithm.mmd2_u_grad``."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    n, ny = len(X), len(Y)
    if n < 1 or ny < 2 or X.shape[1] != Y.shape[1]:
        raise ValueError(f"need X (n >= 1, m) and Y (n_y >= 2, m), got {X.shape} and {Y.shape}")
    c_attract = -4.0 * gamma / (n * ny)
    c_repel = 4.0 * gamma / (ny * (ny - 1))
    grad = np.zeros_like(Y)
    for j in range(ny):
        yj = Y[j]
        attract = np.zeros(Y.shape[1])
        for i in range(n):
            d = X[i] - yj
            attract += math.exp(-gamma * float(d @ d)) * d
        repel = np.zeros(Y.shape[1])
        for i in range(ny):
            if i != j:
                d = Y[i] - yj
                repel += math.exp(-gamma * float(d @ d)) * d
        grad[j] = c_attract * attract + c_repel * repel
    return grad


def load_points(name: str, n: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stratified subset of n points of train + test (``Dataset.subset``), pixels / 255, flattened."""
    ds = load_dataset(name)
    total = len(ds.y_train) + len(ds.y_test)
    if n is not None and not 2 <= n <= total:
        raise ValueError(f"--points must be in [2, {total}] for {name}, got {n}")
    if n is not None and n < total:
        n_tr = min(len(ds.y_train), int(round(n * len(ds.y_train) / total)))
        ds = ds.subset(n_tr, n - n_tr, seed=seed)
    x = np.concatenate([ds.x_train, ds.x_test])
    return x.reshape(len(x), -1).astype(np.float64) / 255.0, np.concatenate([ds.y_train, ds.y_test])


def feddl_dtype_rows(X, y, clients: int = 10, landmarks: int = 200, rounds: int = 50, seed: int = 0,
                     width: int = 46) -> tuple[list[str], bool]:
    """Part 3: FedDL float32 against float64 on X (n, m), ``clients`` IID clients of labels y, noise-free and
    Fed+ (heuristic noise, beta 1), each ``rounds`` rounds; CPU seconds per round (``time.process_time``,
    best of two runs each), relative Frobenius difference of the noise-free landmarks (check < 1e-4), and
    CA 10-NN of Fed-tSNE (sklearn t-SNE, perplexity 30, 500 iterations) on each run's landmarks. Returns
    (report lines, check passed)."""
    parts = make_partition(y, clients, "iid", seed=seed)
    data = [X[p] for p in parts]
    runs, cpu = {}, {}
    for noise in ("none", "heuristic"):
        for dtype in ("float64", "float32", "float64", "float32"):
            t0 = time.process_time()
            runs[noise, dtype] = ft_feddl.feddl(data, landmarks, rounds=rounds, noise=noise, seed=seed, dtype=dtype)
            t = (time.process_time() - t0) / rounds
            cpu[noise, dtype] = min(t, cpu.get((noise, dtype), math.inf))
    a, b = runs["none", "float64"].landmarks, runs["none", "float32"].landmarks
    rel = float(np.linalg.norm(b - a) / np.linalg.norm(a))
    ca = {key: knn_accuracy(ft_pipelines.fed_tsne(X, parts, landmarks, feddl_result=fd, perplexity=30.0,
                                        tsne_kwargs={"max_iter": 500}, seed=seed).embedding, y, 10, seed=seed)
          for key, fd in runs.items()}
    tol = 1e-4
    lines = [f"3. FedDL float32 vs float64: {len(X)} points x {X.shape[1]} features, {clients} IID clients, "
             f"n_y={landmarks}, {rounds} rounds, seed {seed}; CPU seconds per round (best of 2)"]
    for noise, label in (("none", "Fed (noise-free)"), ("heuristic", "Fed+ (heuristic noise)")):
        t64, t32 = cpu[noise, "float64"], cpu[noise, "float32"]
        lines.append(bench.row(f"{label}: float64 / float32",
                               f"{t64 * 1e3:.1f} / {t32 * 1e3:.1f} ms per round ({t64 / t32:.2f}x)", width))
        lines.append(bench.row(f"{label.split()[0]}: CA 10-NN float64 / float32",
                               f"{ca[noise, 'float64']:.4f} / {ca[noise, 'float32']:.4f}", width))
    lines.append(bench.check_row("noise-free landmarks, rel. difference", rel, tol,
                                 "||Y32 - Y64||_F / ||Y64||_F after the rounds", width))
    return lines, rel < tol


def _threads() -> str:
    info = threadpool_info()
    blas = sorted({i["num_threads"] for i in info if i["user_api"] == "blas"})
    omp = sorted({i["num_threads"] for i in info if i["user_api"] == "openmp"})
    return f"BLAS threads {blas}, OpenMP threads {omp}"


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "fedtsne_speed")
    parser.add_argument("--dataset", default="fashion_mnist", help="a fedlib.data.datasets dataset (default fashion_mnist)")
    parser.add_argument("--points", type=int, default=10000, help="stratified subset of train + test")
    parser.add_argument("--clients", type=int, default=10, help="IID clients")
    parser.add_argument("--landmarks", type=int, default=500, help="n_y")
    parser.add_argument("--rounds", type=int, default=25, help="FedDL rounds")
    parser.add_argument("--perplexity", type=float, default=30.0)
    parser.add_argument("--tsne-max-iter", type=int, default=1000, help="t-SNE iterations (sklearn default 1000)")
    parser.add_argument("--loop-points", type=int, default=40000, help="part 2: points of the round (stratified)")
    parser.add_argument("--loop-clients", type=int, default=10, help="part 2: IID clients of the round")
    parser.add_argument("--dtype-points", type=int, default=1000, help="part 3: points (stratified)")
    parser.add_argument("--dtype-clients", type=int, default=10, help="part 3: IID clients")
    parser.add_argument("--dtype-landmarks", type=int, default=200, help="part 3: n_y")
    parser.add_argument("--dtype-rounds", type=int, default=50, help="part 3: FedDL rounds")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "points", "clients", "landmarks", "rounds", "loop_points", "loop_clients",
                           "repeats", "dtype_points", "dtype_clients", "dtype_landmarks", "dtype_rounds")
    if args.tsne_max_iter < 250:
        parser.error("--tsne-max-iter must be >= 250 (sklearn's minimum)")
    if args.loop_points < 2 * args.loop_clients:
        parser.error("--loop-points must be >= 2 x --loop-clients")
    tol = 1e-10

    import sklearn

    (X, y), t_load = timed(lambda: load_points(args.dataset, args.points, args.seed))
    n, m = X.shape
    parts = make_partition(y, args.clients, "iid", seed=args.seed)
    tsne_kw = {"perplexity": args.perplexity, "tsne_kwargs": {"max_iter": args.tsne_max_iter}, "seed": args.seed}

    # ---- 1. centralized and federated t-SNE, same points, same t-SNE settings
    central, t_central = timed(lambda: ft_pipelines.fed_tsne(X, None, centralized=True, **tsne_kw))
    fd, t_feddl = timed(lambda: ft_feddl.feddl([X[p] for p in parts], args.landmarks, rounds=args.rounds, seed=args.seed))
    fed, t_fed_embed = timed(lambda: ft_pipelines.fed_tsne(X, parts, args.landmarks, feddl_result=fd, **tsne_kw))
    Y = fd.landmarks

    def nystrom_step():
        B = np.vstack([ft.client_sq_distances(X[p], Y)["sq_distances"] for p in parts])
        return ft.nystrom_distances(B, ft_mmd.sq_distances(Y))

    _, t_nystrom = timed(nystrom_step)
    t_fed = t_feddl + t_fed_embed
    ca_central = knn_accuracy(central.embedding, y, 10, seed=args.seed)
    ca_fed = knn_accuracy(fed.embedding, y, 10, seed=args.seed)

    # ---- 2. the clients' gradients of one FedDL round: vectorized against the loop
    X2, y2 = load_points(args.dataset, args.loop_points, derive_seed(args.seed, "loop points"))
    clients = [X2[p] for p in make_partition(y2, args.loop_clients, "iid", seed=args.seed)]
    ft.mmd2_u_grad(clients[0][:10], Y[:10], fd.gamma)  # warm-up
    vec = bench.measure({"(a)": lambda: [ft.mmd2_u_grad(c, Y, fd.gamma) for c in clients]}, args.repeats,
                        warmup=False)["(a)"]
    g_vec, t_vec = vec.out, vec.best
    g_loop, t_loop = timed(lambda: [mmd2_u_grad_loop(c, Y, fd.gamma) for c in clients])
    diff = max(relative_error(b, a) for a, b in zip(g_vec, g_loop))
    sizes = [len(c) for c in clients]
    pairs = sum(sizes) * len(Y) + len(clients) * len(Y) * (len(Y) - 1)
    ok = diff < tol
    X3, y3 = load_points(args.dataset, args.dtype_points, derive_seed(args.seed, "dtype points"))
    dtype_lines, dtype_ok = feddl_dtype_rows(X3, y3, args.dtype_clients, args.dtype_landmarks, args.dtype_rounds,
                                             seed=args.seed)
    ok = ok and dtype_ok

    def row(label: str, value: str) -> str:
        return bench.row(label, value, 46)

    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {_threads()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, numpy {np.__version__}, "
        f"scikit-learn {sklearn.__version__}",
        f"1. Fed-tSNE vs centralized t-SNE, {args.dataset}: {n} points x {m} features (stratified, pixels / 255), "
        f"loaded in {t_load:.1f} s",
        f"   {args.clients} IID clients, n_y={args.landmarks}, {args.rounds} FedDL rounds (gamma={fd.gamma:.4g}); "
        f"t-SNE perplexity {args.perplexity:g}, {args.tsne_max_iter} iterations, random init, seed {args.seed}",
        row("centralized t-SNE (exact distances + t-SNE)", f"{t_central:.1f} s"),
        row("Fed-tSNE total", f"{t_fed:.1f} s"),
        row("    FedDL, all clients and rounds", f"{t_feddl:.1f} s  ({t_feddl / args.rounds:.2f} s per round)"),
        row("    uploads + Nystrom + t-SNE", f"{t_fed_embed:.1f} s"),
        row("    of which uploads + Nystrom (separate run)", f"{t_nystrom:.1f} s"),
        *bench.ratio_rows({"Fed-tSNE": t_fed, "centralized": t_central}, "centralized", 46, fmt=".2f"),
        row("CA 10-NN centralized", f"{ca_central:.4f}"),
        row("CA 10-NN Fed-tSNE", f"{ca_fed:.4f}  (difference {ca_fed - ca_central:+.4f})"),
        row("upload, all clients", f"{fed.upload_bytes / 2**20:.1f} MiB float64 (FedDL "
            f"{fd.upload_bytes / 2**20:.1f} MiB + distances {fed.distance_upload_bytes / 2**20:.1f} MiB)"),
        f"2. clients' gradients (Eq. 13) in one FedDL round: {len(X2)} points x {m} features over "
        f"{len(clients)} IID clients ({min(sizes)}-{max(sizes)} rows each), n_y={len(Y)}, float64 "
        f"({pairs} kernel pairs)",
        row("(a) fedtsne.mmd2_u_grad, vectorized", f"{t_vec:.3f} s  (all clients; best of {args.repeats})"),
        row("(b) mmd2_u_grad_loop, per-point Python loop", f"{t_loop:.1f} s  ({t_loop / pairs * 1e6:.2f} us per pair)"),
        *bench.ratio_rows({"(a)": t_vec, "(b)": t_loop}, "(a)", 46, fmt=".0f"),
        bench.check_row("max rel. difference (b) vs (a)", diff, tol,
                        "max over clients of max |G_b - G_a| / max |G_a|", 46),
        *dtype_lines,
    ]
    return bench.finish(lines, args.out, ok, 46)


if __name__ == "__main__":
    sys.exit(main())
