"""Re-Fed against random replay at a converged budget: the benchmark chapter's headline (the paper's
Table 1) with enough rounds per task for every method's last task to converge and as many paired
seeds as a 2-core CPU affords (the chapter states how many would detect the paper's effect).

The chapter's scenarios, model and training settings at a profile (default ``quick``), with the
rounds per task and the seeds of :data:`DEFAULTS`, for Re-Fed and the two random-replay baselines in
both streams. Stores, per scenario and method: A_T per seed and the last task's test-accuracy curve
(%) per seed.
"""
from __future__ import annotations

from typing import Any

from fedlib.refed.studies import benchmark_runs, benchmark_scenarios, last_task_curves

CHAPTER = "refed_benchmark"
METHODS = ["refed", "fedavg_replay", "fedprox_replay"]
# 60 rounds per task: every method's last-task curve moves < 0.5 pp over its last 20 % (30 did not);
# 12 paired seeds: what the 2-core CPU affords at that budget (34 min)
DEFAULTS = {"rounds": 60, "rounds_domain": 60, "seeds": list(range(12))}


def run(p: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Both streams' headline comparison for the chapter parameters ``p``; JSON-ready results."""
    scenarios = benchmark_scenarios(p)
    runs = benchmark_runs(p, scenarios)
    runs.prefetch([dict(kind=k, method=m, seed=s, track=True) for k in scenarios for s in p["seeds"] for m in METHODS],
                  p["workers"], desc="recorded runs", progress=progress)
    out: dict[str, Any] = {"A_T": {}, "curves": {}}
    for k in scenarios:
        out["A_T"][k] = {m: [float(runs(k, m, s, track=True)["row"]["A_T"]) for s in p["seeds"]] for m in METHODS}
        out["curves"][k] = last_task_curves(runs, k, METHODS, p["seeds"])
    return out
