"""fedlib on Flower: bytes on the wire per protocol, and scale of the simulation engine.

Prints, in one run on this machine:

1. Bytes: every protocol of :mod:`fedlib.flower.tasks` at its default configuration (optdigits,
   3 clients) on Flower's simulation engine: fedlib's own message accounting (payload bytes up /
   down, :class:`fedlib.core.messages.Cost`) beside what Flower carried (the messages' ArrayRecords,
   ``ArrayRecord.count_bytes``; and the ConfigRecords: payload trees, ids, the client programs sent
   once per node), and whether the result equals the in-process run.
2. Scale: AFL (one round of statistics) and FedAvg (``--rounds`` rounds) on optdigits, IID
   partition, with 10 / 100 / 1000 (``--clients``) virtual clients: wall time of the whole run
   (data loading included; for the engine also Ray's start-up and shut-down) and peak resident
   memory of the process tree (this process and its children, e.g. Ray's workers; RSS summed, so
   shared pages count more than once) under the simulation engine and the in-process simulator,
   and the time ratio.

    python -m fedlib.bench.flower [--clients 10 100 1000] [--rounds 3] [--cpus N] [--out FILE]
"""
from __future__ import annotations

import sys
import threading
import time

import psutil

from fedlib.evaluation import benchmark as bench
from fedlib.flower.engines import run_simulation_engine
from fedlib.flower.tasks import OPTIONS, Task, parse_options


class PeakMemory:
    """Peak summed RSS (GiB) of this process and all its descendants, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def gib(self) -> float:
        return self.peak / 2**30


def _run(config, engine: str, cpus: int | None):
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        if engine == "flower":
            outcome, report = run_simulation_engine(config, num_cpus=cpus)
        else:
            outcome, report = Task(config).run(), None
        seconds = time.perf_counter() - t0
    return outcome, report, seconds, mem.gib


def bytes_table(cpus: int | None, w: int) -> tuple[list[str], bool]:
    lines = ["Bytes per run (simulation engine, defaults of fedlib.flower.tasks.OPTIONS: optdigits, 3 clients):",
             f"  {'protocol':<10}{'fedlib up':>12}{'Flower arrays up':>18}{'fedlib down':>13}"
             f"{'Flower arrays down':>20}{'Flower config up/down':>24}  max rel. diff to in-process"]
    ok = True
    for name in OPTIONS:
        config = parse_options(name)
        reference = Task(config).run()
        outcome, report, _, _ = _run(config, "flower", cpus)
        b = report["flower"]["flower_bytes"]
        diff = outcome.difference(reference.arrays)
        ok &= diff < 1e-10
        lines.append(f"  {name:<10}{report['fedlib_bytes_up']:>12,}{b['array_up']:>18,}{report['fedlib_bytes_down']:>13,}"
                     f"{b['array_down']:>20,}{b['config_up']:>12,}/{b['config_down']:<11,}  {diff:.1e}")
    return lines, ok


def scale_table(clients: list[int], rounds: int, cpus: int | None, w: int) -> tuple[list[str], bool]:
    lines = [f"Scale on optdigits (IID): AFL one round; FedAvg {rounds} rounds, 1 local epoch:",
             f"  {'run':<22}{'simulation engine':>20}{'in-process':>16}{'time ratio':>12}"
             f"{'peak memory (GiB) engine / in-process':>40}"]
    ok = True
    for name, extra in [("afl", ""), ("gradient", f"method=fedavg rounds={rounds} local-epochs=1")]:
        for k in clients:
            config = parse_options(name, f"partition=iid num-clients={k} timeout=600 {extra}")
            local, _, t_local, m_local = _run(config, "inprocess", cpus)
            flower, _, t_flower, m_flower = _run(config, "flower", cpus)
            ok &= flower.difference(local.arrays) < 1e-10
            label = f"{'AFL' if name == 'afl' else 'FedAvg'}, K={k}"
            lines.append(f"  {label:<22}{t_flower:>18.1f} s{t_local:>14.2f} s{t_flower / t_local:>11.0f}x"
                         f"{m_flower:>26.2f} / {m_local:.2f}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = bench.parser(__doc__, "flower", repeats=None, seed=None)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=None, help="CPUs Ray may use (default: all)")
    parser.add_argument("--skip-bytes", action="store_true")
    args = parser.parse_args(argv)
    bench.require_positive(parser, args, "rounds")
    if min(args.clients) < 1:
        parser.error("--clients must all be >= 1")
    import flwr
    import ray

    w = 36
    lines = [bench.machine(flwr=flwr.__version__, ray=ray.__version__)]
    ok = True
    if not args.skip_bytes:
        more, ok = bytes_table(args.cpus, w)
        lines += more
    more, scale_ok = scale_table(args.clients, args.rounds, args.cpus, w)
    lines += more
    lines.append(bench.row("every Flower result = in-process result (max rel. diff < 1e-10)",
                           "passed" if ok and scale_ok else "FAILED", 66))
    return bench.finish(lines, args.out, ok and scale_ok, width=w)


if __name__ == "__main__":
    sys.exit(main())
