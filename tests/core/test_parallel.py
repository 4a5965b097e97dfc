"""Tests for fedlib.core.parallel: fork_map gives the results of the sequential loop, in job order;
RunGrid caches runs by key, groups them, and forks only the runs not held."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fedlib.core.parallel import RunGrid, default_workers, fork_map


def test_fork_map_equals_the_loop_in_job_order_with_a_closure():
    data = np.random.default_rng(0).standard_normal((50, 8))   # inherited by the workers, never pickled

    def job(seed):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(8, 3, generator=g, dtype=torch.float64)
        return seed, os.getpid(), (torch.from_numpy(data) @ w).numpy()

    seeds = [3, 0, 2, 1, 4]
    loop = fork_map(job, seeds, 1, progress=False)
    forked = fork_map(job, seeds, 2, progress=False)
    assert [s for s, _, _ in forked] == seeds
    assert {pid for _, pid, _ in loop} == {os.getpid()}
    assert os.getpid() not in {pid for _, pid, _ in forked}          # really ran in other processes
    for (_, _, a), (_, _, b) in zip(loop, forked):
        np.testing.assert_array_equal(a, b)


def test_workers_run_on_one_thread_and_errors_reach_the_caller():
    assert fork_map(lambda _: torch.get_num_threads(), range(3), 2, progress=False) == [1, 1, 1]

    def fails(i):
        if i == 2:
            raise ValueError("job 2 failed")
        return i

    with pytest.raises(ValueError, match="job 2 failed"):
        fork_map(fails, range(4), 2, progress=False)


def test_workers_die_on_the_pools_sigterm_whatever_handler_the_parent_holds():
    """Pool.terminate ends the workers with SIGTERM; a worker that kept the parent's stop handler
    (a runner's stop_on_signals, installed before the chapter forks) hung the pool's exit."""
    import signal

    from fedlib.core.processes import stop_on_signals

    with stop_on_signals():
        handlers = fork_map(lambda _: (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)),
                            range(4), 2, progress=False)
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)   # the parent keeps its handler
    assert handlers == [(signal.SIG_DFL, signal.SIG_DFL)] * 4


def test_nested_forks_are_refused_and_bad_workers_named():
    def inner(i):
        return fork_map(lambda j: j, range(2), 2, progress=False)

    with pytest.raises(RuntimeError, match="nested"):
        fork_map(inner, range(2), 2, progress=False)
    assert fork_map(lambda j: fork_map(lambda k: k + j, range(2), 1, progress=False), range(2), 2,
                    progress=False) == [[0, 1], [1, 2]]
    with pytest.raises(ValueError, match="workers"):
        fork_map(lambda j: j, range(2), 0)
    assert fork_map(lambda j: j, [], 2, progress=False) == []
    assert 1 <= default_workers() and default_workers(1) == 1


def test_default_workers_follows_fedlib_workers(monkeypatch):
    monkeypatch.setenv("FEDLIB_WORKERS", "3")
    assert default_workers() == 3 and default_workers(2) == 2
    for bad in ("0", "two"):
        monkeypatch.setenv("FEDLIB_WORKERS", bad)
        with pytest.raises(ValueError, match="FEDLIB_WORKERS"):
            default_workers()


def test_costly_jobs_start_first_and_results_keep_the_job_order(monkeypatch):
    started = []
    assert fork_map(lambda j: started.append(j) or j * 10, [1, 5, 2, 4], 1, cost=lambda j: j,
                    progress=False) == [10, 50, 20, 40]
    assert started == [5, 4, 2, 1]
    assert fork_map(lambda j: j * 10, [1, 5, 2, 4], 2, cost=lambda j: j, progress=False) == [10, 50, 20, 40]
    monkeypatch.setenv("FEDLIB_WORKERS", "2")
    assert fork_map(lambda j: os.getpid(), range(4), None, progress=False).count(os.getpid()) == 0


def test_resolve_workers_takes_the_cores_on_a_cpu_and_one_process_on_a_gpu(monkeypatch):
    from fedlib.core.parallel import resolve_workers

    monkeypatch.setenv("FEDLIB_WORKERS", "2")
    assert resolve_workers(None) == 2 and resolve_workers(3, "cpu") == 3 and resolve_workers(None, "auto") == 2
    assert resolve_workers(None, "cuda") == resolve_workers(4, torch.device("cuda", 0)) == 1
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="workers"):
            resolve_workers(bad)


def _seeded_run(request):
    seed, scale = request
    return scale * torch.randn(4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_run_grid_makes_each_key_once_in_forked_groups_and_returns_every_request():
    requests = [(s, c) for s in range(4) for c in (1.0, 2.0)]
    seq, forked = RunGrid(_seeded_run), RunGrid(_seeded_run)
    a = seq.fill(requests, 1, progress=False)
    b = forked.fill(requests + requests[:3], 2, group=lambda r: r[0], cost=lambda g: g[0][0], progress=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(b) == len(requests) + 3
    assert torch.equal(a[3], _seeded_run(requests[3]))
    assert forked.report == {"runs": 8, "groups": 4, "processes": 2, "seconds": forked.report["seconds"]}
    assert forked.hits == 3 and list(forked.results) == requests          # the order first asked
    again = forked.fill(requests[::-1], 2, progress=False)                 # all held: nothing runs
    assert forked.report["runs"] == 0 and forked.hits == 3 + 8 and again[0] is forked.results[requests[-1]]


def test_run_grid_hooks_keep_the_sequential_semantics():
    """A request an earlier one does not serve runs after it (its last run is kept); run_group's extra
    reaches absorb group by group in job order; held can refuse a stored result."""
    extras = []

    def run_group(reqs):
        return [(r["k"], r["track"], os.getpid()) for r in reqs], [r["k"] for r in reqs]

    grid = RunGrid(key=lambda r: r["k"], run_group=run_group, absorb=extras.append,
                   repeats=lambda earlier, r: earlier["track"] or not r["track"],
                   held=lambda r: r["k"] in grid.results and (grid.results[r["k"]][1] or not r["track"]))
    reqs = [{"k": 1, "track": False}, {"k": 2, "track": False}, {"k": 1, "track": True}, {"k": 1, "track": False}]
    out = grid.fill(reqs, 2, group=lambda r: r["k"], progress=False)
    assert [o[:2] for o in out] == [(1, True), (2, False), (1, True), (1, True)]
    assert grid.report["runs"] == 3 and grid.hits == 1 and extras == [[1, 1], [2]] and list(grid.results) == [1, 2]
    grid.fill([{"k": 2, "track": True}], 1, progress=False)                # held untracked: runs again, tracked
    assert grid.results[2][1] and grid.results[2][2] == os.getpid()
    with pytest.raises(ValueError, match="run or run_group"):
        RunGrid()
    with pytest.raises(ValueError, match="workers"):
        RunGrid(_seeded_run).fill([(0, 1.0)], 0)
