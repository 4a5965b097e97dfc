"""Re-Fed importance scoring: per-sample squared gradient norms (Eq. 4), ghost norms against vmap and a loop.

Every client of Re-Fed scores every sample of its candidate pool once per PIM epoch with
G(x_i) = ||grad_theta CE(f(x_i), y_i)||^2 over all trainable parameters.
This benchmark measures that scoring step alone (no PIM update), in float32 (what the notebook
runs), with random inputs, labels and weights (the arithmetic does not depend on the values), on

* SmallCNNs of the sizes ``--models`` (default: the notebook's quick model, width 8 / hidden 64,
  and SmallCNN's default 32 / 128) on Fashion-MNIST-sized inputs (1 x 28 x 28, 10 classes, all
  seen), ``--n`` samples in batches of ``--batch-size``;
* ``resnet18_cifar`` (the paper's backbone, 3 x 32 x 32, 10 classes, eval mode) for each norm of
  ``--resnet-norms`` (default: BatchNorm, with random running statistics, and GroupNorm),
  ``--resnet-n`` samples in batches of ``--resnet-batch`` (``--resnet-n 0`` skips it);

four ways, every one in one process:

(a) ``fedlib.core.persample.grad_sq_norms``: ghost norms, one forward and one backward per batch,
    each layer's squared norm from its inputs and output gradients, no per-sample gradient formed;
(b) ``fedlib.core.persample.vmap_grad_sq_norms``: ``torch.func.vmap(grad)``, every per-sample
    gradient materialised (chunks capped at ``CHUNK_FLOATS`` floats: 3 samples for ResNet-18);
(c) ``fedlib.core.persample.reference_grad_sq_norms``: one forward + autograd backward per sample;
(d) ``fedlib.core.persample.last_layer_grad_sq_norms``: the closed form ||pi - e_y||^2 (||h||^2 + 1)
    for the output layer only (forward pass only): a different quantity (the classifier's share of
    the norm), timed for the ``grad_norm="last_layer"`` option, compared with (c) restricted to the
    classifier's parameters.

Each method runs once untimed, then ``--repeats`` times interleaved (a, b, c, d, a, ...) so that
load from other processes hits all of them alike; best and median times are printed, throughputs
and ratios use the median. Agreement is checked in float64 (model and inputs cast; the first
``--check-n`` samples of a SmallCNN, ``--resnet-check-n`` of a ResNet-18): max_i |a_i - c_i| / max_i
|c_i| < 1e-8 for (a) and for (b) against (c). (d) is compared with (c) restricted to the classifier
to 1e-5 only: ``last_layer_grad_sq_norms`` casts the logits and features to float32 whatever the
model's dtype, so float32 round-off (~1e-7) is the best it can do. The float32 differences of (a)
and (b) from (c) are printed for information (three float32 computations of one quantity).

    python -m fedlib.refed.bench [--n 1024] [--models 8x64 32x128] [--resnet-n 32] [--out FILE]
"""
from __future__ import annotations

import argparse
import copy
import os

import torch
from torch import Tensor, nn

from fedlib.core.linalg import relative_error
from fedlib.core.persample import grad_sq_norms, last_layer_grad_sq_norms, reference_grad_sq_norms, vmap_grad_sq_norms
from fedlib.evaluation import benchmark as bench
from fedlib.federated.models import NORMS, SmallCNN, resnet18_cifar

__all__ = ["relative_error", "main"]

TOL = 1e-8
TOL_LAST = 1e-5  # last_layer_grad_sq_norms computes in float32 even for a float64 model
W = 46           # label column of the report
LAST = ["classifier.weight", "classifier.bias"]


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


def _methods(model: nn.Module, x: Tensor, y: Tensor, c: int, bs: int) -> dict:
    return {
        "(a)": lambda: _batched(lambda xb, yb: grad_sq_norms(model, xb, yb, c, batch_size=bs), x, y, bs),
        "(b)": lambda: _batched(lambda xb, yb: vmap_grad_sq_norms(model, xb, yb, c, batch_size=bs), x, y, bs),
        "(c)": lambda: reference_grad_sq_norms(model, x, y, c),
        "(d)": lambda: _batched(lambda xb, yb: last_layer_grad_sq_norms(model, xb, yb, c), x, y, bs),
    }


