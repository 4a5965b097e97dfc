"""Independent runs of a chapter in forked worker processes (CPU), with one progress bar.

A chapter's runs that share nothing but read-only inputs (one seed's runs, one (dataset, seed) pair)
go to ``workers`` processes forked from the kernel: a worker inherits the inputs without copying or
pickling them (fork is copy-on-write); only each job's result comes back (pickled). Each job must
seed everything it draws itself, so the results equal those of the sequential loop (the tests
check this for every caller). Workers run torch, BLAS and OpenMP on one thread each: OpenMP
runtimes are not fork-safe once they have started a thread team, and two processes on two cores
need no more.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fedlib.core.validate import check_int

__all__ = ["default_workers", "resolve_workers", "fork_map"]

_STATE: dict[str, Any] = {}   # what a forked worker reads (inherited, never pickled)


def default_workers(limit: int | None = None) -> int:
    """Worker processes of a chapter: ``$FEDLIB_WORKERS`` when set (the book runner sets each chapter's
    share of the cores when chapters run side by side), else the CPU cores this process may use
    (``os.sched_getaffinity``); at most ``limit``."""
    env = os.environ.get("FEDLIB_WORKERS")
    if env is not None:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"FEDLIB_WORKERS must be an integer >= 1, got {env!r}")
        n = int(env)
    else:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, limit or n))


def resolve_workers(workers: int | None, device="cpu") -> int:
    """A chapter's ``workers`` parameter as a process count: None -> :func:`default_workers`; always 1
    on an accelerator (``device`` not ``"cpu"`` / ``"auto"``), whose context does not survive fork.
    Anything but None or an integer >= 1 -> ValueError naming ``workers``."""
    if workers is not None:
        workers = check_int("workers", workers, 1)
    if str(device).split(":")[0] not in ("cpu", "auto"):
        return 1
    return default_workers() if workers is None else workers


def _init_worker() -> None:
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)


def _call(index: int):
    return index, _STATE["fn"](_STATE["jobs"][index])


def fork_map(fn: Callable[[Any], Any], jobs: Iterable, workers: int | None = 1, *,
             cost: Callable[[Any], Any] | None = None, desc: str | None = None, progress: bool = True) -> list:
    """``[fn(job) for job in jobs]``, in ``workers`` forked processes when ``workers`` > 1 and there
    are two or more jobs (else in this process); ``workers=None``: :func:`default_workers`. ``fn`` may
    be a closure (it is inherited, not pickled); its results must pickle. ``cost(job)`` (larger =
    longer) hands the jobs out longest first, so the last to start is a short one; the results come
    in job order either way. The bar (``desc``) counts finished jobs. A worker's exception is raised
    here. On a platform without fork, runs in this process."""
    import multiprocessing

    from tqdm.auto import tqdm

    jobs: Sequence = list(jobs)
    workers = resolve_workers(workers)
    order = list(range(len(jobs)))
    if cost is not None:
        order.sort(key=lambda i: cost(jobs[i]), reverse=True)   # stable: equal costs keep their order
    results: list = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress)
    try:
        if workers == 1 or len(jobs) < 2 or "fork" not in multiprocessing.get_all_start_methods():
            for i in order:
                results[i] = fn(jobs[i])
                bar.update()
            return results
        if _STATE:
            raise RuntimeError("fork_map cannot be nested: a worker must run its jobs in its own process")
        _STATE.update(fn=fn, jobs=jobs)
        try:
            with multiprocessing.get_context("fork").Pool(min(workers, len(jobs)), initializer=_init_worker) as pool:
                for i, result in pool.imap_unordered(_call, order):
                    results[i] = result
                    bar.update()
        finally:
            _STATE.clear()
        return results
    finally:
        bar.close()
