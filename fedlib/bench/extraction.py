"""Frozen-backbone forwards on a CPU: images per forward against time per image, same features.

The book's first run passes every image of the AFL and STSA chapters once through EfficientNet-Lite0
at 64 px (:func:`fedlib.data.features.extract_features`), and STSA's scratch setting embeds every
image through each stage-1 SmallResNet (:func:`fedlib.federated.models.embed`). On a CPU a batch
smaller than 256 or 1024 images keeps a layer's activations in the cache. Timed here on one thread
(what a chapter gets when two run side by side), interleaved
(:func:`fedlib.bench.measure`), on ``--images`` random 28 x 28 grayscale images:

(a) EfficientNet-Lite0 @ 64 px in batches of 256 (the baseline), 128, 64, 32
    (``features.CPU_BATCH``, the default; batches are split evenly, so none is under 16 images:
    below that, another convolution kernel changes the features in round-off);
(b) a SmallResNet of widths (8, 16, 32) (STSA's scratch backbone) in batches of 1024 (the
    baseline) and 256 (the default).

Each variant's features are checked equal, bit for bit, to the baseline's (max |difference| = 0).

    python -m fedlib.bench.extraction [--images 2048] [--repeats 3] [--out FILE]
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from fedlib.data.features import CPU_BATCH, extract_batches, load_backbone
from fedlib.evaluation import benchmark as bench
from fedlib.federated.models import SmallResNet, embed

__all__ = ["main"]


def _features_in_batches(module, images: np.ndarray, size: int, batch: int) -> torch.Tensor:
    return torch.from_numpy(extract_batches(module, 1280, images, size, torch.device("cpu"), batch, "", progress=False))


def _equal_row(label: str, diff: float) -> str:
    return bench.row(label, f"{diff:.1e}  (check: equal bit for bit: {'passed' if diff == 0.0 else 'FAILED'})")


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "extraction")
    parser.add_argument("--images", type=int, default=2048, help="random 28 x 28 images per timed pass")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "images", "repeats")

    torch.set_num_threads(1)
    images = np.random.default_rng(args.seed).integers(0, 256, (args.images, 28, 28), dtype=np.uint8)
    net, _ = load_backbone("efficientnet_lite0")
    batches = [256, 128, 64, CPU_BATCH]
    eff = bench.measure({f"batch {b}": (lambda b=b: _features_in_batches(net, images, 64, b)) for b in batches},
                        args.repeats)
    torch.manual_seed(args.seed)
    resnet = SmallResNet(1, 2, widths=(8, 16, 32), blocks=(1, 1, 1)).eval()
    x = torch.from_numpy(images).float().div_(255.0).unsqueeze(1)
    res = bench.measure({f"batch {b}": (lambda b=b: embed(resnet, x, batch_size=b)) for b in (1024, 256)}, args.repeats)

    n = args.images
    lines = [bench.machine(torch=torch.__version__, images=n),
             "(a) EfficientNet-Lite0 @ 64 px, one thread (best of the timed runs; ms per image):"]
    lines += [bench.row(f"    {label}", f"{t.best / n * 1e3:.3f} ms/image  ({n / t.best:.0f} images/s)") for label, t in eff.items()]
    lines += bench.ratio_rows({k: t.best for k, t in eff.items()}, "batch 256", note="(below 1: faster)", fmt=".2f")
    ok = True
    for label, t in list(eff.items())[1:]:
        diff = float((t.out - eff["batch 256"].out).abs().max())
        ok &= diff == 0.0
        lines.append(_equal_row(f"max |features - batch 256's| ({label})", diff))
    lines.append("(b) SmallResNet widths (8, 16, 32) (STSA's scratch backbone), one thread:")
    lines += [bench.row(f"    {label}", f"{t.best / n * 1e3:.3f} ms/image") for label, t in res.items()]
    lines += bench.ratio_rows({k: t.best for k, t in res.items()}, "batch 1024", note="(below 1: faster)", fmt=".2f")
    diff = float(np.abs(res["batch 256"].out - res["batch 1024"].out).max())
    ok &= diff == 0.0
    lines.append(_equal_row("max |features - batch 1024's| (batch 256)", diff))
    return bench.finish(lines, args.out, ok)


if __name__ == "__main__":
    sys.exit(main())
