"""The ``paper`` profile's dominant units of work on an accelerator against the same machine's CPU.

At ``paper`` the GPU chapters spend their time in three kinds of work (README, "The `paper` profile
on a GPU"); each is timed here on ``--device`` and on the CPU (all of its cores), in one process, with
the library's own code and random inputs and weights (the time depends on the shapes, not the values):

(a) feature extraction (AFL, STSA): torchvision's ResNet-18 at 224 px, frozen
    (:func:`fedlib.data.features.resnet18_backbone`, random weights), through
    :func:`fedlib.data.features.extract_batches` in the device's and the CPU's default batches;
(b) client SGD (Re-Fed): one :class:`fedlib.federated.gradient.GradientClient` step (FedAvg's loss,
    one local epoch) of :func:`fedlib.federated.models.resnet18_cifar` on 1 x 28 x 28 images
    (Fashion-MNIST), batches of ``--batch-size``;
(c) Re-Fed's PIM (Eq. 3) with its per-sample squared gradient norms (Eq. 4, ``grad_norm="exact"``):
    one epoch of :func:`fedlib.refed.algorithm.train_pim` on the same model and images;
(d) on the device only (``--run-images`` > 0): a whole Re-Fed run through
    :func:`fedlib.refed.studies.run_scenario` at the paper's model, clients, participation, batch,
    memory and lambda, on ``--run-images`` random training images, shortened (:data:`SHORT`: 2 tasks,
    2 rounds each, 2 local and 2 PIM epochs), against the projection of (b) and (c) for the same
    sizes: the check that the projection below counts the run's work.

Each unit runs once untimed, then ``--repeats`` times; rates use the median. The device side runs
``--device-scale`` times as many images or samples as the CPU side (the CPU at the paper's sizes would
take hours). The last rows project, from these rates and the ``paper`` profile's sizes (defaults
below, checked against ``notebooks/profiles.yml`` by the tests), the two units that grow with the
profile: extracting a dataset once, and one Re-Fed run's client SGD and PIMs (evaluation and
aggregation are left out; (d) compares a whole shortened run with its projection).

    python -m fedlib.bench.paper_device [--device cuda] [--images 256] [--samples 256] [--run-images 60000]
        [--out FILE]
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from functools import partial

import numpy as np
import torch

from fedlib.core.messages import Message
from fedlib.data.features import CPU_BATCH, DEVICE_BATCH, extract_batches, resnet18_backbone
from fedlib.data.streams import make_stream
from fedlib.evaluation import benchmark as bench
from fedlib.federated.gradient import FedConfig, GradientClient, detached, make_algorithm
from fedlib.federated.models import make_model, resnet18_cifar
from fedlib.refed.algorithm import train_pim
from fedlib.refed.studies import make_scenario, run_scenario

__all__ = ["PAPER", "main"]

#: the ``paper`` profile's sizes behind the projections (refed_benchmark's class-incremental stream;
#: Fashion-MNIST's 70,000 images for AFL, CIFAR-100's 60,000 for STSA), checked by the tests
PAPER = {"afl_images": 70000, "stsa_images": 60000, "n_train": 60000, "num_tasks": 5, "num_clients": 20,
         "participation": 0.4, "rounds": 150, "local_epochs": 20, "memory": 1000, "pim_epochs": 40,
         "batch_size": 64, "lr": 0.01, "lam": 0.8}


#: the shortened run of (d)
SHORT = {"num_tasks": 2, "rounds": 2, "local_epochs": 2, "pim_epochs": 2}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_rate(fn, count: int, repeats: int, device: torch.device) -> float:
    """``count`` items per call of ``fn``: items per second over the median of ``repeats`` timed calls."""
    def call():
        fn()
        _sync(device)
    timing = bench.measure({"unit": call}, repeats)["unit"]
    return count / statistics.median(timing.times)


def extraction_rate(device: torch.device, images: int, repeats: int, seed: int) -> float:
    """Images per second of ResNet-18 @ 224 px over ``images`` random 28 x 28 gray images."""
    net = resnet18_backbone().to(device).eval().to(memory_format=torch.channels_last)
    x = np.random.default_rng(seed).integers(0, 256, (images, 28, 28), dtype=np.uint8)
    batch = DEVICE_BATCH if device.type == "cuda" else CPU_BATCH
    return _median_rate(lambda: extract_batches(net, 512, x, 224, device, batch, "", progress=False), images,
                        repeats, device)


def _images(n: int, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g).to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def client_rate(device: torch.device, samples: int, repeats: int, seed: int, batch_size: int, lr: float) -> float:
    """Samples per second of one FedAvg client epoch of ResNet-18 (CIFAR variant) on ``samples`` images."""
    torch.manual_seed(seed)
    model = resnet18_cifar(1, 10).to(device)
    config = FedConfig(rounds=1, local_epochs=1, batch_size=batch_size, lr=lr, momentum=0.0, weight_decay=0.0,
                       seed=seed, device=str(device), num_threads=None)
    client = GradientClient(make_algorithm("fedavg"), model, config, num_classes=10)
    broadcast = Message("server", {"state": detached(model)})
    data, state = _images(samples, device, seed), client.init_state(0)
    return _median_rate(lambda: client.step(data, state, broadcast), samples, repeats, device)


def pim_rate(device: torch.device, samples: int, repeats: int, seed: int, batch_size: int, lr: float,
             lam: float) -> float:
    """Samples per second of one PIM epoch (step and exact per-sample norms) on ``samples`` images."""
    torch.manual_seed(seed)
    model = resnet18_cifar(1, 10).to(device)
    x, y = _images(samples, device, seed)
    y = y % 8   # 8 old classes of 10, say: the PIM sees the old classes only
    return _median_rate(lambda: train_pim(model, x, y, 8, lam=lam, epochs=1, lr=lr, batch_size=batch_size), samples,
                        repeats, device)


def refed_run_seconds(client_per_s: float, pim_per_s: float, p: dict = PAPER) -> tuple[float, float]:
    """(client SGD, PIMs) seconds of one Re-Fed run at sizes ``p``: on task t every round's sampled
    clients train ``local_epochs`` epochs on their share of the task (n_train / (tasks x clients)) plus
    their cache, min(memory, (t - 1) x share); at the start of every task after the first each client
    trains its PIM for ``pim_epochs`` epochs on its pool, its previous local set (share + the previous
    cache; :class:`fedlib.federated.learner.GradientLearner`'s cache round)."""
    share = p["n_train"] / (p["num_tasks"] * p["num_clients"])
    sampled = math.ceil(p["participation"] * p["num_clients"])
    cache = [min(p["memory"], t * share) for t in range(p["num_tasks"])]
    sgd = p["rounds"] * sampled * p["local_epochs"] * sum(share + c for c in cache)
    pim = p["num_clients"] * p["pim_epochs"] * sum(share + c for c in cache[:-1])
    return sgd / client_per_s, pim / pim_per_s


def refed_run(device: torch.device, n_train: int, seed: int) -> float:
    """Seconds of one Re-Fed run (:func:`run_scenario`) at the paper's settings shortened to :data:`SHORT`,
    on ``n_train`` random 28 x 28 images of 10 classes (and n_train / 6 test images)."""
    p = {**PAPER, **SHORT}
    rng = np.random.default_rng(seed)
    n_test = max(n_train // 6, 10)
    x_tr, x_te = (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for n in (n_train, n_test))
    y_tr, y_te = np.arange(n_train) % 10, np.arange(n_test) % 10
    scenario = make_scenario("timing", x_tr, y_tr, x_te, y_te, partial(make_stream, y_tr, y_te, p["num_tasks"]),
                             alpha=1.0, lr=p["lr"], memory=p["memory"], lam=p["lam"], rounds=p["rounds"],
                             first_rounds=None, epochs=p["local_epochs"])
    t0 = time.perf_counter()
    run_scenario(scenario, "class", "refed", seed, model_fn=partial(make_model, "resnet18", 1, 10),
                 num_clients=p["num_clients"], batch_size=p["batch_size"], momentum=0.0,
                 participation=p["participation"], device=str(device), num_threads=None, memory_mode="replay",
                 pim_epochs=p["pim_epochs"], grad_norm="exact")
    _sync(device)
    return time.perf_counter() - t0


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:10.1f} h" if seconds >= 3600 else f"{seconds / 60:10.1f} min" if seconds >= 60 \
        else f"{seconds:10.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "paper_device")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--images", type=int, default=256, help="images the CPU extracts per timed pass")
    parser.add_argument("--samples", type=int, default=256, help="samples of a CPU client epoch and PIM epoch")
    parser.add_argument("--device-scale", type=int, default=16, help="the device side's sizes over the CPU's")
    parser.add_argument("--batch-size", type=int, default=PAPER["batch_size"])
    parser.add_argument("--run-images", type=int, default=PAPER["n_train"],
                        help="training images of the device's whole shortened run (d); 0 skips it")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "images", "samples", "device_scale", "batch_size", "repeats")
    if args.run_images < 0:
        parser.error(f"--run-images must be >= 0, got {args.run_images}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device on this machine")
    cpu = torch.device("cpu")
    sizes = {"cpu": (args.images, args.samples), "device": (args.images * args.device_scale,
                                                            args.samples * args.device_scale)}
    rates = {}
    for side, dev in (("device", device), ("cpu", cpu)):
        n_img, n = sizes[side]
        rates[side] = {"extract": extraction_rate(dev, n_img, args.repeats, args.seed),
                       "client": client_rate(dev, n, args.repeats, args.seed, args.batch_size, PAPER["lr"]),
                       "pim": pim_rate(dev, n, args.repeats, args.seed, args.batch_size, PAPER["lr"], PAPER["lam"])}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [bench.machine(device=name, torch=torch.__version__),
             f"paper-profile units, median of {args.repeats} timed runs; device side {args.device_scale}x the CPU's "
             f"sizes (CPU: {args.images} images, {args.samples} samples)"]
    labels = {"extract": "(a) ResNet-18 @ 224 px extraction", "client": "(b) client SGD, ResNet-18 (CIFAR)",
              "pim": "(c) PIM epoch, exact per-sample norms"}
    unit = {"extract": "images/s", "client": "samples/s", "pim": "samples/s"}
    for key, label in labels.items():
        dev_r, cpu_r = rates["device"][key], rates["cpu"][key]
        lines += [label, bench.row(f"on {name}", f"{dev_r:10.1f} {unit[key]}"),
                  bench.row(f"on the CPU ({torch.get_num_threads()} threads)", f"{cpu_r:10.1f} {unit[key]}"),
                  bench.row("speed-up device / CPU", f"{dev_r / cpu_r:.1f}x")]
    lines.append("projections at the paper profile's sizes (from the rates above)")
    for side in ("device", "cpu"):
        r = rates[side]
        where = name if side == "device" else "the CPU"
        for what, n_img in (("AFL extraction, 70,000 images", PAPER["afl_images"]),
                            ("STSA extraction, 60,000 images", PAPER["stsa_images"])):
            lines.append(bench.row(f"{what}, {where}", _duration(n_img / r["extract"])))
        sgd, pim = refed_run_seconds(r["client"], r["pim"])
        lines.append(bench.row(f"one Re-Fed run (SGD + PIMs), {where}",
                               f"{_duration(sgd + pim)}  (client SGD {sgd / 3600:.1f} h, PIMs {pim / 3600:.1f} h)"))
    if args.run_images:
        short = {**PAPER, **SHORT, "n_train": args.run_images}
        projected = sum(refed_run_seconds(rates["device"]["client"], rates["device"]["pim"], short))
        measured = refed_run(device, args.run_images, args.seed)
        lines += [f"(d) one whole Re-Fed run on {name}, shortened: {args.run_images:,} images, "
                  + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in SHORT.items()),
                  bench.row("measured", _duration(measured)),
                  bench.row("projected from (b) and (c)", _duration(projected)),
                  bench.row("measured / projected", f"{measured / projected:.2f}x")]
    return bench.finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
