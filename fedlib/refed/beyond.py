"""Re-Fed, beyond the paper: what the PIM adds, budget shares, label noise.

Every cache rule here is a replay policy of :class:`fedlib.federated.learner.GradientLearner`, run by
:func:`fedlib.refed.studies.run_scenario` on the benchmark's data, model and seeds under the same
memory budget (:data:`RULES` maps a rule to a method of :data:`fedlib.refed.algorithm.LEARNERS` and its
overrides):

* controls for the PIM: ``grand`` (the exact per-sample gradient norm at the global model w: Re-Fed's
  score with no PIM training, every G^p taken at w, the lam -> 0 limit of Eq. 3), ``refed_local``
  (lam -> 1: q(lam) -> 0, the PIM trains on the pool without the proximal pull), ``random`` (uniform
  random scores = a uniformly random cache), ``el2n`` (||softmax - onehot|| at w), ``herding``
  (iCaRL's mean-matching on w's features, equal class shares), ``reservoir`` (class-balancing
  reservoir sampling);
* budget shares with Re-Fed's top-k inside each: ``refed_class`` (equal class shares),
  ``refed_task`` (equal task shares), ``refed_task_class`` (equal task shares, each split equally
  over the task's classes);
* label noise: :func:`flip_labels` flips an exact fraction of the old tasks' training labels within
  each task; :class:`CacheNoiseAudit` counts the mislabeled samples in every client's pool and
  cache at every task boundary.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from fedlib.core.parallel import RunGrid
from fedlib.core.seeds import rng
from fedlib.core.validate import check_choice, check_real
from fedlib.evaluation.stats import mean_std, paired_difference
from fedlib.refed.studies import benchmark_scenarios, run_scenario, run_settings

__all__ = ["RULES", "PIM_RULES", "beyond_setup", "rule_results", "flip_labels", "CacheNoiseAudit", "run_rules", "rule_table", "noise_table",
           "noise_accuracy_table", "paired_rows", "summary_lines"]

#: rule -> (method of fedlib.refed.algorithm.LEARNERS, overrides of run_scenario); "lam_local" is filled in
RULES: dict[str, tuple[str, dict[str, Any]]] = {
    "refed": ("refed", {}),
    "refed_local": ("refed", {"lam": "lam_local"}),
    "grand": ("grand", {}),
    "random": ("fedavg_replay", {}),
    "el2n": ("el2n", {}),
    "herding": ("herding", {}),
    "reservoir": ("reservoir", {}),
    "refed_class": ("refed_balanced", {}),
    "refed_task": ("refed_task", {}),
    "refed_task_class": ("refed_task_class", {}),
}
#: the rules that train a PIM (the expensive ones)
PIM_RULES = ("refed", "refed_local", "refed_class", "refed_task", "refed_task_class")


def beyond_setup(p: dict[str, Any]) -> tuple[dict, dict]:
    """The chapter's class-incremental scenario (the benchmark's, :func:`fedlib.refed.studies.benchmark_scenarios`)
    and the :func:`run_rules` ``settings`` (:func:`fedlib.refed.studies.run_settings`) from its parameters ``p``."""
    scenario = benchmark_scenarios({**p, "domain": False})["class"]
    return scenario, run_settings(p, scenario)


def rule_results(rows: pd.DataFrame, rules: Sequence[str], seeds: Sequence[int]) -> dict[str, dict]:
    """From :func:`run_rules`' rows (run with ``track``): per rule, A_T per seed and the last task's
    test-accuracy curve (%) per seed, in the order of ``seeds``; JSON-ready."""
    by = {r: rows[rows.rule == r].set_index("seed").loc[list(seeds)] for r in rules}
    return {"A_T": {r: [float(a) for a in by[r]["A_T"]] for r in rules},
            "curves": {r: [list(map(float, c)) for c in by[r]["last_task_curve"]] for r in rules}}


def flip_labels(y, stream, fraction: float, seed: int,
                tasks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric label noise inside each task: for every task t of ``tasks`` (default: all but the
    last, the tasks that become old), exactly round(fraction * n_t) of its n_t training samples
    (``stream.tasks[t].train_idx``, drawn without replacement from ``rng(seed, "label-noise", t)``)
    get a label drawn uniformly from the task's *other* classes, so every label stays in its task's
    class block. ``y`` (N,) original labels. Returns (noisy labels (N,), flipped mask (N,) bool)."""
    try:
        fraction = check_real("fraction", fraction, low=0.0, high=1.0, strict=False)
    except ValueError:
        raise ValueError(f"fraction must lie in [0, 1) (share of labels flipped), got {fraction!r}") from None
    if fraction >= 1.0:
        raise ValueError(f"fraction must lie in [0, 1) (share of labels flipped), got {fraction!r}")
    y = np.asarray(y, dtype=np.int64)
    tasks = list(range(stream.num_tasks - 1)) if tasks is None else [int(t) for t in tasks]
    bad = [t for t in tasks if not 0 <= t < stream.num_tasks]
    if bad:
        raise ValueError(f"tasks must be task indices in [0, {stream.num_tasks}), got {bad}")
    noisy, flipped = y.copy(), np.zeros(len(y), dtype=bool)
    for t in tasks:
        task = stream.tasks[t]
        if task.num_classes < 2 and fraction > 0:
            raise ValueError(f"task {t} has one class: no other label to flip to (fraction must be 0)")
        idx = task.train_idx
        n_flip = int(round(fraction * len(idx)))
        g = rng(seed, "label-noise", t)
        chosen = g.choice(idx, size=n_flip, replace=False)
        for i in chosen:
            others = task.classes[task.classes != y[i]]
            noisy[i] = others[g.integers(len(others))]
        flipped[chosen] = True
    return noisy, flipped


