"""Fed-tSNE at scale: all 70,000 Fashion-MNIST images, the server never holding an n x n matrix.

Prints, in one run on this machine:

1. The data: by default all of Fashion-MNIST (train + test pooled, 70,000 images, pixels / 255,
   784 features; ``fedlib.fedtsne.chapters.load_points``, the rule of the Fed-tSNE chapters), split
   IID over 10 clients (``fedlib.data.partition.make_partition``), n_y = 200 landmarks: the
   ``quick`` profile of the fedtsne_benchmark chapter.
2. FedDL until the chapter's plateau rule holds (``--rounds plateau``, the default: tol 0.01,
   checked every 25 rounds, at most ``--max-rounds``), or for a fixed ``--rounds N``.
3. Fed-tSNE on the sparse server path (``fed_tsne(..., sparse=True)``): the clients' squared
   distances to the landmarks, the 90 (= 3 x perplexity) nearest neighbours of every point under
   the Nystrom estimate B W^+ B^T computed blockwise (``nystrom_knn``; never n x n), openTSNE on
   their perplexity affinities. The kNN step is also timed alone, and its neighbour lists are
   compared with the exact 10 nearest neighbours in pixel space (recall = the share of the exact
   10-NN among the estimate's 10-NN).
4. The best route of the chapter fedtsne_beyond on the same clients: federated k-means landmarks
   (Lloyd from FedDL's Y^0, at most ``--kmeans-rounds`` rounds, stopping when the centres no longer
   move) and the "projection + residuals" estimate from the same kind of upload (``--estimator``),
   its kNN blockwise, openTSNE on the same affinities. Its time counts FedDL's set-up round (for Y^0),
   the k-means rounds, the uploads, the kNN and openTSNE.
5. Centralized openTSNE on the same points with the same settings and its own neighbour search.
6. Quality of the embeddings: CA 10-NN (``fedlib.evaluation.embedding.knn_accuracy``, 70/30) and
   NPA 10-NN (share of each point's exact 10-NN in pixel space kept among its 10-NN in the
   embedding; exact lists from ``fedlib.evaluation.embedding.neighbour_lists``), and the ratios
   Fed-tSNE / centralized of times and metrics.
7. Against the goal of a federated route close to centralized at a bounded cost: CA 10-NN within
   0.02, NPA 10-NN within 0.05 of centralized, time at most 2x centralized (``goal`` rows, met or
   missed; the exit code does not depend on them).
8. Peak resident memory of the whole process, checked against ``--memory-limit`` GiB (default 8).

    python -m fedlib.fedtsne.bench_scale [--points N] [--rounds plateau|N] [--threads 2] [--out FILE]

The report goes to ``book/benchmarks/fedtsne_scale.txt`` unless ``--out`` says otherwise
(``--out -``: print only).
"""
from __future__ import annotations

import os

# OpenMP threads wait passively: on a shared machine, spinning threads slow each other down.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits

from fedlib.data.partition import make_partition
from fedlib.evaluation import benchmark as bench  # noqa: E402
from fedlib.evaluation.benchmark import timed  # noqa: E402
from fedlib.evaluation.embedding import knn_accuracy, neighbour_lists
from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import beyond as bd
from fedlib.fedtsne import chapters as ft_chapters
from fedlib.fedtsne import feddl as ft_feddl
from fedlib.fedtsne import knn as ft_knn
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import nystrom as ft_nystrom
from fedlib.fedtsne import pipelines as ft_pipelines

__all__ = ["overlap", "main"]

WIDTH = 52
GOAL = {"CA 10-NN": 0.02, "NPA 10-NN": 0.05, "time ratio": 2.0}   # item 7 of the docstring


