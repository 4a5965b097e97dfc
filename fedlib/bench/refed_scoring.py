"""Re-Fed importance scoring: per-sample squared gradient norms (Eq. 4), vectorized against a loop.

Every client of Re-Fed scores every sample of its candidate pool once per PIM epoch with
G(x_i) = ||grad_theta CE(f(x_i), y_i)||^2 over all trainable parameters (notes Sec. 2.3, [D13]).
This benchmark measures that scoring step alone (no PIM update) on SmallCNNs of the sizes
``--models`` (default: the notebook's quick model, width 8 / hidden 64, and SmallCNN's default
32 / 128) on Fashion-MNIST-sized inputs (1 x 28 x 28, 10 classes, all 10 seen), with random
inputs, labels and weights (the arithmetic does not depend on the values). Timed in one process,
float32 (what the notebook runs), batches of ``--batch-size``, for every model size:

(a) ``fedlib.core.persample.grad_sq_norms``: ``torch.func.vmap(grad)`` over each batch;
(b) ``fedlib.core.persample.reference_grad_sq_norms``: one forward + autograd backward per sample,
    the norm summed over every parameter's gradient (the plain autograd reference);
(c) ``fedlib.core.persample.last_layer_grad_sq_norms``: the closed form ||pi - e_y||^2 (||h||^2 + 1) for the
    output layer only (forward pass only): a different quantity (the classifier's share of the
    norm), timed for the ``grad_norm="last_layer"`` option, compared with (b) restricted to the
    classifier's parameters.

Each method runs ``--repeats`` times, interleaved (a, b, c, a, b, c, ...) so that load from other
processes hits all of them alike; the best and the median time are printed, the throughput and the
ratios use the median. Agreement is checked in float64 (model and inputs cast, first
``--check-n`` samples): max_i |a_i - b_i| / max_i |b_i| < 1e-8 for (a) vs (b). (c) is compared with
(b) restricted to the classifier to 1e-5 only: ``last_layer_grad_sq_norms`` casts the logits and
features to float32 whatever the model's dtype, so float32 round-off (~1e-7) is the best it can do.
The float32 difference of (a) vs (b) is printed for information.

    python -m fedlib.bench.refed_scoring [--n 1024] [--models 8x64 32x128] [--out FILE]
"""
from __future__ import annotations

import argparse
import copy
import os
import platform
import resource
import statistics
import sys
import time

import torch
from torch import Tensor

from fedlib.bench import write_report
from fedlib.federated.models import SmallCNN
from fedlib.core.persample import grad_sq_norms, last_layer_grad_sq_norms, reference_grad_sq_norms

__all__ = ["relative_difference", "main"]

TOL = 1e-8
TOL_LAST = 1e-5  # last_layer_grad_sq_norms computes in float32 even for a float64 model


def relative_difference(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _batched(fn, x: Tensor, y: Tensor, batch_size: int) -> Tensor:
    return torch.cat([fn(x[s:s + batch_size], y[s:s + batch_size]) for s in range(0, int(x.shape[0]), batch_size)])


def _model_size(text: str) -> tuple[int, int]:
    try:
        width, hidden = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"model sizes look like WIDTHxHIDDEN (e.g. 8x64), got {text!r}") from None
    if width < 1 or hidden < 1:
        raise argparse.ArgumentTypeError(f"width and hidden must be >= 1, got {text!r}")
    return width, hidden