class CacheNoiseAudit:
    """An ``on_stage_end`` callback counting mislabeled samples in the clients' pools and caches.

    Built from the training inputs ``x_train`` (N, ...) (the tensors the learner receives), their
    noisy labels (N,) and the ``flipped`` mask (N,): a sample is recognised by its exact bytes and
    label (``class_order``: the stream's, mapping the learner's re-indexed labels back). At the end
    of stage t >= 1, for every client k: the pool of boundary t (client k's local set at the end of
    stage t-1) and the cache (the local set's samples of tasks < t). Rows go to
    ``learner.noise_audit``: boundary, client, pool, pool_noisy, cache, cache_noisy.
    """

    def __init__(self, x_train: Tensor, y_noisy, flipped, class_order=None):
        x = torch.as_tensor(x_train).cpu().contiguous()
        y_noisy, flipped = np.asarray(y_noisy), np.asarray(flipped, dtype=bool)
        if not len(x) == len(y_noisy) == len(flipped):
            raise ValueError(f"x_train, y_noisy and flipped must have one entry per sample, got "
                             f"{len(x)}, {len(y_noisy)}, {len(flipped)}")
        self.class_order = None if class_order is None else np.asarray(class_order)
        self.table = {(row.numpy().tobytes(), int(lab)): bool(f)
                      for row, lab, f in zip(x, y_noisy, flipped)}

    def flags(self, x: Tensor, y: Tensor) -> np.ndarray:
        """(n,) bool: is each (x_i, y_i) (y re-indexed by ``class_order``, or original labels when it
        is None) a flipped sample."""
        y = y.cpu().numpy()
        if self.class_order is not None:
            y = self.class_order[y]
        out = np.zeros(len(y), dtype=bool)
        for i, (row, lab) in enumerate(zip(x.cpu().contiguous(), y)):
            key = (row.numpy().tobytes(), int(lab))
            if key not in self.table:
                raise KeyError(f"sample {i} with label {lab} is not a training sample of this audit")
            out[i] = self.table[key]
        return out

    def __call__(self, t: int, learner) -> None:
        rows = learner.__dict__.setdefault("noise_audit", [])
        current = [(self.flags(x, y), task.numpy()) for x, y, task in learner.local_sets]
        previous = learner.__dict__.get("_noise_previous")
        if t > 0 and previous is not None:
            for k, ((flags, task), (pool_flags, _)) in enumerate(zip(current, previous)):
                cache = flags[task < t]
                rows.append({"boundary": t, "client": k, "pool": len(pool_flags), "pool_noisy": int(pool_flags.sum()),
                             "cache": len(cache), "cache_noisy": int(cache.sum())})
        learner._noise_previous = current


