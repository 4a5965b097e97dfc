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

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import torch
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from fedlib.core.validate import check_int

__all__ = ["default_workers", "resolve_workers", "fork_map", "RunGrid"]

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
    # the pool ends its workers with SIGTERM: a stop handler inherited from the parent (a runner's
    # stop_on_signals) would keep a worker alive, blocked on the task queue, and the pool's exit would
    # wait for it forever
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
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


class RunGrid:
    """A chapter's grid of runs, cached by key: :meth:`fill` makes the runs not held yet in forked
    worker processes (:func:`fork_map`, one progress bar) and returns the result of every request.
    The four benchmarks' sweeps all go through it.

    ``run(request)`` makes one run; it must seed everything it draws from its request, so a worker
    gives the result of the sequential loop. ``key(request)`` is the cache key (default: the request);
    ``held(request)`` whether a held result serves the request (default: its key is held);
    ``repeats(earlier, request)`` whether a request of the same key asked earlier in one fill serves it
    (default: yes; else it runs too, after the earlier one, in the same group).
    ``run_group(requests)`` makes the runs of one group in one process, in request order, and returns
    (their results, what else the group made) (default: ``[run(r) for r in requests]``, None);
    ``absorb(extra)`` takes that extra, group by group in job order. ``results`` {key: result}, in the
    order first asked (a dict the caller may own); ``hits`` counts the requests served without a run
    (held, or asked twice); ``report`` {"runs", "groups", "processes", "seconds"} of the last fill.
    """

    def __init__(self, run: Callable[[Any], Any] | None = None, *, key: Callable[[Any], Hashable] | None = None,
                 held: Callable[[Any], bool] | None = None, run_group: Callable[[list], tuple] | None = None,
                 repeats: Callable[[Any, Any], bool] | None = None, absorb: Callable[[Any], None] | None = None,
                 results: dict | None = None):
        if run is None and run_group is None:
            raise ValueError("RunGrid needs run or run_group")
        self.results = {} if results is None else results
        self.key = key or (lambda request: request)
        self.held = held or (lambda request: self.key(request) in self.results)
        self.run_group = run_group or (lambda requests: ([run(r) for r in requests], None))
        self.repeats = repeats or (lambda earlier, request: True)
        self.absorb = absorb or (lambda extra: None)
        self.hits = 0
        self.report: dict = {}

    def fill(self, requests: Iterable, workers: int | None = 1, *, group: Callable[[Any], Hashable] | None = None,
             cost: Callable[[list], Any] | None = None, desc: str | None = None, progress: bool = True) -> list:
        """The results of ``requests``, in order, after making the runs not held: those of one
        ``group(request)`` (default: each its own) run in one job, in request order; the jobs go to
        ``workers`` forked processes (None: the cores), ``cost(requests of a job)`` largest first. The
        new results enter ``results`` in request order, as the sequential calls would add them."""
        requests = list(requests)
        workers = resolve_workers(workers)
        pending, groups = {}, {}   # key -> (its group, the last request of it); group -> requests
        for request in requests:
            key = self.key(request)
            if (key in pending and self.repeats(pending[key][1], request)) or (key not in pending and self.held(request)):
                self.hits += 1
                continue
            gid = pending[key][0] if key in pending else group(request) if group else ("one", key)
            pending[key] = gid, request   # a key stays in one group
            groups.setdefault(gid, []).append(request)
        jobs = list(groups.values())
        start = time.perf_counter()
        made = fork_map(self.run_group, jobs, min(workers, max(1, len(jobs))), cost=cost, desc=desc,
                        progress=progress and bool(jobs))
        fetched = {}   # a key asked twice in a group: its last run, as the sequential calls leave it
        for job, (results, extra) in zip(jobs, made):
            fetched.update(zip(map(self.key, job), results, strict=True))
            self.absorb(extra)
        for key in pending:
            self.results[key] = fetched[key]
        self.report = {"runs": sum(map(len, jobs)), "groups": len(jobs),
                       "processes": min(workers, len(jobs)) if len(jobs) > 1 else len(jobs),
                       "seconds": time.perf_counter() - start}
        return [self.results[self.key(r)] for r in requests]
