"""Execute several chapters at once: ``python -m fedlib.runner all --jobs 2``.

The chapters are independent notebooks, except that some read a feature cache another writes
(``after`` in ``notebooks/profiles.yml``: ``afl_beyond`` reads the features ``afl_benchmark``
extracts). :func:`plan` orders them: a chapter becomes ready when the chapters it comes after are
done, and among the ready ones the longest (by its last run at this profile; a chapter never run
first) starts first, so the long chapters do not end up last on one worker (longest-processing-time
scheduling). :func:`run_chapters` runs the plan on ``jobs`` worker processes, each executing one
chapter at a time with :func:`fedlib.runner.profiles.run_notebook`; a failed chapter stops new
starts, the running ones finish, and the first error is raised.

Chapters side by side share the cores: each worker gives its chapter its share (the cores divided by
``jobs``) as ``FEDLIB_WORKERS`` (the processes :func:`fedlib.core.parallel.fork_map` forks),
``OPENBLAS_NUM_THREADS`` (NumPy's BLAS, whose threads busy-wait) and ``OMP_NUM_THREADS`` (torch's
intra-op threads and the OpenMP threads of sklearn and numba, in every chapter that does not set its
own), and ``OMP_WAIT_POLICY=PASSIVE`` so that idle OpenMP threads of one chapter do not spin on the
cores the other needs. (Measured: afl_derivation alone took 97 s of CPU on two torch threads and 60 s
on one, for 58 s against 62 s of wall time; the two runs differ in round-off only.)
"""
from __future__ import annotations

import multiprocessing
import os
import platform
import resource
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from fedlib.core.parallel import default_workers
from fedlib.core.processes import stop_on_signals
from fedlib.runner.profiles import run_notebook

_SLOT = 0   # this worker's progress-bar row (set by _init_worker)


def order_key(name: str, last: Mapping[str, float | None]) -> tuple[bool, float]:
    """Sort key of a ready chapter: never-run chapters first, then the longest last run first."""
    seconds = last.get(name)
    return (seconds is not None, -(seconds or 0.0))


def check_after(names: Sequence[str], after: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``after`` restricted to the chapters being run (a chapter outside ``names`` is not waited
    for: its cache is already there or the chapter will compute it itself). Refuses unknown names
    and cycles with a ValueError."""
    known = set(names)
    deps: dict[str, list[str]] = {}
    for chapter, before in after.items():
        if not isinstance(before, (list, tuple)):
            raise ValueError(f"after: {chapter!r} must list chapters, got {before!r}")
        deps[chapter] = [b for b in before if b in known]
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError(f"after: the chapters wait for each other in a cycle: {' -> '.join(path + [n])}")
        state[n] = 1
        for b in deps.get(n, []):
            visit(b, path + [n])
        state[n] = 2

    for n in names:
        visit(n, [])
    return {n: deps.get(n, []) for n in names}


def plan(names: Sequence[str], after: Mapping[str, Sequence[str]], last: Mapping[str, float | None]) -> list[str]:
    """The order in which one worker would start the chapters (dependencies first, longest first)."""
    deps, done, order = check_after(names, after), set(), []
    while len(order) < len(names):
        ready = [n for n in names if n not in done and all(b in done for b in deps[n])]
        nxt = min(ready, key=lambda n: order_key(n, last))
        order.append(nxt)
        done.add(nxt)
    return order


def _init_worker(counter, jobs: int) -> None:
    global _SLOT
    with counter.get_lock():
        _SLOT = counter.value
        counter.value += 1
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # chapters side by side share the cores: each forks at most its share (fedlib.core.parallel), and
    # NumPy's BLAS (whose threads busy-wait), torch and OpenMP get that many threads

    share = str(max(1, default_workers() // jobs))
    for name in ("FEDLIB_WORKERS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(name, share)


def children_cpu() -> float:
    """CPU seconds (user + sys) of this process's finished child processes (the chapters' kernels)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_chapter(name: str, profile: str, overrides: Mapping[str, Any], progress: bool | dict = True,
                  output: Path | None = None) -> tuple[str, float, float]:
    """``run_notebook`` of one chapter: ``(name, wall seconds, CPU seconds of its kernel)``."""
    t0, c0 = time.perf_counter(), children_cpu()
    run_notebook(name, profile, overrides, output=output, progress=progress)
    return name, time.perf_counter() - t0, children_cpu() - c0


def _run_one(name: str, profile: str, overrides: Mapping[str, Any]) -> tuple[str, float, float]:
    with stop_on_signals():   # a stopped run cleans up its scratch folder and kernel (see fedlib.runner.cli.cli)
        return timed_chapter(name, profile, overrides, progress={"position": _SLOT})