def measure(width: int, hidden: int, args) -> tuple[list[str], bool]:
    """Time (a), (b), (c) on one SmallCNN size and check agreement; returns report lines and ok."""
    torch.manual_seed(args.seed)
    model = SmallCNN(1, args.classes, args.image_size, width, hidden).eval()
    n_params = sum(p.numel() for p in model.parameters())
    last = ["classifier.weight", "classifier.bias"]
    n_last = sum(dict(model.named_parameters())[n].numel() for n in last)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.n, 1, args.image_size, args.image_size, generator=gen)
    y = torch.randint(0, args.classes, (args.n,), generator=gen)
    c, bs = args.classes, args.batch_size

    methods = {
        "a": lambda: _batched(lambda xb, yb: grad_sq_norms(model, xb, yb, c, batch_size=bs), x, y, bs),
        "b": lambda: reference_grad_sq_norms(model, x, y, c),
        "c": lambda: _batched(lambda xb, yb: last_layer_grad_sq_norms(model, xb, yb, c), x, y, bs),
    }
    k_warm = min(args.n, bs)                                     # warm-up (vmap tracing, allocator)
    grad_sq_norms(model, x[:k_warm], y[:k_warm], c, batch_size=bs)
    last_layer_grad_sq_norms(model, x[:k_warm], y[:k_warm], c)
    reference_grad_sq_norms(model, x[:8], y[:8], c)
    times: dict[str, list[float]] = {k: [] for k in methods}
    outs: dict[str, Tensor] = {}
    for _ in range(args.repeats):
        for key, fn in methods.items():
            t0 = time.perf_counter()
            outs[key] = fn()
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    diff32 = relative_difference(outs["a"], outs["b"])

    # agreement in float64 on the first check_n samples
    m64 = copy.deepcopy(model).double()
    k = min(args.check_n, args.n)
    x64, y64 = x[:k].double(), y[:k]
    ref_all = reference_grad_sq_norms(m64, x64, y64, c)
    vec_all = _batched(lambda xb, yb: grad_sq_norms(m64, xb, yb, c, batch_size=bs), x64, y64, bs)
    ref_last = reference_grad_sq_norms(m64, x64, y64, c, names=last)
    closed = last_layer_grad_sq_norms(m64, x64, y64, c)
    diff_a = relative_difference(vec_all, ref_all)
    diff_c = relative_difference(closed, ref_last)
    share = float((ref_last / ref_all).median())

    def row(label: str, value: str) -> str:
        return f"  {label:<44}{value}"

    def timing(key: str) -> str:
        return (f"{args.n / med[key]:>8.0f} samples/s  (median {med[key]:.3f} s, best {min(times[key]):.3f} s "
                f"of {args.repeats} for {args.n} samples)")

    lines = [
        f"SmallCNN(width={width}, hidden={hidden}): {n_params:,} parameters ({n_last:,} in the output layer)",
        row("(a) vmap(grad), all parameters", timing("a")),
        row("(b) autograd loop, all parameters", timing("b")),
        row("(c) last-layer closed form", timing("c")),
        row("throughput ratio (a) / (b)", f"{med['b'] / med['a']:.2f}x  (same quantity, both measured)"),
        row("throughput ratio (c) / (a)", f"{med['a'] / med['c']:.2f}x  (different quantity: output layer only)"),
        row("output layer's share of the norm", f"{share:.3f}  (median over {k} samples of (c)/(b), float64)"),
        row("max rel. difference (a) vs (b), float32", f"{diff32:.2e}  (information only)"),
        row("max rel. difference (a) vs (b), float64", f"{diff_a:.2e}  (max |a - b| / max |b|, {k} samples; "
            f"check < {TOL:g}: {'passed' if diff_a < TOL else 'FAILED'})"),
        row("max rel. difference (c) vs (b) last layer", f"{diff_c:.2e}  (float64 inputs, {k} samples; (c) works "
            f"in float32; check < {TOL_LAST:g}: {'passed' if diff_c < TOL_LAST else 'FAILED'})"),
    ]
    return lines, diff_a < TOL and diff_c < TOL_LAST


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="samples scored per timed call")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per vmap call (the PIM's mini-batch)")
    parser.add_argument("--models", type=_model_size, nargs="+", default=[(8, 64), (32, 128)],
                        help="SmallCNN sizes WIDTHxHIDDEN (default: 8x64, the notebook's quick model, and "
                             "32x128, SmallCNN's default)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per method (interleaved)")
    parser.add_argument("--check-n", type=int, default=256, help="samples of the float64 agreement check")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the notebook runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args(argv)
    for name in ("n", "batch_size", "classes", "repeats", "check_n"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.image_size < 4:
        parser.error("--image-size must be >= 4")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start, "
        f"{torch.get_num_threads()} torch threads, device cpu, torch {torch.__version__}",
        "Re-Fed importance scoring (Eq. 4), per-sample squared gradient norms, float32, one process:",
        f"  1x{args.image_size}x{args.image_size} inputs (Fashion-MNIST size), {args.classes} classes seen, "
        f"{args.n} samples per timed call, batches of {args.batch_size}, random inputs, labels and weights",
    ]
    ok = True
    for width, hidden in args.models:
        block, good = measure(width, hidden, args)
        lines += block
        ok = ok and good
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    lines.append(f"peak resident memory: {peak_gib:.2f} GiB")
    report = "\n".join(lines)
    write_report(report, args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
