"""STSA-E server cost: the Gram estimate (eq. 9) vectorized, as a per-class loop, and as printed.

The server side of STSA-E at the paper's ResNet-18 scale: M = 5000 random
features, 100 classes, K = 5 real clients x K_D = 50 dummy clients = 250 (dummy) clients, gamma = 1e4.
All 100 classes go into one estimate: eq. 9 is a sum over classes, so this is the total estimation
work of the T = 10 stages of 10 classes (the per-stage calls split the same terms); one ridge solve.

Uploads without a backbone. Labels: a CIFAR-100-sized vector (classes x 500 samples) split over the
clients by ``make_partition(..., "dirichlet", alpha=beta)`` (beta = 0.5), each client's samples cut
into K_D dummy clients by ``dummy_split(..., split="random")`` (the authors' scheme), so many
(dummy, class) counts are 0 as in the real method. Class sums (float64): per class a non-negative
mean m_i = ReLU(1 + 0.5 z + 0.5 z_i) (z shared by all classes, z_i per class, N(0, 1) entries of
length M: uncentred, ReLU-like features), and for a (dummy, class) pair with count n > 0 the sum
n m_i + 0.6 sqrt(n) e (e ~ N(0, I_M)) clipped at 0; 0 where n = 0. This is the distribution of a sum
of n features with mean m_i and per-feature std 0.6, drawn in one shot. The timings do not depend
on the values; only the count pattern (the non-empty terms) matters.

Timed in one process, k_mode = "global" (the paper / authors' code):

(a) ``fedlib.stsa.algorithm.gram_estimate`` (one (M, #non-empty) matrix product) + ``ridge_solve``;
(b) :func:`gram_per_class`: a Python loop over classes, each class's between-client scatter plus
    its mean term as one matrix product over its non-empty dummy clients;
(c) ``fedlib.stsa.studies.gram_estimate_eq9``: eq. 9 as printed, one M x M outer product per non-empty
    (dummy, class) term. At full size it takes far longer than (a), so it is timed on the first N
    classes (N chosen from a one-class pilot so the run takes about ``--eq9-seconds``) and the
    full-size time is printed as a labelled linear extrapolation in the number of classes.

    python -m fedlib.stsa.bench [--M 5000] [--classes 100] [--clients 5] [--dummy 50] [--out FILE]

The report goes to ``book/benchmarks/stsa_gram.txt`` unless ``--out`` says otherwise (``--out -``: print only).
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch import Tensor

from fedlib.core.linalg import relative_error, ridge_solve
from fedlib.core.seeds import derive_seed
from fedlib.data.partition import make_partition
from fedlib.evaluation import benchmark as bench
from fedlib.evaluation.benchmark import timed
from fedlib.stsa.algorithm import K_MODES, dummy_split, gram_estimate
from fedlib.stsa.studies import gram_estimate_eq9, upload_floats

__all__ = ["make_uploads", "gram_per_class", "relative_error", "main"]


def make_uploads(M: int, classes: int, clients: int, dummy: int, per_class: int = 500, beta: float = 0.5,
                 seed: int = 0) -> tuple[Tensor, Tensor]:
    """Synthetic STSA-E uploads of all ``clients * dummy`` dummy clients (see the module docstring).

    Returns class_sums (J, M, classes) float64 and counts (J, classes) float64, J = clients * dummy,
    dummy clients of client k in rows k * dummy ... (k + 1) * dummy - 1.
    """
    labels = np.repeat(np.arange(classes), per_class)
    parts = make_partition(labels, clients, "dirichlet", alpha=beta, seed=seed, min_size=dummy)
    counts = []
    for k, part in enumerate(parts):
        local = labels[part]
        for chunk in dummy_split(local, dummy, split="random", seed=derive_seed(seed, "dummy", k)):
            counts.append(np.bincount(local[chunk], minlength=classes))
    counts_t = torch.from_numpy(np.stack(counts)).to(torch.float64)                  # (J, c)
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(M, 1, generator=gen, dtype=torch.float64)
    means = torch.relu(1.0 + 0.5 * common + 0.5 * torch.randn(M, classes, generator=gen, dtype=torch.float64))
    sums = torch.empty(len(counts), M, classes, dtype=torch.float64)
    for j in range(len(counts)):                                                     # (M, c) temporaries only
        n = counts_t[j]
        torch.randn(M, classes, generator=gen, dtype=torch.float64, out=sums[j])
        sums[j].mul_(0.6 * n.sqrt()).add_(means * n).clamp_min_(0.0)
    return sums, counts_t


def gram_per_class(class_sums: Tensor, counts: Tensor, k_mode: str = "global") -> Tensor:
    """Eq. 9 in its PSD form, the natural loop over classes: for class i with non-empty dummy clients
    k (n_k > 0), total n, mean m = s / n and K_i = #{k : n_k > 0} (``per_class``) or J (``global``),

        G_hat += D_i^T D_i,   D_i = [rows sqrt((n-1)/(K-1) n_k) (s_k / n_k - m);  sqrt(n) m]

    one (K_i + 1, M) matrix and one product per class (the between-client scatter plus the mean
    term). K = 1 leaves only the mean term. Same shapes as :func:`fedlib.stsa.algorithm.gram_estimate`."""
    if k_mode not in K_MODES:
        raise ValueError(f"k_mode must be one of {K_MODES}, got {k_mode!r}")
    class_sums = class_sums.to(torch.float64)
    counts = counts.to(class_sums)
    m_dim = class_sums.shape[1]
    out = torch.zeros(m_dim, m_dim, dtype=torch.float64, device=class_sums.device)
    for i in range(counts.shape[1]):
        rows = torch.nonzero(counts[:, i] > 0).flatten()
        if len(rows) == 0:
            continue
        n_k = counts[rows, i]                                                       # (K_i,)
        s_k = class_sums[rows, :, i]                                                # (K_i, M)
        n = n_k.sum()
        mean = s_k.sum(0) / n
        k = counts.shape[0] if k_mode == "global" else len(rows)
        a = (n - 1) / (k - 1) if k > 1 else torch.zeros_like(n)
        dev = (s_k / n_k[:, None] - mean) * torch.sqrt(a * n_k)[:, None]
        d = torch.cat([dev, (mean * n.sqrt())[None]])                               # (K_i + 1, M)
        out.addmm_(d.T, d)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "stsa_gram", repeats=None)
    parser.add_argument("--M", type=int, default=5000, help="random features")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=5, help="real clients K")
    parser.add_argument("--dummy", type=int, default=50, help="dummy clients per client K_D")
    parser.add_argument("--per-class", type=int, default=500, help="samples per class (CIFAR-100: 500)")
    parser.add_argument("--beta", type=float, default=0.5, help="Dirichlet concentration of the label skew")
    parser.add_argument("--gamma", type=float, default=1e4, help="ridge gamma (paper, ResNet-18: 1e4)")
    parser.add_argument("--eq9-seconds", type=float, default=120.0,
                        help="target seconds for (c); it runs on all classes if they fit")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "M", "classes", "clients", "dummy", "per_class")
    tol = 1e-10

    (sums, counts), t_gen = timed(lambda: make_uploads(args.M, args.classes, args.clients, args.dummy,
                                                        args.per_class, args.beta, args.seed))
    J, c = counts.shape
    nonempty = int((counts > 0).sum())
    rhs = sums.sum(0)                                                                # C (M, c), exact
    torch.ones(256, 256, dtype=torch.float64) @ torch.ones(256, 256, dtype=torch.float64)  # BLAS warm-up

    # (a) vectorized estimate + solve
    g_a, t_a = timed(lambda: gram_estimate(sums, counts, "global"))
    _, t_solve = timed(lambda: ridge_solve(g_a, rhs, args.gamma))
    # (b) per-class loop
    g_b, t_b = timed(lambda: gram_per_class(sums, counts, "global"))
    diff_b = relative_error(g_b, g_a)
    del g_b
    # (c) eq. 9 as printed: pilot on class 0, then the first N classes
    _, t_pilot = timed(lambda: gram_estimate_eq9(sums[:, :, :1], counts[:, :1], "global"))
    n_c = int(min(c, max(1, args.eq9_seconds // max(t_pilot, 1e-9))))
    g_c, t_c = timed(lambda: gram_estimate_eq9(sums[:, :, :n_c], counts[:, :n_c], "global"))
    if n_c == c:
        g_a_sub, t_a_sub = g_a, t_a
    else:
        g_a_sub, t_a_sub = timed(lambda: gram_estimate(sums[:, :, :n_c], counts[:, :n_c], "global"))
    diff_c = relative_error(g_c, g_a_sub)
    nonempty_c = int((counts[:, :n_c] > 0).sum())
    t_c_full = t_c / n_c * c

    mib64 = args.dummy * (args.M + 1) * c * 8 / 2**20
    mib32 = upload_floats("stsa_e", args.M, c, args.dummy) * 4 / 2**20
    ok = diff_b < tol and diff_c < tol
    full = n_c == c
    label_c = "measured, all classes" if full else f"MEASURED ON {n_c} OF {c} CLASSES"
    def row(label: str, value: str) -> str:
        return bench.row(label, value, 42)

    lines = [
        bench.machine(device="cpu", torch=torch.__version__),
        "STSA-E server Gram estimate (eq. 9, k_mode=global), float64, one process:",
        f"  M={args.M} features, {c} classes, {args.clients} clients x K_D={args.dummy} = {J} dummy clients, "
        f"{args.per_class} samples/class, Dirichlet beta={args.beta}, split=random",
        row("non-empty (dummy, class) terms", f"{nonempty} of {J * c} ({nonempty / (J * c):.1%})"),
        row("upload per client", f"{mib64:.2f} MiB float64 ({mib32:.2f} MiB float32, the paper's count)"),
        row("synthetic uploads generated in", f"{t_gen:.1f} s (not timed below)"),
        row("(a) gram_estimate, vectorized", f"{t_a:.2f} s  (one ({args.M}, {nonempty}) matrix product)"),
        row(f"    ridge_solve(G_hat, C, {args.gamma:g})", f"{t_solve:.2f} s  (separate; not in the ratios)"),
        row("    (a) estimate + solve", f"{t_a + t_solve:.2f} s"),
        row("(b) per-class loop, 1 product/class", f"{t_b:.2f} s"),
        row("(c) gram_estimate_eq9, outer products", f"{t_c:.2f} s  ({label_c}; {nonempty_c} non-empty terms)"),
        row("    (c) time per class", f"{t_c / n_c:.3f} s  ({t_c / max(nonempty_c, 1) * 1e3:.1f} ms per term; "
            f"pilot, class 0 alone: {t_pilot:.3f} s)"),
    ]
    if not full:
        lines += [
            row(f"    (a) on the same {n_c} classes", f"{t_a_sub:.2f} s"),
            row("    (c) full size, LINEAR EXTRAPOLATION", f"{t_c_full:.0f} s = {t_c / n_c:.3f} s/class x {c} classes "
                f"(NOT measured)"),
        ]
    lines += [
        *bench.ratio_rows({"(a)": t_a, "(b)": t_b}, "(a)", 42, "(estimate only, full size, both measured)"),
        *bench.ratio_rows({"(a)": t_a_sub, "(c)": t_c}, "(a)", 42, f"(estimate only, measured on {n_c} of {c} classes)"),
    ]
    if not full:
        lines.append(row("time ratio (c) / (a), full size", f"{t_c_full / t_a:.1f}x  "
                         f"(EXTRAPOLATED (c) / measured (a))"))
    lines += [
        bench.check_row("max rel. difference (b) vs (a)", diff_b, tol, "max |G_b - G_a| / max |G_a|, all classes", 42),
        bench.check_row("max rel. difference (c) vs (a)", diff_c, tol, f"on {n_c} of {c} classes", 42),
    ]
    return bench.finish(lines, args.out, ok, 42)


if __name__ == "__main__":
    sys.exit(main())
