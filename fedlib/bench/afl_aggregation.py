"""AFL server cost: the paper's pairwise AA law against the one-solve form, and accumulation speed.

Prints, in one run on this machine:

1. K clients (default 1000) at d = 1280 (EfficientNet-Lite0's feature size), C = 10: wall-clock of
   the recursive pairwise AA law (eqs. 9-10, corrected sign, O(K d^3)) and of the one-solve form
   (O(K d^2 + d^3)) on the same uploads, their ratio, and the max difference of the two
   RI-restored heads.
2. The rate of ``SufficientStats.from_data`` (float32 features cast to float64, G = X^T X and
   B = X^T Y accumulated in chunks) against one plain float64 matrix product ``X^T X`` of the same
   size, as GFLOP/s and a ratio.

    python -m fedlib.bench.afl_aggregation [--clients 1000] [--dim 1280] [--repeats 3] [--out FILE]

The report goes to ``book/benchmarks/afl_aggregation.txt`` unless ``--out`` says otherwise
(``--out -``: print only).
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm import tqdm

from fedlib import bench
from fedlib.papers import afl
from fedlib.core.linalg import SufficientStats, as_tensor
from fedlib.core.devices import resolve_device


def aggregation(clients: int, dim: int, classes: int, per_client: int, device, seed: int = 0) -> dict:
    """The same seeded uploads streamed into both servers (one client's matrices alive at a time,
    13 MB each at d = 1280); returns the server seconds and the max |difference| of the heads."""

    def uploads(desc):
        rng = np.random.default_rng(seed)
        for k in tqdm(range(clients), desc=desc, mininterval=5):
            x = np.abs(rng.standard_normal((per_client, dim))).astype(np.float32)
            y = rng.integers(0, classes, per_client)
            yield afl.client_update(x, y, classes, gamma=1.0, client=f"client{k}", device=device)

    one = afl.aggregate(uploads("one-solve server"), server="one_solve")
    pair = afl.aggregate(uploads("pairwise AA law"), server="pairwise")
    return {"t_pairwise": pair.server_seconds, "t_one_solve": one.server_seconds,
            "max_diff": float((one.weights - pair.weights).abs().max()),
            "max_abs_w": float(one.weights.abs().max()), "upload_mb": one.upload_bytes[0] / 1e6}


def accumulation(n: int, dim: int, classes: int, device, repeats: int = 3) -> dict:
    """Best-of-``repeats`` seconds of the statistics accumulation and of a plain X^T X."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = rng.integers(0, classes, n)
    x64 = as_tensor(x, torch.float64, device)
    t = bench.measure({"stats": lambda: SufficientStats.from_data(x, y, classes, device=device),
                       "plain": lambda: x64.T @ x64}, repeats, warmup=False)
    t_stats, t_plain = t["stats"].best, t["plain"].best
    flops = 2.0 * n * dim * (dim + classes)
    return {"t_stats": t_stats, "t_plain": t_plain, "gflops_stats": flops / t_stats / 1e9,
            "gflops_plain": 2.0 * n * dim * dim / t_plain / 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "afl_aggregation", seed=None)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-client", type=int, default=20, help="samples per client (N_k < d: RI needed)")
    parser.add_argument("--samples", type=int, default=20000, help="rows for the accumulation benchmark")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "clients", "dim", "classes", "per_client", "samples", "repeats")
    device = resolve_device(args.device)
    agg = aggregation(args.clients, args.dim, args.classes, args.per_client, device)
    acc = accumulation(args.samples, args.dim, args.classes, device, args.repeats)
    w = 36
    lines = [
        bench.machine(device=device, torch=torch.__version__),
        f"AFL aggregation, K={args.clients} clients, d={args.dim}, C={args.classes}, N_k={args.per_client}, gamma=1, float64:",
        bench.row("upload per client (measured)", f"{agg['upload_mb']:.2f} MB", w),
        bench.row("pairwise AA law (paper, eqs. 9-10)", f"{agg['t_pairwise']:.2f} s  (server time; client solves excluded)", w),
        bench.row("one-solve form (summed statistics)", f"{agg['t_one_solve']:.2f} s", w),
        *bench.ratio_rows({"pairwise": agg["t_pairwise"], "one-solve": agg["t_one_solve"]}, "one-solve", w),
        bench.row("max |W_pairwise - W_one_solve|", f"{agg['max_diff']:.2e} (max |W| = {agg['max_abs_w']:.2e})", w),
        f"Statistics accumulation, N={args.samples}, d={args.dim} (float32 features -> float64), best of {args.repeats}:",
        bench.row("SufficientStats.from_data", f"{acc['t_stats'] * 1e3:.1f} ms  ({acc['gflops_stats']:.1f} GFLOP/s)", w),
        bench.row("plain float64 X^T X, same size", f"{acc['t_plain'] * 1e3:.1f} ms  ({acc['gflops_plain']:.1f} GFLOP/s)", w),
        bench.row("rate ratio accumulation / plain", f"{acc['gflops_stats'] / acc['gflops_plain']:.2f}", w),
    ]
    return bench.finish(lines, args.out, width=w)


if __name__ == "__main__":
    sys.exit(main())