def measure(title: str, model: nn.Module, x: Tensor, y: Tensor, classes: int, batch_size: int, repeats: int,
            check_n: int) -> tuple[list[str], bool]:
    """Time (a)-(d) on ``model`` (float32, eval mode) over x, y in batches of ``batch_size`` and check
    agreement in float64 on the first ``check_n`` samples; returns report lines and ok."""
    n = int(x.shape[0])
    n_params = sum(p.numel() for p in model.parameters())
    n_last = sum(dict(model.named_parameters())[k].numel() for k in LAST)
    t = bench.measure(_methods(model, x, y, classes, batch_size), repeats)
    med = {k: v.median for k, v in t.items()}
    diff32 = {k: relative_error(t[k].out, t["(c)"].out) for k in ("(a)", "(b)")}

    m64 = copy.deepcopy(model).double()
    k = min(check_n, n)
    x64, y64 = x[:k].double(), y[:k]
    ref_all = reference_grad_sq_norms(m64, x64, y64, classes)
    diff_a = relative_error(_batched(lambda xb, yb: grad_sq_norms(m64, xb, yb, classes, batch_size=batch_size),
                                          x64, y64, batch_size), ref_all)
    diff_b = relative_error(_batched(lambda xb, yb: vmap_grad_sq_norms(m64, xb, yb, classes,
                                                                            batch_size=batch_size), x64, y64, batch_size),
                                 ref_all)
    ref_last = reference_grad_sq_norms(m64, x64, y64, classes, names=LAST)
    diff_d = relative_error(last_layer_grad_sq_norms(m64, x64, y64, classes), ref_last)
    share = float((ref_last / ref_all).median())

    def timing(key: str) -> str:
        return (f"{n / med[key]:>8.1f} samples/s  (median {med[key]:.3f} s, best {t[key].best:.3f} s "
                f"of {repeats} for {n} samples)")

    lines = [
        f"{title}: {n_params:,} parameters ({n_last:,} in the output layer), batches of {batch_size}",
        bench.row("(a) ghost norms, all parameters", timing("(a)"), W),
        bench.row("(b) vmap(grad), all parameters", timing("(b)"), W),
        bench.row("(c) autograd loop, all parameters", timing("(c)"), W),
        bench.row("(d) last-layer closed form", timing("(d)"), W),
        bench.row("speed-up (a) over (b)", f"{med['(b)'] / med['(a)']:.2f}x  (same quantity, median times)", W),
        bench.row("speed-up (a) over (c)", f"{med['(c)'] / med['(a)']:.2f}x  (same quantity, median times)", W),
        bench.row("speed-up (d) over (a)", f"{med['(a)'] / med['(d)']:.2f}x  (different quantity: output layer only)", W),
        bench.row("output layer's share of the norm", f"{share:.3f}  (median over {k} samples of (d)/(c), float64)", W),
        bench.row("max rel. difference (a) vs (c), float32", f"{diff32['(a)']:.2e}  (information only)", W),
        bench.row("max rel. difference (b) vs (c), float32", f"{diff32['(b)']:.2e}  (information only)", W),
        bench.check_row("max rel. difference (a) vs (c), float64", diff_a, TOL,
                        f"max |a - c| / max |c|, {k} samples", W),
        bench.check_row("max rel. difference (b) vs (c), float64", diff_b, TOL,
                        f"max |b - c| / max |c|, {k} samples", W),
        bench.check_row("max rel. difference (d) vs (c) last layer", diff_d, TOL_LAST,
                        f"float64 inputs, {k} samples; (d) works in float32", W),
    ]
    return lines, diff_a < TOL and diff_b < TOL and diff_d < TOL_LAST


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "refed_scoring")
    parser.add_argument("--n", type=int, default=1024, help="SmallCNN: samples scored per timed call")
    parser.add_argument("--batch-size", type=int, default=64, help="SmallCNN: samples per call (the PIM's mini-batch)")
    parser.add_argument("--models", type=_model_size, nargs="+", default=[(8, 64), (32, 128)],
                        help="SmallCNN sizes WIDTHxHIDDEN (default: 8x64, the notebook's quick model, and "
                             "32x128, SmallCNN's default)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=28, help="SmallCNN input size")
    parser.add_argument("--check-n", type=int, default=256, help="SmallCNN: samples of the float64 agreement check")
    parser.add_argument("--resnet-n", type=int, default=32, help="ResNet-18: samples per timed call (0: skip)")
    parser.add_argument("--resnet-batch", type=int, default=32, help="ResNet-18: samples per call")
    parser.add_argument("--resnet-norms", nargs="+", choices=NORMS, default=list(NORMS),
                        help="ResNet-18 norm layers (default: batch and group)")
    parser.add_argument("--resnet-check-n", type=int, default=4, help="ResNet-18: samples of the float64 check")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the notebook runs)")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "n", "batch_size", "classes", "repeats", "check_n", "resnet_batch",
                           "resnet_check_n", "threads")
    if args.resnet_n < 0:
        parser.error(f"--resnet-n must be >= 0, got {args.resnet_n}")
    if args.image_size < 4:
        parser.error("--image-size must be >= 4")
    torch.set_num_threads(args.threads)

    c = args.classes
    lines = [
        bench.machine(load_average_at_start=f"{os.getloadavg()[0]:.1f}", device="cpu", torch=torch.__version__),
        "Re-Fed importance scoring (Eq. 4), per-sample squared gradient norms, float32, one process,",
        f"  {c} classes, all seen, random inputs, labels and weights, eval mode",
    ]
    ok = True
    for width, hidden in args.models:
        torch.manual_seed(args.seed)
        model = SmallCNN(1, c, args.image_size, width, hidden).eval()
        gen = torch.Generator().manual_seed(args.seed + 1)
        x = torch.randn(args.n, 1, args.image_size, args.image_size, generator=gen)
        y = torch.randint(0, c, (args.n,), generator=gen)
        block, good = measure(f"SmallCNN(width={width}, hidden={hidden}), 1x{args.image_size}x{args.image_size} "
                              f"inputs", model, x, y, c, args.batch_size, args.repeats, args.check_n)
        lines += block
        ok = ok and good
    for norm in args.resnet_norms if args.resnet_n else []:
        torch.manual_seed(args.seed)
        model = resnet18_cifar(3, c, norm=norm).eval()
        with torch.no_grad():  # non-trivial running statistics, as after training
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
        gen = torch.Generator().manual_seed(args.seed + 1)
        x = torch.randn(args.resnet_n, 3, 32, 32, generator=gen)
        y = torch.randint(0, c, (args.resnet_n,), generator=gen)
        block, good = measure(f"resnet18_cifar(norm={norm}), 3x32x32 inputs", model, x, y, c, args.resnet_batch,
                              args.repeats, args.resnet_check_n)
        lines += block
        ok = ok and good
    return bench.finish(lines, args.out, ok, W)


if __name__ == "__main__":
    raise SystemExit(main())
