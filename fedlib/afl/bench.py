"""AFL server cost: the paper's pairwise AA law against the one-solve form, the one-solve server
against the memory-bandwidth floor, packed against full uploads, and accumulation speed.

Prints, in one run on this machine:

1. K clients (default 1000) at d = 1280 (EfficientNet-Lite0's feature size), C = 10: the measured
   upload of one client in both forms (the paper's full ``C_k^r``, d^2 numbers, and the default
   packed upper triangle, d(d+1)/2), the wall-clock of the recursive pairwise AA law (eqs. 9-10,
   corrected sign, O(K d^3), on the paper's uploads) and of the one-solve form (O(K d^2 C + d^3)) on
   both forms of the same uploads, their ratios, and the max differences of the RI-restored heads.
2. The one-solve server's work per upload against the memory-bandwidth floor: ``--held`` uploads
   held in memory (more than the last-level cache), the best-of-``--repeats`` seconds per upload of
   one pass that only sums their Gram entries (the least any server must do: read each upload once)
   and of the server absorbing them, for both forms; ratios against the floors. On one thread by
   default (``--floor-threads``): per core, so that other processes on a shared machine slow the
   floor and the server alike (the 2-thread floor swings with the machine's load).
3. The rate of ``SufficientStats.from_data`` (float32 features cast to float64, G = X^T X and
   B = X^T Y accumulated in chunks) against one plain float64 matrix product ``X^T X`` of the same
   size, as GFLOP/s and a ratio.

    python -m fedlib.afl.bench [--clients 1000] [--dim 1280] [--held 48] [--floor-threads 1]
                                           [--repeats 3] [--no-pairwise] [--out FILE]

``--no-pairwise`` skips the pairwise law (minutes at K = 1000), for a quick check. The report goes
to ``book/benchmarks/afl_aggregation.txt`` unless ``--out`` says otherwise (``--out -``: print only).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
from tqdm import tqdm

from fedlib.afl import algorithm as afl
from fedlib.core.devices import resolve_device
from fedlib.core.linalg import SufficientStats, as_tensor
from fedlib.core.uploads import check_uploads
from fedlib.evaluation import benchmark as bench


def _uploads(clients: int, dim: int, classes: int, per_client: int, device, packed: bool, seed: int = 0,
             desc: str | None = None, statistics: bool = False):
    """The seeded uploads of ``clients`` clients (the same data for every form), one at a time."""
    rng = np.random.default_rng(seed)
    for k in tqdm(range(clients), desc=desc, mininterval=5, disable=desc is None):
        x = np.abs(rng.standard_normal((per_client, dim))).astype(np.float32)
        y = rng.integers(0, classes, per_client)
        yield afl.client_update(x, y, classes, gamma=1.0, client=f"client{k}", device=device, packed=packed,
                                statistics=statistics)


def aggregation(clients: int, dim: int, classes: int, per_client: int, device, pairwise: bool = True,
                seed: int = 0) -> dict:
    """The same seeded uploads streamed into the servers (one client's matrices alive at a time,
    13 MB each at d = 1280 in the paper's form); returns server seconds, upload sizes and the max
    |difference| of the heads (pairwise vs one-solve, packed vs full)."""
    gen = lambda packed, desc, stats=False: _uploads(clients, dim, classes, per_client, device, packed, seed,  # noqa: E731
                                                     desc, stats)
    afl.aggregate(_uploads(2, 4, classes, 3, device, True))   # JIT warm-up of the packed kernel (numba), not timed
    full = afl.aggregate(gen(False, "one-solve server, full C"), server="one_solve")
    packed = afl.aggregate(gen(True, "one-solve server, packed C"), server="one_solve")
    stats = afl.aggregate(gen(True, "one-solve server, packed C + B", True), server="one_solve")
    out = {"t_one_solve": full.server_seconds, "t_packed": packed.server_seconds, "t_stats": stats.server_seconds,
           "upload_full": full.upload_bytes[0], "upload_packed": packed.upload_bytes[0],
           "upload_stats": stats.upload_bytes[0], "max_abs_w": float(full.weights.abs().max()),
           "packed_diff": bench.relative_error(packed.weights, full.weights),
           "stats_diff": bench.relative_error(stats.weights, full.weights)}
    if pairwise:
        pair = afl.aggregate(gen(False, "pairwise AA law"), server="pairwise")
        out.update(t_pairwise=pair.server_seconds, max_diff=float((full.weights - pair.weights).abs().max()))
    return out


def bandwidth_floor(held: int, dim: int, classes: int, per_client: int, device, repeats: int, threads: int = 1,
                    seed: int = 1) -> dict:
    """Seconds per upload (best of ``repeats``, methods interleaved) of one summing pass over the Gram
    entries of ``held`` uploads in memory and of the one-solve server absorbing the same uploads, for
    the full and the packed form, all on ``threads`` threads (``torch.set_num_threads``; the packed
    kernel follows it)."""
    full = list(_uploads(held, dim, classes, per_client, device, False, seed))
    packed = list(_uploads(held, dim, classes, per_client, device, True, seed))
    stats = list(_uploads(held, dim, classes, per_client, device, True, seed, statistics=True))
    acc_full = torch.zeros_like(full[0]["C"])
    acc_packed = torch.zeros_like(packed[0]["C_packed"])

    def floor(acc, uploads, key):
        def run():
            acc.zero_()
            for u in uploads:
                acc.add_(u[key])
        return run

    products = [u["W"].T.contiguous() for u in full]
    out = torch.empty(classes, dim, dtype=full[0]["C"].dtype, device=full[0]["C"].device)

    def arithmetic():   # the server's d^2 C multiply-adds alone, by BLAS: (C_k W_k)^T = W_k^T C_k
        for u, wt in zip(full, products):
            torch.mm(wt, u["C"], out=out)

    def server(uploads):
        def run():
            srv = afl.OneSolveServer()
            srv.receive(uploads)
            return srv.rhs
        return run

    def check():   # the upload check of every server's receive alone (fedlib.core.uploads)
        check_uploads(stats, afl.expected_upload(dim, classes))

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t = bench.measure({"floor full": floor(acc_full, full, "C"),
                           "floor packed": floor(acc_packed, packed, "C_packed"),
                           "arithmetic": arithmetic,
                           "server full": server(full), "server packed": server(packed),
                           "server statistics": server(stats), "check statistics": check}, repeats)
    finally:
        torch.set_num_threads(before)
    per = {k: v.best / held for k, v in t.items()}
    per["rhs_diff"] = bench.relative_error(t["server packed"].out, t["server full"].out)
    per["stats_rhs_diff"] = bench.relative_error(t["server statistics"].out, t["server full"].out)
    per["bytes_full"], per["bytes_packed"] = full[0]["C"].nbytes, packed[0]["C_packed"].nbytes
    return per


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
    parser.add_argument("--held", type=int, default=48,
                        help="uploads held in memory for the bandwidth floor (48 x 13 MB at d = 1280)")
    parser.add_argument("--floor-threads", type=int, default=1,
                        help="threads for the floor comparison (1: per core, robust to other processes' load)")
    parser.add_argument("--samples", type=int, default=20000, help="rows for the accumulation benchmark")
    parser.add_argument("--no-pairwise", action="store_true", help="skip the pairwise AA law (a quick check)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "clients", "dim", "classes", "per_client", "held", "floor_threads", "samples",
                           "repeats")
    device = resolve_device(args.device)
    load_start = os.getloadavg()[0]
    agg = aggregation(args.clients, args.dim, args.classes, args.per_client, device, not args.no_pairwise)
    flo = bandwidth_floor(args.held, args.dim, args.classes, args.per_client, device, args.repeats,
                          args.floor_threads)
    acc = accumulation(args.samples, args.dim, args.classes, device, args.repeats)
    w, d, k = 44, args.dim, args.clients
    ok = agg["packed_diff"] < 1e-10 and agg["stats_diff"] < 1e-10 and flo["rhs_diff"] < 1e-12 \
        and flo["stats_rhs_diff"] < 1e-10
    lines = [
        bench.machine(device=device, torch=torch.__version__),
        f"AFL aggregation, K={k} clients, d={d}, C={args.classes}, N_k={args.per_client}, gamma=1, float64:",
        bench.row("upload per client, full C (paper)",
                  f"{agg['upload_full'] / 1e6:.2f} MB  (W {d}x{args.classes}, C {d}x{d}, gamma)", w),
        bench.row("upload per client, packed C (default)",
                  f"{agg['upload_packed'] / 1e6:.2f} MB  (C as its upper triangle, d(d+1)/2 = {d * (d + 1) // 2})", w),
        bench.row("upload ratio packed / full", f"{agg['upload_packed'] / agg['upload_full']:.4f}", w),
        bench.row("upload per client, packed C + B", f"{agg['upload_stats'] / 1e6:.2f} MB  (B = X_k^T Y_k in place of W, "
                  f"{d}x{args.classes}; not the paper's upload)", w),
    ]
    if args.no_pairwise:
        lines.append(bench.row("pairwise AA law (paper, eqs. 9-10)", "skipped (--no-pairwise)", w))
    else:
        lines.append(bench.row("pairwise AA law (paper, eqs. 9-10)",
                               f"{agg['t_pairwise']:.2f} s  (server time on full uploads; client solves excluded)", w))
    lines += [
        bench.row("one-solve form, full C uploads", f"{agg['t_one_solve']:.2f} s", w),
        bench.row("one-solve form, packed C uploads", f"{agg['t_packed']:.2f} s", w),
        bench.row("one-solve form, packed C + B uploads", f"{agg['t_stats']:.2f} s", w),
    ]
    times = {"one-solve": agg["t_one_solve"], "one-solve packed": agg["t_packed"],
             "one-solve C+B": agg["t_stats"]}
    if not args.no_pairwise:
        times = {"pairwise": agg["t_pairwise"], **times}
    lines += bench.ratio_rows(times, "one-solve", w, fmt=".2f")
    if not args.no_pairwise:
        lines.append(bench.row("max |W_pairwise - W_one_solve|",
                               f"{agg['max_diff']:.2e} (max |W| = {agg['max_abs_w']:.2e})", w))
    lines += [
        bench.check_row("max rel. |W_packed - W_full| (one-solve)", agg["packed_diff"], 1e-10, "RI-restored heads", w),
        bench.check_row("max rel. |W_C+B - W_full| (one-solve)", agg["stats_diff"], 1e-10, "RI-restored heads", w),
        f"One-solve server per upload vs the memory-bandwidth floor, {args.held} uploads held in memory, "
        f"{args.floor_threads} thread{'s' if args.floor_threads > 1 else ''}, best of {args.repeats}:",
        bench.row("floor: sum the full C (read once)",
                  f"{flo['floor full'] * 1e3:.3f} ms/upload  ({flo['bytes_full'] / flo['floor full'] / 1e9:.1f} GB/s; "
                  f"x K = {flo['floor full'] * k:.2f} s)", w),
        bench.row("floor: sum the packed C (read once)",
                  f"{flo['floor packed'] * 1e3:.3f} ms/upload  "
                  f"({flo['bytes_packed'] / flo['floor packed'] / 1e9:.1f} GB/s; x K = {flo['floor packed'] * k:.2f} s)", w),
        bench.row("arithmetic: C_k W_k by BLAS, no sum",
                  f"{flo['arithmetic'] * 1e3:.3f} ms/upload  ({2 * d * d * args.classes / flo['arithmetic'] / 1e9:.1f} "
                  f"GFLOP/s; the server's d^2 C multiply-adds alone)", w),
        bench.row("server, full C (one pass)", f"{flo['server full'] * 1e3:.3f} ms/upload", w),
        bench.row("server, packed C (one pass)", f"{flo['server packed'] * 1e3:.3f} ms/upload", w),
        bench.row("server, packed C + B (sums only)", f"{flo['server statistics'] * 1e3:.3f} ms/upload", w),
        bench.row("its upload check alone (packed C + B)", f"{flo['check statistics'] * 1e3:.3f} ms/upload  (shapes, "
                  f"dtypes, finite values: one read)", w),
        *bench.ratio_rows({"floor full": flo["floor full"], "server full": flo["server full"],
                           "server packed": flo["server packed"]}, "floor full", w, fmt=".2f"),
        *bench.ratio_rows({"floor packed": flo["floor packed"], "server packed": flo["server packed"],
                           "server C+B": flo["server statistics"], "check C+B": flo["check statistics"]},
                          "floor packed", w, fmt=".2f"),
        *bench.ratio_rows({"arithmetic": flo["arithmetic"], "server packed": flo["server packed"]},
                          "arithmetic", w, fmt=".2f"),
        bench.check_row("max rel. |B_packed - B_full|", flo["rhs_diff"], 1e-12, "sum_k C_k W_k, both forms", w),
        bench.check_row("max rel. |B_C+B - B_full|", flo["stats_rhs_diff"], 1e-10, "sum_k X_k^T Y_k against it", w),
        f"Statistics accumulation, N={args.samples}, d={d} (float32 features -> float64), best of {args.repeats}:",
        bench.row("SufficientStats.from_data", f"{acc['t_stats'] * 1e3:.1f} ms  ({acc['gflops_stats']:.1f} GFLOP/s)", w),
        bench.row("plain float64 X^T X, same size", f"{acc['t_plain'] * 1e3:.1f} ms  ({acc['gflops_plain']:.1f} GFLOP/s)", w),
        bench.row("rate ratio accumulation / plain", f"{acc['gflops_stats'] / acc['gflops_plain']:.2f}", w),
        bench.row("load average (1 min), start / end",
                  f"{load_start:.2f} / {os.getloadavg()[0]:.2f}  (other processes on this machine)", w),
    ]
    return bench.finish(lines, args.out, ok=ok, width=w)


if __name__ == "__main__":
    sys.exit(main())