def run_chapters(names: Sequence[str], profile: str, jobs: int, after: Mapping[str, Sequence[str]],
                 last: Mapping[str, float | None], overrides: Mapping[str, Any] | None = None,
                 run_one: Callable[[str, str, Mapping[str, Any]], tuple[str, float, float]] = _run_one,
                 log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
                 ) -> dict[str, tuple[float, float]]:
    """Execute ``names`` at ``profile`` on ``jobs`` processes; ``{name: (wall s, CPU s)}`` of each chapter.

    ``last``: each chapter's last duration at this profile (None: never run), for the order and the
    time-left estimate. ``run_one`` is the worker's function (replaceable in tests).
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    deps = check_after(names, after)
    overrides = dict(overrides or {})
    ctx = multiprocessing.get_context("spawn")   # a fresh interpreter per worker: no forked torch/BLAS state
    start, times, running = time.perf_counter(), {}, {}
    pending = list(names)
    failure: BaseException | None = None
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker,
                             initargs=(ctx.Value("i", 0), jobs)) as pool:
        while pending or running:
            ready = sorted((n for n in pending if all(b in times for b in deps[n])),
                           key=lambda n: order_key(n, last))
            while failure is None and ready and len(running) < jobs:
                name = ready.pop(0)
                pending.remove(name)
                log(f"[{profile}] start {name} ({len(times) + len(running) + 1}/{len(names)})")
                running[pool.submit(run_one, name, profile, overrides)] = name
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                name = running.pop(fut)
                try:
                    _, seconds, cpu = fut.result()
                except BaseException as err:   # noqa: BLE001 - let the running chapters finish, then raise
                    failure = failure or err
                    log(f"[{profile}] {name} FAILED: {type(err).__name__}: {err}")
                    continue
                times[name] = (seconds, cpu)
                left = [n for n in pending + list(running.values())]
                log(f"[{profile}] {name}: {seconds:.0f} s (done {len(times)}/{len(names)}, elapsed "
                    f"{minutes(time.perf_counter() - start)}; {time_left(left, last, jobs)})")
    if failure is not None:
        raise failure
    return times


def reference_kernel_ms(repeats: int = 2000) -> float:
    """Milliseconds of one float32 (100, 784) @ (784, 200) product (FedDL's per-client product) on one
    BLAS thread, the median of ``repeats``: the speed of the machine at that moment. A shared virtual
    machine runs faster or slower from hour to hour, so a run's record carries it, and two records
    compare by it."""
    rng = np.random.default_rng(0)
    a, b = rng.random((100, 784), dtype=np.float32), rng.random((784, 200), dtype=np.float32)
    times = []
    with threadpool_limits(1, user_api="blas"):
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def write_record(path: Path, profile: str, jobs: int, times: Mapping[str, tuple[float, float]], wall: float,
                 load_before: float, kernel_ms: tuple[float, float] | None = None) -> str:
    """The record of a run of the whole book (``book/benchmarks/book_run_PROFILE.txt``): each chapter's
    wall and CPU seconds, their sums, the run's wall time on ``jobs`` workers and, when given, the
    machine's speed before and after the run (:func:`reference_kernel_ms`). Returns the text."""
    width = 24
    lines = [f"machine: {platform.machine()}, {os.cpu_count()} CPUs; load average before the run "
             f"{load_before:.2f}, after {os.getloadavg()[0]:.2f}",
             *([f"machine speed (fedlib.runner.schedule.reference_kernel_ms, lower is faster): {kernel_ms[0]:.3f} ms "
                f"before the run, {kernel_ms[1]:.3f} ms after"] if kernel_ms else []),
             f"profile {profile}, {len(times)} chapters, {jobs} at a time (python -m fedlib.runner all --jobs {jobs})",
             f"  {'chapter':<{width}}{'wall s':>9}{'CPU s':>9}"]
    for name, (sec, cpu) in sorted(times.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {name:<{width}}{sec:9.0f}{cpu:9.0f}")
    lines += [f"  {'sum over chapters':<{width}}{sum(t[0] for t in times.values()):9.0f}"
              f"{sum(t[1] for t in times.values()):9.0f}",
              f"  {'whole run, wall':<{width}}{wall:9.0f}   ({minutes(wall)})"]
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def minutes(seconds: float) -> str:
    """"42 s" below 90 s, else "3.5 min"."""
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def time_left(remaining: Sequence[str], last: Mapping[str, float | None], jobs: int = 1) -> str:
    """About how long the chapters of ``remaining`` take on ``jobs`` workers, from their last runs at
    this profile (``last``; None: never run): the larger of the longest one and their sum / jobs."""
    if not remaining:
        return "nothing left"
    known = [last[n] for n in remaining if last.get(n) is not None]
    if not known:
        return "no earlier run at this profile to estimate the time left from"
    unknown = len(remaining) - len(known)
    note = f", plus {unknown} chapter(s) never run at this profile" if unknown else ""
    return f"about {minutes(max(max(known), sum(known) / jobs))} left by the last runs{note}"
