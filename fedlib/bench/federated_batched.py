"""Gradient baselines on cached features: every client of a round trained at once (batched) vs one after the other.

Prints, in one run on this machine, for each method of ``--methods`` (default FedAvg on the linear
head and MOON on its projection head, the AFL benchmark's two model kinds): the wall-clock of one
whole job of :func:`fedlib.afl.studies.run_baselines` (its ``run_federated`` call) with
``FedConfig(batched_clients=False)`` (the per-client loop, the default) and with
``batched_clients=True`` (stacked parameters, one batched forward / backward per mini-batch step
for all clients), their ratio, and the agreement of the two runs: max relative difference of the
final global weights (float32 round-off only; the mini-batch orders are the same), final test
accuracies, and whether participants and measured bytes are equal.

Sizes are the AFL benchmark's quick profile (``notebooks/profiles.yml``: 10000 training samples,
2000 test, 100 clients, Dirichlet alpha = 0.1, 20 rounds x 1 local epoch, batch 64, lr 0.01, full
participation, test accuracy every round, MOON l1 width 64), but the features are **random**
class-dependent non-negative 1280-d vectors (``features``; 1280 = EfficientNet-Lite0's feature
size), not the chapter's cached features: the time depends on the shapes and the partition, not
on the values.

    python -m fedlib.bench.federated_batched [--methods fedavg moon] [--repeats 3] [--out FILE]

The report goes to ``book/benchmarks/federated_batched.txt`` unless ``--out`` says otherwise
(``--out -``: print only).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

from fedlib.afl import studies as afl_studies
from fedlib.evaluation import benchmark as bench
from fedlib.federated.gradient import ALGORITHMS, FedConfig, make_algorithm, run_federated


def features(n_train: int, n_test: int, dim: int, classes: int, seed: int):
    """Random stand-ins for cached backbone features, train and test from the same classes:
    0.1 ReLU(mean_y + noise), class means and noise N(0, 1) (mean row norm ~3.6)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, dim, generator=g)

    def draw(n):
        y = torch.randint(0, classes, (n,), generator=g)
        return 0.1 * torch.relu(means[y] + torch.randn(n, dim, generator=g)), y

    return draw(n_train), draw(n_test)


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "federated_batched")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "moon"], choices=sorted(ALGORITHMS))
    parser.add_argument("--n-train", type=int, default=10000)
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet label skew of the partition")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--moon-hidden", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "n_train", "n_test", "dim", "classes", "clients", "rounds", "local_epochs",
                           "batch_size", "moon_hidden", "repeats")
    load = os.getloadavg()[0]  # other processes' load (the machine may be shared: it slows both paths)
    (x_tr, y_tr), (x_te, y_te) = features(args.n_train, args.n_test, args.dim, args.classes, args.seed)
    partitions = afl_studies.SettingPartitions(y_tr.numpy())
    setting = ("alpha", args.alpha)
    sizes = np.array([len(p) for p in partitions(setting, args.clients, 0)])
    config = dict(rounds=args.rounds, local_epochs=args.local_epochs, batch_size=args.batch_size, lr=0.01,
                  participation=1.0, device=args.device, eval_every=1)

    def run(method: str, batched: bool):
        """One job of :func:`fedlib.afl.studies.run_baselines`, as it runs it (partition indexing included)."""
        parts = partitions(setting, args.clients, 0)
        return run_federated(afl_studies.baseline_model_fn(method, args.dim, args.classes, args.moon_hidden),
                             [(x_tr[p], y_tr[p]) for p in parts], (x_te, y_te), make_algorithm(method),
                             FedConfig(seed=args.seed, **config, batched_clients=batched), progress=False)

    w = 46
    lines = [
        bench.machine(device=args.device, torch=torch.__version__, load_average_at_start=f"{load:.1f}"),
        f"Gradient baselines on random 1280-d-style features (not the chapter's features): N={args.n_train}, "
        f"d={args.dim}, C={args.classes}, K={args.clients} clients (Dirichlet alpha={args.alpha}: sizes "
        f"{sizes.min()}..{sizes.max()}, median {int(np.median(sizes))}), {args.rounds} rounds x {args.local_epochs} "
        f"local epoch(s), batch {args.batch_size}, full participation, eval every round; one run_baselines job, "
        f"best / median of {args.repeats} (after one warm-up):",
    ]
    ok = True
    for method in args.methods:
        t = bench.measure({"per-client": lambda: run(method, False), "batched": lambda: run(method, True)},
                          args.repeats)
        ha, hb = t["per-client"].out, t["batched"].out
        diff = max(bench.relative_error(hb.final_state[k], ha.final_state[k]) for k in ha.final_state)
        same = ha.participants == hb.participants and ha.bytes_up == hb.bytes_up and ha.bytes_down == hb.bytes_down
        ok &= diff < 1e-4 and same
        model = "MOONHead" if method == "moon" else "LinearHead"
        lines += [
            f"{method} ({model}):",
            bench.row("per-client loop (default)", f"{t['per-client'].best:.2f} s  (median {t['per-client'].median:.2f} s; "
                      f"last run's History.wall_s {ha.wall_s[-1]:.2f} s)", w),
            bench.row("batched_clients=True", f"{t['batched'].best:.2f} s  (median {t['batched'].median:.2f} s; "
                      f"last run's History.wall_s {hb.wall_s[-1]:.2f} s)", w),
            *bench.ratio_rows({"per-client": t["per-client"].best, "batched": t["batched"].best}, "batched", w),
            bench.check_row("max rel. |W_batched - W_per-client|", diff, 1e-4,
                            f"final global weights after {args.rounds} rounds", w),
            bench.row("final test accuracy per-client / batched", f"{ha.final_acc:.4f} / {hb.final_acc:.4f}", w),
            bench.row("participants and bytes up / down equal", "yes" if same else "NO (FAILED)", w),
        ]
    return bench.finish(lines, args.out, ok, width=w)


if __name__ == "__main__":
    sys.exit(main())