def overlap(a, b) -> float:
    """Mean over rows of |a_i ∩ b_i| / k for two (n, k) neighbour lists."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"neighbour lists must be (n, k) of the same shape, got {a.shape} and {b.shape}")
    s = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return float((s[:, 1:] == s[:, :-1]).sum(axis=1).mean() / a.shape[1])


def _rounds(value: str):
    if value == "plateau":
        return value
    try:
        out = int(value)
    except ValueError:
        raise ValueError(f"--rounds must be 'plateau' or an integer >= 1, got {value!r}") from None
    if out < 1:
        raise ValueError(f"--rounds must be 'plateau' or an integer >= 1, got {value!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "fedtsne_scale", repeats=None)
    parser.add_argument("--dataset", default="fashion_mnist", help="a fedlib.data.datasets dataset (default fashion_mnist)")
    parser.add_argument("--points", type=int, default=None, help="stratified subset of train + test (default: all)")
    parser.add_argument("--clients", type=int, default=10, help="IID clients")
    parser.add_argument("--landmarks", type=int, default=200, help="n_y")
    parser.add_argument("--rounds", default="plateau", help="FedDL rounds: plateau (the chapter rule, default) or N")
    parser.add_argument("--max-rounds", type=int, default=1000, help="plateau: the most rounds")
    parser.add_argument("--kmeans-rounds", type=int, default=100, help="federated k-means: the most rounds")
    parser.add_argument("--estimator", default="residual_sum", choices=bd.ESTIMATORS,
                        help="the best route's estimate from the upload (default: projection + residuals)")
    parser.add_argument("--perplexity", type=float, default=30.0)
    parser.add_argument("--tsne-max-iter", type=int, default=500, help="t-SNE iterations incl. 250 early exaggeration")
    parser.add_argument("--threads", type=int, default=2, help="BLAS / openTSNE threads")
    parser.add_argument("--block-mib", type=int, default=256, help="memory budget of one kNN block, MiB")
    parser.add_argument("--memory-limit", type=float, default=8.0, help="peak resident memory check, GiB")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "clients", "landmarks", "threads", "block_mib", "max_rounds", "kmeans_rounds")
    try:
        rounds = _rounds(args.rounds)
    except ValueError as err:
        parser.error(str(err))
    if args.points is not None and args.points < 2 * args.clients:
        parser.error("--points must be >= 2 x --clients")
    if args.tsne_max_iter < 250:
        parser.error("--tsne-max-iter must be >= 250 (the early exaggeration phase)")

    import openTSNE
    threadpool_limits(args.threads)
    k_eval = 10
    (X, y, _), t_load = timed(lambda: ft_chapters.load_points(args.dataset, args.points, seed=args.seed))
    n, m = X.shape
    if args.landmarks > min(n, m + 1):
        parser.error(f"--landmarks must be <= min(points, features + 1) = {min(n, m + 1)} (the best route's closed form)")
    parts = make_partition(y, args.clients, "iid", seed=args.seed)
    order = np.concatenate(parts)          # row i of the stacked uploads is point order[i]
    tsne_kw = {"perplexity": args.perplexity, "seed": args.seed, "sparse": True,
               "tsne_kwargs": {"max_iter": args.tsne_max_iter, "n_jobs": args.threads}}

    # ---- FedDL
    clients = [X[p] for p in parts]
    if rounds == "plateau":
        trace, t_feddl = timed(lambda: ft_feddl.feddl_until_plateau(clients, args.landmarks, tol=0.01, check_every=25,
                                                              max_rounds=args.max_rounds, seed=args.seed))
        fd, s_run = trace.result, trace.rounds
        rule = f"plateau rule (tol 0.01, checked every 25 rounds): {s_run} rounds, plateau at round {trace.plateau}"
    else:
        fd, t_feddl = timed(lambda: ft_feddl.feddl(clients, args.landmarks, rounds=rounds, seed=args.seed))
        s_run, rule = rounds, f"fixed: {rounds} rounds"

    # ---- Fed-tSNE, sparse server path, end to end from that FedDL run
    fed, t_fed_embed = timed(lambda: ft_pipelines.fed_tsne(X, parts, args.landmarks, feddl_result=fd, **tsne_kw))

    # ---- the kNN step alone (same uploads, same estimate), and its recall of the exact 10-NN
    k_tsne = min(n - 1, int(3 * args.perplexity))
    block = args.block_mib * 2**20

    def knn_step():
        B = np.vstack([ft.client_sq_distances(X[p], fd.landmarks)["sq_distances"] for p in parts])
        nbr, _ = ft_nystrom.nystrom_knn(B, ft_mmd.sq_distances(fd.landmarks), k_tsne, block_bytes=block)
        out = np.empty_like(nbr)
        out[order] = order[nbr]
        return out

    nbr_hat, t_knn = timed(knn_step)
    nn_exact, t_exact = timed(lambda: neighbour_lists(X, k_eval))
    recall = overlap(nbr_hat[:, :k_eval], nn_exact)

    # ---- the best route of fedtsne_beyond: federated k-means landmarks, a better estimate
    _, t_setup = timed(lambda: ft_feddl.feddl(clients, args.landmarks, rounds=1, seed=args.seed))
    km, t_kmeans = timed(lambda: bd.federated_kmeans(clients, fd.init_landmarks, args.kmeans_rounds))
    del clients
    run_tsne, _ = ft_pipelines.opentsne_runner(args.perplexity, tsne_kw["tsne_kwargs"], args.seed, n)

    def best_route():
        B = np.vstack([ft.client_sq_distances(X[p], km.centers)["sq_distances"] for p in parts])
        idx_s, d2_s = bd.estimator_knn(bd.decompose_upload(B, km.centers), args.estimator, k_tsne, block_bytes=block)
        idx, dist = np.empty_like(idx_s), np.empty_like(d2_s)
        idx[order], dist[order] = order[idx_s], np.sqrt(d2_s)
        return idx, run_tsne((idx, dist)), B.nbytes

    (nbr_best, Z_best, best_bytes), t_best_embed = timed(best_route)
    recall_best = overlap(nbr_best[:, :k_eval], nn_exact)

    # ---- centralized openTSNE with its own kNN
    central, t_central = timed(lambda: ft_pipelines.fed_tsne(X, None, centralized=True, **tsne_kw))

    # ---- quality
    def metrics(Z):
        return knn_accuracy(Z, y, k_eval, seed=args.seed), overlap(neighbour_lists(Z, k_eval), nn_exact)

    ca_c, npa_c = metrics(central.embedding)
    ca_f, npa_f = metrics(fed.embedding)
    ca_b, npa_b = metrics(Z_best)
    t_fed = t_feddl + t_fed_embed
    t_best = t_setup + t_kmeans + t_best_embed
    peak = bench.peak_memory_gib()
    dense_gib = n * n * 8 / 2**30

    def row(label: str, value: str) -> str:
        return bench.row(label, value, WIDTH)

    def goal_row(name: str, t: float, ca: float, npa: float) -> str:
        gaps = {"CA 10-NN": ca_c - ca, "NPA 10-NN": npa_c - npa, "time ratio": t / t_central}
        missed = [f"{k} {'%.2fx' % v if k == 'time ratio' else '%+.3f' % -v}" for k, v in gaps.items() if v > GOAL[k]]
        return row(f"goal {name} (CA -0.02, NPA -0.05, time 2x)", "met" if not missed else "missed: " + ", ".join(missed))

    lines = [
        bench.machine(openTSNE=openTSNE.__version__, threads_used=args.threads),
        f"data: {args.dataset}, {n} points x {m} features (train + test pooled"
        f"{'' if args.points is None else ', stratified subset'}, pixels / 255), loaded in {t_load:.1f} s",
        f"      {args.clients} IID clients, n_y={args.landmarks} landmarks; t-SNE: openTSNE, perplexity "
        f"{args.perplexity:g}, {args.tsne_max_iter} iterations (250 early exaggeration), random init, seed {args.seed}",
        f"      a dense n x n float64 matrix would take {dense_gib:.1f} GiB; the server keeps {k_tsne} neighbours "
        f"per point ({n * k_tsne * 16 / 2**20:.0f} MiB)",
        f"FedDL: {rule}, gamma={fd.gamma:.4g}",
        row("Fed-tSNE total", f"{t_fed:.1f} s"),
        row("    FedDL, all clients and rounds", f"{t_feddl:.1f} s  ({t_feddl / s_run:.2f} s per round)"),
        row("    uploads + blockwise kNN + openTSNE", f"{t_fed_embed:.1f} s"),
        row("    of which uploads + blockwise kNN (separate run)",
            f"{t_knn:.1f} s  ({k_tsne}-NN, {ft_knn.block_rows(n, block)} rows per block)"),
        f"best route: federated k-means landmarks ({km.rounds} rounds, {'converged' if km.converged else 'not converged'}"
        f", {int(km.empty[-1])} empty cells), estimate: {bd.ESTIMATOR_NAMES[args.estimator]}",
        row("Fed-tSNE best route total", f"{t_best:.1f} s"),
        row("    FedDL set-up and 1 round (for Y^0)", f"{t_setup:.1f} s"),
        row("    federated k-means", f"{t_kmeans:.1f} s"),
        row("    uploads + blockwise kNN + openTSNE", f"{t_best_embed:.1f} s"),
        row("centralized openTSNE (own kNN + t-SNE)", f"{t_central:.1f} s"),
        *bench.ratio_rows({"Fed-tSNE": t_fed, "Fed-tSNE best route": t_best, "centralized": t_central},
                          "centralized", WIDTH, fmt=".2f"),
        row("exact 10-NN in pixel space (for NPA, recall)", f"{t_exact:.1f} s"),
        row("10-NN recall of the Nystrom estimate", f"{recall:.4f}  (share of the exact 10-NN found)"),
        row("10-NN recall of the best route", f"{recall_best:.4f}"),
        row("CA 10-NN centralized", f"{ca_c:.4f}"),
        row("CA 10-NN Fed-tSNE", f"{ca_f:.4f}  (ratio {ca_f / ca_c:.3f}, difference {ca_f - ca_c:+.4f})"),
        row("NPA 10-NN centralized", f"{npa_c:.4f}"),
        row("NPA 10-NN Fed-tSNE", f"{npa_f:.4f}  (ratio {npa_f / npa_c:.3f}, difference {npa_f - npa_c:+.4f})"),
        row("CA 10-NN best route", f"{ca_b:.4f}  (ratio {ca_b / ca_c:.3f}, difference {ca_b - ca_c:+.4f})"),
        row("NPA 10-NN best route", f"{npa_b:.4f}  (ratio {npa_b / npa_c:.3f}, difference {npa_b - npa_c:+.4f})"),
        *[goal_row(name, t, ca, npa) for name, t, ca, npa in
          (("Fed-tSNE", t_fed, ca_f, npa_f), ("best route", t_best, ca_b, npa_b))],
        row("upload, all clients", f"{fed.upload_bytes / 2**20:.1f} MiB float64 (FedDL "
            f"{fd.upload_bytes / 2**20:.1f} MiB + distances {fed.distance_upload_bytes / 2**20:.1f} MiB)"),
        row("upload, best route", f"{(km.cost.bytes_up + fd.setup_upload_bytes + best_bytes) / 2**20:.1f} MiB float64 "
            f"(k-means {km.cost.bytes_up / 2**20:.1f} MiB + set-up + distances {best_bytes / 2**20:.1f} MiB)"),
        bench.check_row("peak resident memory, GiB", peak, args.memory_limit, "whole process, ru_maxrss", WIDTH),
    ]
    return bench.finish(lines, args.out, peak < args.memory_limit, WIDTH)


if __name__ == "__main__":
    sys.exit(main())