def _run_one(job: tuple[int, str], *, scenario: dict, settings: dict, noise: float, lam_local: float,
             track: bool = False) -> dict:
    """One (seed, rule) run of :func:`run_rules`; returns its row."""
    seed, r = job
    sc, audit = scenario, None
    if noise > 0:
        stream = scenario["stream"](seed) if callable(scenario["stream"]) else scenario["stream"]
        y_noisy, flipped = flip_labels(scenario["y_train"], stream, noise, seed)
        sc = {**scenario, "y_train": y_noisy, "stream": stream}
        audit = CacheNoiseAudit(scenario["x_train"], y_noisy, flipped, stream.class_order)
    method, over = RULES[r]
    over = {k: (lam_local if v == "lam_local" else v) for k, v in over.items()}
    kw = dict(settings)
    if audit is not None:
        hp = {m: dict(v) for m, v in (kw.get("method_hparams") or {}).items()}
        hp.setdefault(method, {})["on_stage_end"] = [audit]
        kw["method_hparams"] = hp
    if "num_threads" in kw:
        torch.set_num_threads(kw["num_threads"])
    out = run_scenario(sc, "class", method, seed, **over, **kw, track=track)
    row = {"rule": r, "seed": seed, "noise": noise, **{m: out["row"][m] for m in ("A_T", "A_avg", "F_T", "wall_s")}}
    if track:   # the last task's test accuracy (%) after every round: what the convergence rule reads
        row["last_task_curve"] = [100 * a for a in out["learner"].histories[-1].test_acc]
    if audit is not None:
        log = pd.DataFrame(out["learner"].noise_audit)
        sums = log[["pool", "pool_noisy", "cache", "cache_noisy"]].sum()
        row.update({k: int(v) for k, v in sums.items()}, pool_rate=100 * sums.pool_noisy / sums.pool,
                   cache_rate=100 * sums.cache_noisy / max(1, sums.cache))
    return row


def run_rules(scenario: dict, rules: Sequence[str], seeds: Sequence[int], *, settings: dict, lam_local: float,
              noise: float = 0.0, workers: int | None = 1, progress: bool = True, track: bool = False) -> pd.DataFrame:
    """Run every rule of ``rules`` (:data:`RULES`) for every seed on ``scenario`` (a scenario dict of
    :func:`fedlib.refed.studies.make_scenario`), class-incremental, with :func:`fedlib.refed.studies.run_scenario`'s
    ``settings`` (model_fn, num_clients, ... as the benchmark's ScenarioRuns). ``noise`` > 0 flips that
    fraction of the old tasks' labels of each seed's stream (:func:`flip_labels`, seed = the run's
    seed) and audits the caches (:class:`CacheNoiseAudit`). ``workers`` > 1 runs the (seed, rule)
    jobs in that many forked processes (None: the cores, :func:`fedlib.core.parallel.default_workers`;
    each run is seeded on its own, so the rows are the same).
    Returns one row per (rule, seed), ordered by seed then rule: rule, seed, noise, A_T, A_avg, F_T
    (%), wall_s and, with noise, pool / cache counts summed over clients and boundaries (pool,
    pool_noisy, cache, cache_noisy) and the rates pool_rate, cache_rate (%); with ``track`` (the global
    model evaluated after every round) the last task's curve ``last_task_curve`` (%, one per round)."""
    for r in rules:
        check_choice("rule", r, RULES)
    noise = check_real("noise", noise, low=0.0, high=1.0, strict=False)
    jobs = [(seed, r) for seed in seeds for r in rules]
    grid = RunGrid(partial(_run_one, scenario=scenario, settings=settings, noise=noise, lam_local=lam_local,
                           track=track))
    rows = grid.fill(jobs, workers, desc=f"rules (noise {noise:g})", progress=progress)
    return pd.DataFrame(rows)


def paired_rows(rows: pd.DataFrame, metric: str, reference: str, seeds: Sequence[int], rules: Sequence[str]) -> dict:
    """{rule: PairedDifference of ``metric`` rule - ``reference`` over ``seeds``} from :func:`run_rules`' rows."""
    ref = rows[rows.rule == reference].set_index("seed").loc[list(seeds), metric].to_numpy()
    return {r: paired_difference(rows[rows.rule == r].set_index("seed").loc[list(seeds), metric].to_numpy(), ref)
            for r in rules if r != reference}


def rule_table(rows: pd.DataFrame, seeds: Sequence[int], reference: str = "refed",
               metrics: Sequence[str] = ("A_T", "A_avg")) -> pd.DataFrame:
    """Per rule: mean ± sample std over seeds of ``metrics`` and the paired difference rule - ``reference``
    of each (mean [95% CI]) with whether the CI excludes 0."""
    rules = list(dict.fromkeys(rows.rule))
    diffs = {m: paired_rows(rows, m, reference, seeds, rules) for m in metrics}
    out = []
    for r in rules:
        d = rows[rows.rule == r]
        row = {"rule": r, **{f"{m} (%)": mean_std(d[m], 2) for m in metrics}}
        for m in metrics:
            row[f"{m}: rule - {reference} (points)"] = "—" if r == reference else diffs[m][r].format(2)
            row[f"{m} resolved"] = "—" if r == reference else diffs[m][r].excludes_zero
        out.append(row)
    return pd.DataFrame(out).set_index("rule")


def noise_table(noisy: pd.DataFrame, seeds: Sequence[int]) -> pd.DataFrame:
    """Per rule, from :func:`run_rules`' rows with noise: the mislabeled share of the pools (the base
    rate) and of the caches (%, mean ± sample std over seeds), the enrichment cache / pool, and the
    paired difference cache rate - pool rate (points, 95% CI)."""
    out = []
    for r in dict.fromkeys(noisy.rule):
        d = noisy[noisy.rule == r].set_index("seed").loc[list(seeds)]
        diff = paired_difference(d.cache_rate.to_numpy(), d.pool_rate.to_numpy())
        out.append({"rule": r, "mislabeled in the pools (%)": mean_std(d.pool_rate, 1),
                    "mislabeled in the caches (%)": mean_std(d.cache_rate, 1),
                    "enrichment (cache / pool)": f"{(d.cache_rate / d.pool_rate).mean():.2f}",
                    "cache - pool (points)": diff.format(1), "resolved": diff.excludes_zero})
    return pd.DataFrame(out).set_index("rule")


def noise_accuracy_table(clean: pd.DataFrame, noisy: pd.DataFrame, seeds: Sequence[int],
                         reference: str = "refed") -> pd.DataFrame:
    """Per rule run with noise: A_T with and without noise (mean ± sample std), the paired effect of the
    noise (noisy - clean) and, under noise, the paired difference rule - ``reference`` (points, 95% CI)."""
    under = paired_rows(noisy, "A_T", reference, seeds, list(dict.fromkeys(noisy.rule)))
    out = []
    for r in dict.fromkeys(noisy.rule):
        a = noisy[noisy.rule == r].set_index("seed").loc[list(seeds), "A_T"].to_numpy()
        b = clean[clean.rule == r].set_index("seed").loc[list(seeds), "A_T"].to_numpy()
        eff = paired_difference(a, b)
        out.append({"rule": r, "A_T clean (%)": mean_std(b, 2), "A_T noisy (%)": mean_std(a, 2),
                    "noisy - clean (points)": eff.format(2), "noise effect resolved": eff.excludes_zero,
                    f"noisy: rule - {reference} (points)": "—" if r == reference else under[r].format(2)})
    return pd.DataFrame(out).set_index("rule")


def _verdict(d) -> str:
    return f"{d.format(2)} -> " + ("resolved" if d.excludes_zero else "not resolved")


def summary_lines(clean: pd.DataFrame, noisy: pd.DataFrame | None, controls: dict, splits: dict,
                  seeds: Sequence[int], setting: str) -> str:
    """The chapter's summary, one line per question: the A_T paired differences rule - Re-Fed of the
    controls and of the budget splits ({rule: PairedDifference}), and per rule run with noise the
    mislabeled share of its caches against its pools (paired by seed, 95% CI)."""
    lines = [f"Setting: {setting}, {len(seeds)} seeds; Re-Fed A_T {clean[clean.rule == 'refed'].A_T.mean():.2f} %."]
    lines.append("1. Controls, A_T rule - Re-Fed: " + "; ".join(f"{r} {_verdict(d)}" for r, d in controls.items()))
    if splits:
        lines.append("2. Budget shares, A_T rule - Re-Fed: " + "; ".join(f"{r} {_verdict(d)}" for r, d in splits.items()))
    if noisy is not None:
        parts = []
        for r in dict.fromkeys(noisy.rule):
            d = noisy[noisy.rule == r].set_index("seed").loc[list(seeds)]
            diff = paired_difference(d.cache_rate.to_numpy(), d.pool_rate.to_numpy())
            parts.append(f"{r} caches {d.cache_rate.mean():.1f} % mislabeled vs {d.pool_rate.mean():.1f} % in its pools "
                         f"({_verdict(diff)})")
        lines.append(f"3. Label noise {noisy.noise.iloc[0]:.0%} of the old tasks' labels: " + "; ".join(parts))
    return "\n".join(lines)
