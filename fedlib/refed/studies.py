"""The Re-Fed chapters' studies: the benchmark's scenarios and runs shared between sections
(:class:`ScenarioRuns`), paired differences, cache diagnostics and the summary lines. Built on
:mod:`fedlib.refed.algorithm`."""
from __future__ import annotations

import inspect
import math
import time
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from torch import nn

from fedlib.core.parallel import RunGrid, resolve_workers
from fedlib.evaluation.compare import refed_label
from fedlib.evaluation.stats import paired_difference
from fedlib.evaluation.style import human
from fedlib.federated.gradient import FedConfig, History
from fedlib.federated.incremental import run_class_incremental
from fedlib.federated.learner import FirstStageShare, GradientLearner, KeepWeights, select_top
from fedlib.data.datasets import load_dataset
from fedlib.data.domains import digit_domains, make_domain_stream
from fedlib.data.streams import make_stream
from fedlib.federated.models import images_to_tensor, make_model
from fedlib.refed.algorithm import RefedReplay, make_learner, train_pim
from fedlib.refed.speed import PIMShare


def rounds_to_best(history: History) -> int:
    """First evaluated round reaching the stage's best test accuracy (Table 3's CoR per task);
    0 for a stage without training (Fixed) or without evaluation."""
    if history is None or not history.test_acc or all(math.isnan(a) for a in history.test_acc):
        return 0
    acc = np.asarray(history.test_acc, dtype=float)
    return int(history.round[int(np.nanargmax(acc))])


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's runs
# ----------------------------------------------------------------------------------------------
#: the benchmark's methods that train a PIM; "refed_proxy" is "refed" with ``grad_norm="last_layer"``
PIM_METHODS = ("refed", "refed_balanced", "refed_proxy", "refed_task", "refed_task_class")
#: the methods that keep a replay cache under the budget M
REPLAY_METHODS = PIM_METHODS + ("fedavg_replay", "fedprox_replay", "grand", "el2n", "herding", "reservoir")


def run_scenario(scenario: dict, kind: str, method: str, seed: int, *, model_fn: Callable[[], nn.Module],
                 num_clients: int, batch_size: int, momentum: float, participation: float, device: str,
                 num_threads: int, memory_mode: str, pim_epochs: int, grad_norm: str,
                 method_hparams: dict | None = None, num_classes: int = 10, alpha: float | None = None,
                 memory: int | None = None, lam: float | None = None, weighting: str = "early",
                 track: bool = False, share_first_stage: FirstStageShare | None = None,
                 pim_share: PIMShare | None = None) -> dict:
    """One run of the benchmark chapter: ``method`` (a :data:`LEARNERS` name or ``"refed_proxy"``) through
    ``scenario``'s stream with ``seed`` (model initialisation, class order, partitions, client draws).

    ``scenario``: ``name`` (the table label), ``x_train`` (N, C, H, W), ``y_train`` (N,), ``x_test``,
    ``y_test``, ``stream`` (a stream, or seed -> stream), ``alpha`` (Dirichlet), ``lr``, ``memory`` (M), ``lam``,
    ``rounds``, ``first_rounds`` (or None), ``epochs``; ``kind`` is ``"class"`` or ``"domain"``
    (:func:`make_learner`'s ``scenario``). ``alpha``, ``memory``, ``lam`` override the scenario's;
    ``method_hparams`` {method: keyword arguments of its loss}; ``num_classes`` of the model's head.
    Plain SGD (Eqs. 3 and 6; the paper names no optimizer); ``track`` evaluates after every round
    (Table 3's rounds to best).
    ``share_first_stage``: a :class:`fedlib.federated.learner.FirstStageShare`; the task-1 training, the same
    for every method with the plain loss (no cache exists yet), is then done once and restored by
    the other runs (bit-identical); its measured seconds still count in every run's ``wall_s``.
    ``pim_share``: a :class:`PIMShare` through which the Re-Fed runs reuse identical PIMs.
    After the run the storage rule of ``memory_mode`` is checked on what the clients hold
    (RuntimeError on a violation) and the weights must be finite (FloatingPointError).

    Returns {"result": IncrementalResult, "learner", "tracked", "cor" (rounds to best per task, [] if
    not tracked), "method", "row" (the metrics row: ``result.summary()``, ``key``, ``top1_T``,
    ``CoR_sum``), "client_stages" (client caches checked)}.
    """
    pim = method in PIM_METHODS
    alpha = scenario["alpha"] if alpha is None else alpha
    memory = scenario["memory"] if memory is None else memory
    lam = scenario["lam"] if lam is None else lam
    stream = scenario["stream"](seed) if callable(scenario["stream"]) else scenario["stream"]
    config = FedConfig(rounds=scenario["rounds"], local_epochs=scenario["epochs"], batch_size=batch_size,
                       lr=scenario["lr"], momentum=momentum, weight_decay=0.0, participation=participation, seed=seed,
                       device=device, num_threads=num_threads, eval_every=1 if track else 10**6)
    pos_test = stream.relabel(scenario["y_test"])

    def eval_data(t):
        idx = np.concatenate([stream.tasks[tau].test_idx for tau in range(t + 1)])
        return scenario["x_test"][idx], torch.from_numpy(pos_test[idx])

    kw = dict((method_hparams or {}).get(method, {}))
    if method in REPLAY_METHODS:
        kw["memory_mode"] = memory_mode
    if pim:
        kw.update(lam=lam, weighting=weighting, pim_epochs=pim_epochs,
                  grad_norm="last_layer" if method == "refed_proxy" else grad_norm)
    if scenario["first_rounds"] is not None:
        kw["first_rounds"] = scenario["first_rounds"]
    learner = make_learner("refed" if method == "refed_proxy" else method, model_fn, config, num_classes=num_classes,
                           memory=memory, scenario=kind, progress=False, eval_data=eval_data if track else None,
                           share_first_stage=share_first_stage, **kw)
    if isinstance(learner.replay, RefedReplay):
        learner.replay.pim_share = pim_share
    label = refed_label(method, grad_norm=grad_norm) + ("" if weighting == "early" or not pim else f" ({weighting})")
    res = run_class_incremental(learner, stream, scenario["x_train"], scenario["y_train"], scenario["x_test"],
                                scenario["y_test"], num_clients, alpha, seed,
                                config={"scenario": scenario["name"], "seed": seed, "alpha": alpha,
                                        "M": memory if method in REPLAY_METHODS else 0,
                                        "lambda": lam if pim else np.nan, "weighting": weighting},
                                progress=False)
    res.method = label
    for t, seconds in learner.reused_seconds.items():   # a restored task-1 training costs what it cost when run
        res.wall_s[t] += seconds
    cor = [rounds_to_best(h) for h in learner.histories] if track else []
    learner.eval_data = None   # a closure over the test data, done with; the run's dict must pickle (forked runs)
    learner.share_first_stage = None   # the shares, done with: a run's dict pickles without them
    if isinstance(learner.replay, RefedReplay):
        learner.replay.pim_share = None
    for h in learner.histories:
        if h is not None:
            h.final_state = None   # every stage's weights: not needed after the run
    violations = learner.check_memory()
    if violations:
        raise RuntimeError(f"{label} ({kind}, seed {seed}) broke the storage rule of memory_mode "
                           f"{memory_mode!r}: {violations[:3]}")
    if not all(bool(torch.isfinite(p).all()) for p in learner.model.parameters()):
        raise FloatingPointError(f"{label} ({kind}, seed {seed}) diverged: non-finite weights; lower lr or the "
                                 "method's regularisation weight")
    client_stages = sum(len(log["new"]) for log in learner.memory_log[1:] if len(log)) if method in REPLAY_METHODS else 0
    return {"result": res, "learner": learner, "tracked": track, "cor": cor, "method": method,
            "row": {**res.summary(), "key": method, "top1_T": 100 * res.top1[-1],
                    "CoR_sum": sum(cor) if track else np.nan},
            "client_stages": client_stages}


class ScenarioRuns:
    """The benchmark chapter's runs, cached by their settings so that the sweeps reuse the main runs.

    ``scenarios`` {kind: scenario dict of :func:`run_scenario`}; ``settings`` the keyword arguments of
    :func:`run_scenario` shared by every run (``model_fn``, ``num_clients``, ``batch_size``, ...).
    ``runs(kind, method, seed, alpha=, memory=, lam=, weighting=, track=)`` returns the run's dict; a
    tracked run also serves an untracked request. ``runs.runs`` {key: run}, ``runs.memory_checks``
    counts the runs and (client, task) caches whose storage rule was checked. ``share_first_stage``
    (default True): the runs share one :class:`fedlib.federated.learner.FirstStageShare` (``runs.first_stage``),
    so the task-1 training common to the methods with the plain loss is done once per setting, and
    one :class:`PIMShare` (``runs.pims``) for the PIMs that are the same in several runs.
    :meth:`prefetch` runs a cell's requests in forked worker processes first, so that its calls are
    then served from the cache.
    """

    def __init__(self, scenarios: dict[str, dict], share_first_stage: bool = True, **settings: Any):
        self.scenarios = scenarios
        self.settings = settings
        self.share = bool(share_first_stage)
        self.runs: dict[tuple, dict] = {}
        self.memory_checks = {"runs": 0, "client-stages": 0}
        self.first_stage = FirstStageShare() if share_first_stage else None
        self.pims = PIMShare() if share_first_stage else None

    def key(self, kind: str, method: str, seed: int, *, alpha: float | None = None, memory: int | None = None,
            lam: float | None = None, weighting: str = "early") -> tuple:
        """The cache key of a run: (kind, method, seed, alpha, memory (replay methods), lam and weighting
        (PIM methods)), the scenario's values filled in."""
        if kind not in self.scenarios:
            raise ValueError(f"kind must be one of {sorted(self.scenarios)}, got {kind!r}")
        s = self.scenarios[kind]
        alpha = s["alpha"] if alpha is None else alpha
        memory = s["memory"] if memory is None else memory
        lam = s["lam"] if lam is None else lam
        pim = method in PIM_METHODS
        return (kind, method, seed, alpha, memory if method in REPLAY_METHODS else None, lam if pim else None,
                weighting if pim else None)

    def _served(self, key: tuple, track: bool) -> bool:
        """The run of ``key`` (:meth:`key`) is held, and tracked when ``track`` asks for it: a call is served
        from the cache."""
        return key in self.runs and (self.runs[key]["tracked"] or not track)

    def __call__(self, kind: str, method: str, seed: int, *, alpha: float | None = None, memory: int | None = None,
                 lam: float | None = None, weighting: str = "early", track: bool = False) -> dict:
        key = self.key(kind, method, seed, alpha=alpha, memory=memory, lam=lam, weighting=weighting)
        if self._served(key, track):
            return self.runs[key]
        # run_scenario fills a None alpha, memory or lam from the scenario, as key() does
        out = run_scenario(self.scenarios[kind], kind, method, seed, alpha=alpha, memory=memory, lam=lam,
                           weighting=weighting, track=track, share_first_stage=self.first_stage, pim_share=self.pims,
                           **self.settings)
        self.memory_checks["runs"] += 1
        self.memory_checks["client-stages"] += out["client_stages"]
        self.runs[key] = out
        return out

    def sharing_group(self, request: dict) -> tuple:
        """The default group of a request in :meth:`prefetch`: (kind, seed, alpha). Runs that may share
        work in the sequential order are in one group: the task-1 training
        (:class:`fedlib.federated.learner.FirstStageShare`: one scenario, seed and alpha; the same for every
        memory, lambda and weighting) and the PIMs (:class:`PIMShare`: at the first boundary the same global
        model and pools)."""
        key = self.key(**_run_args(request))
        return key[0], key[2], key[3]

    def prefetch(self, requests: Sequence[dict], workers: int | None = None, *, group: Callable[[dict], Any] | None = None,
                 progress: bool = True, desc: str = "runs") -> dict:
        """Run the requests not yet held in forked worker processes (:func:`fedlib.core.parallel.fork_map`),
        so that the calls ``self(**request)`` that follow are served from the cache with the results of
        the sequential calls, bit for bit (seconds aside).

        ``requests``: keyword arguments of :meth:`__call__` (``kind``, ``method``, ``seed``, optional
        ``alpha``, ``memory``, ``lam``, ``weighting``, ``track``), in the order the cell calls them.
        They are split into groups by ``group(request)`` (default :meth:`sharing_group`: the runs that
        share a task-1 training or PIMs stay in one group, so they still share them); each group runs
        in request order in a fresh ScenarioRuns of the same scenarios and settings (in a worker, or
        in this process when ``workers`` is 1 or there is one group), which starts from this one's
        task-1 trainings and PIMs. Groups go out largest first (the most runs, then the scenario with
        the most training samples), so the workers finish close together. The runs come back into
        ``runs`` in request order; ``memory_checks``, the new PIMs and the PIM hit counts are added.
        ``workers`` None: :func:`fedlib.core.parallel.default_workers`. Returns {"runs": runs made,
        "groups": groups, "processes": worker processes used (1: this process), "seconds" (wall),
        "cpu_seconds" (CPU time of each group, in job order)}.
        """
        workers = resolve_workers(workers)
        if isinstance(requests, dict) or not all(isinstance(r, dict) for r in requests):
            raise ValueError("requests must be a sequence of dicts of ScenarioRuns' call arguments "
                             "(kind, method, seed, ...)")
        params = set(inspect.signature(self.__call__).parameters)
        for r in requests:
            if not {"kind", "method", "seed"} <= set(r) or set(r) - params:
                raise ValueError(f"a request needs kind, method and seed and takes only {sorted(params)}, got {r}")
            self.key(**_run_args(r))   # a bad kind fails here, before any run
        size = {k: len(s["y_train"]) for k, s in self.scenarios.items()}
        if workers > 1:
            import torch._dynamo  # noqa: F401  (torch's optimizers import it on first use, 1 s of CPU: the workers inherit it)

        def run_group(reqs):
            cpu = time.process_time()
            sub = ScenarioRuns(self.scenarios, share_first_stage=self.share, **self.settings)
            if self.share:   # start from what this one holds (entries are restored by copy, never changed)
                sub.first_stage.update(self.first_stage)
                sub.pims.update(self.pims)
            runs = [sub(**r) for r in reqs]
            pims = {} if not self.share else {k: v for k, v in sub.pims.items() if k not in self.pims}
            return runs, (sub.memory_checks, pims, (0, 0) if not self.share else (sub.pims.hits, sub.pims.misses),
                          time.process_time() - cpu)

        cpu_seconds = []

        def absorb(extra):
            checks, pims, (hits, misses), cpu = extra
            for k in self.memory_checks:
                self.memory_checks[k] += checks[k]
            if self.share:
                self.pims.update(pims)
                self.pims.hits += hits
                self.pims.misses += misses
            cpu_seconds.append(cpu)

        track = lambda r: bool(r.get("track", False))   # noqa: E731
        grid = RunGrid(key=lambda r: self.key(**_run_args(r)), held=lambda r: self._served(self.key(**_run_args(r)), track(r)),
                       repeats=lambda earlier, r: track(earlier) or not track(r), run_group=run_group, absorb=absorb,
                       results=self.runs)
        grid.fill(requests, workers, group=group or self.sharing_group, desc=desc, progress=progress,
                  cost=lambda g: (len(g), size[g[0]["kind"]]))
        return {**grid.report, "cpu_seconds": cpu_seconds}


def _run_args(request: dict) -> dict:
    """A :meth:`ScenarioRuns.prefetch` request without ``track``: the arguments of :meth:`ScenarioRuns.key`."""
    return {k: v for k, v in request.items() if k != "track"}


def prefetch_summary(info: dict, what: str) -> str:
    """One line on a :meth:`ScenarioRuns.prefetch` (its returned ``info``): runs, groups, processes,
    wall seconds, CPU seconds in all and per group."""
    return (f"{what}: {info['runs']} runs in {info['groups']} group(s) on {info['processes']} process(es), "
            f"{info['seconds']:.0f} s ({sum(info['cpu_seconds']):.0f} s CPU; per group, in the order sent: "
            f"{', '.join(f'{c:.0f}' for c in info['cpu_seconds'])} s)")


def run_methods(runs: dict[str, dict], model_fn: Callable[[], nn.Module], config: FedConfig, stream, x_train, y_train,
                x_test, y_test, *, num_classes: int, num_clients: int, beta: float | None,
                seed: int) -> tuple[dict, dict]:
    """Run several learners through one class-incremental stream with the same data, partitions and
    seed. ``runs`` {name: keyword arguments of :func:`make_learner`}; the method is the name's first
    word (``"refed (memory holds all)"`` runs ``"refed"``). Returns ({name: IncrementalResult},
    {name: :class:`fedlib.federated.learner.KeepWeights`}: the global weights after every stage)."""
    results, kept = {}, {name: KeepWeights() for name in runs}
    for name, kw in runs.items():
        learner = make_learner(name.split(" ")[0], model_fn, config, num_classes=num_classes, progress=False,
                               on_stage_end=[kept[name]], **kw)
        results[name] = run_class_incremental(learner, stream, x_train, y_train, x_test, y_test, num_clients=num_clients,
                                              beta=beta, seed=seed, progress=False)
    return results, kept


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's tables and evidence (from the runs of a ScenarioRuns)
# ----------------------------------------------------------------------------------------------
def make_scenario(name: str, x_train, y_train, x_test, y_test, stream, **settings: Any) -> dict:
    """A scenario dict of :func:`run_scenario`: uint8 images (N, H, W) or (N, H, W, 3) as float tensors
    (N, C, H, W) (:func:`fedlib.federated.models.images_to_tensor`), labels (N,), ``stream`` (a stream or seed ->
    stream) and ``settings`` (``alpha``, ``lr``, ``memory``, ``lam``, ``rounds``, ``first_rounds``, ``epochs``)."""
    missing = sorted({"alpha", "lr", "memory", "lam", "rounds", "first_rounds", "epochs"} - set(settings))
    if missing:
        raise ValueError(f"scenario {name!r} lacks the settings {', '.join(missing)}")
    return {"name": name, "x_train": images_to_tensor(x_train), "y_train": y_train, "x_test": images_to_tensor(x_test),
            "y_test": y_test, "stream": stream, **settings}


def benchmark_scenarios(p: dict[str, Any]) -> dict[str, dict]:
    """The benchmark chapter's scenarios from its parameters ``p``: ``"class"`` (``dataset`` at most
    ``n_train`` / ``n_test`` images, ``num_tasks`` tasks) and, when ``p["domain"]``, ``"domain"`` (the digit
    ``domains``, ``n_per_domain`` images each), each with its own alpha, lr, memory, lambda and rounds."""
    ds = load_dataset(p["dataset"]).at_most(p["n_train"], p["n_test"])
    scen = {"class": make_scenario(
        f"class-incremental / {human(p['dataset'])}", ds.x_train, ds.y_train, ds.x_test, ds.y_test,
        partial(make_stream, ds.y_train, ds.y_test, p["num_tasks"]), alpha=p["alpha"], lr=p["lr"],
        memory=p["memory"], lam=p["lam"], rounds=p["rounds"], first_rounds=None, epochs=p["local_epochs"])}
    if p["domain"]:
        stream, x_tr, y_tr, x_te, y_te = make_domain_stream(digit_domains(p["domains"], seed=0,
                                                                          n_per_domain=p["n_per_domain"]))
        scen["domain"] = make_scenario(
            "domain-incremental / digits", x_tr, y_tr, x_te, y_te, stream, alpha=p["alpha_domain"], lr=p["lr_domain"],
            memory=p["memory_domain"], lam=p["lam_domain"], rounds=p["rounds_domain"],
            first_rounds=p["first_rounds_domain"], epochs=p["local_epochs_domain"])
    return scen


def run_settings(p: dict[str, Any], scenario: dict) -> dict[str, Any]:
    """The model and training settings of :func:`run_scenario` (and :class:`ScenarioRuns`) from a
    chapter's parameters ``p``: ``model_fn`` builds ``p["model"]`` for ``scenario``'s images."""
    x = scenario["x_train"]
    model_fn = partial(make_model, p["model"], int(x.shape[1]), 10, image_size=int(x.shape[-1]), width=p["cnn_width"],
                       hidden=p["cnn_hidden"])
    return dict(model_fn=model_fn, num_clients=p["num_clients"], batch_size=p["batch_size"], momentum=p["momentum"],
                participation=p["participation"], device=p["device"], num_threads=p["num_threads"],
                memory_mode=p["memory_mode"], pim_epochs=p["pim_epochs"], grad_norm=p["grad_norm"])


def benchmark_runs(p: dict[str, Any], scenarios: dict[str, dict]) -> ScenarioRuns:
    """The benchmark chapter's :class:`ScenarioRuns` on ``scenarios`` with its model and training settings."""
    return ScenarioRuns(scenarios, **run_settings(p, scenarios["class"]), method_hparams=p["method_hparams"])


def first_task_accuracies(runs: ScenarioRuns, kind_methods: dict[str, Sequence[str]], seeds: Sequence[int],
                          methods: Sequence[str]) -> dict[tuple, dict]:
    """Accuracy on task 1 after task 1 (``acc[0, 0]``) of the tracked runs: {(kind, seed): {method:
    accuracy}} for the ``methods`` run in each kind (``kind_methods`` {kind: methods}). No cache exists
    on task 1, so the memory-based methods and FedAvg must agree exactly (the paper's Tables 5-9)."""
    return {(kind, seed): {m: runs(kind, m, seed, track=True)["result"].acc[0, 0] for m in methods if m in kind_m}
            for kind, kind_m in kind_methods.items() for seed in seeds}


def paired_differences(main, scenarios: dict[str, dict], kind_methods: dict[str, Sequence[str]], pairs, seeds,
                       grad_norm: str, metrics: Sequence[str] = ("A_T", "A_avg")):
    """Paired differences a - b over ``seeds`` (:func:`fedlib.evaluation.stats.paired_difference`) of the
    main runs' rows ``main`` (one row per run: ``scenario`` name, ``key`` method, ``seed``, metrics) for
    every pair (a, b) in ``pairs`` run in a kind (``kind_methods``) and every metric; none with fewer
    than 2 seeds. Returns ({(kind, a, b, metric): PairedDifference}, a table: scenario, comparison,
    metric, mean difference [95% CI], resolved (CI excludes 0), seeds a > b)."""
    diffs, rows = {}, []
    for kind in scenarios:
        df = main[main.scenario == scenarios[kind]["name"]]
        for a, b in pairs:
            if a not in kind_methods[kind] or b not in kind_methods[kind] or len(seeds) < 2:
                continue
            for metric in metrics:
                va = df[df.key == a].set_index("seed").loc[seeds, metric].to_numpy()
                vb = df[df.key == b].set_index("seed").loc[seeds, metric].to_numpy()
                d = paired_difference(va, vb)
                diffs[(kind, a, b, metric)] = d
                rows.append({"scenario": scenarios[kind]["name"],
                             "comparison": f"{refed_label(a, grad_norm)} - {refed_label(b, grad_norm)}",
                             "metric": metric, "mean difference [95% CI] (points)": str(d),
                             "resolved (CI excludes 0)": d.excludes_zero,
                             "seeds a > b": f"{int((va > vb).sum())} of {len(seeds)}"})
    return diffs, pd.DataFrame(rows)


def replay_verdict(diffs: dict, kind: str, baselines: Sequence[str] = ("fedavg_replay", "fedprox_replay")) -> dict | None:
    """The paper's headline (Table 1) from :func:`paired_differences`' A_T differences "refed" - b for the
    ``baselines`` b compared in ``kind``: {"baselines", "diffs", "holds" (every CI above 0), "worse"
    (baselines whose CI lies above Re-Fed's), "verdict" (a sentence)}; None when none was compared."""
    baselines = [b for b in baselines if (kind, "refed", b, "A_T") in diffs]
    if not baselines:
        return None
    ds_ = [diffs[(kind, "refed", b, "A_T")] for b in baselines]
    worse = [b for b, d in zip(baselines, ds_) if d.high < 0]
    holds = all(d.low > 0 for d in ds_)
    verdict = ("resolved in Re-Fed's favour" if holds else
               "Re-Fed resolved below " + ", ".join(worse) if worse else
               "not supported at this scale: a paired CI contains 0, so these runs show neither an advantage "
               "nor a disadvantage")
    return {"baselines": baselines, "diffs": ds_, "holds": holds, "worse": worse, "verdict": verdict}


def cache_diagnostics(runs: ScenarioRuns, methods: Sequence[str], seeds: Sequence[int], memory_mode: str,
                      grad_norm: str, kind: str = "class"):
    """Where the replay goes (class-incremental caches), at every boundary t >= 2 of the tracked runs of
    ``methods`` x ``seeds``, summed over clients: the last old task's share of the pool and of the
    cache (%), the smallest per-class count in the union of the caches (over the classes the pools
    hold), the (client, class) pairs a cache loses, and the unused cache storage (budget - cache, the
    budget of ``memory_mode``). One row per (method, seed, boundary)."""
    rows = []
    for m in methods:
        for seed in seeds:
            lrn = runs(kind, m, seed, track=True)["learner"]
            for t, log in enumerate(lrn.memory_log):
                if t < 2 or "old_tasks" not in log:
                    continue
                old_cls = log["pool_classes"].sum(0) > 0
                union = log["old_classes"].sum(0)
                budget = lrn.replay.memory - log["new"] if memory_mode == "total" else lrn.replay.memory
                rows.append({"method": refed_label(m, grad_norm), "seed": seed, "boundary": t,
                             "last old task, share of the pool (%)": 100 * log["pool_tasks"][:, t - 1].sum() / log["pool"].sum(),
                             "last old task, share of the cache (%)": 100 * log["old_tasks"][:, t - 1].sum() / log["old"].sum(),
                             "smallest class count, union of caches": int(union[old_cls].min()),
                             "(client, class) pairs lost": int(((log["pool_classes"] > 0) & (log["old_classes"] == 0)).sum()),
                             "unused cache storage (samples, all clients)": int((budget - log["old"]).clip(min=0).sum())})
    return pd.DataFrame(rows)


def final_task_accuracy(runs: ScenarioRuns, methods: Sequence[str], seeds: Sequence[int], grad_norm: str,
                        kind: str = "class"):
    """Final accuracy per task (%, the last row of ``acc``) of the tracked runs: one row per (method,
    seed), columns method, seed, "task 1", ..., "task T"."""
    return pd.DataFrame([{"method": refed_label(m, grad_norm), "seed": seed,
                          **{f"task {tau + 1}": 100 * a for tau, a in enumerate(runs(kind, m, seed, track=True)["result"].acc[-1])}}
                         for m in methods for seed in seeds])


def last_task_hypothesis(per_seed, final_task, num_tasks: int, grad_norm: str) -> dict:
    """Re-Fed minus random replay, paired by seed: the last old task's share of the cache (``share``,
    from ``per_seed``, indexed by (method label, seed)), the final accuracy on task T-1 (``last``) and
    on task 1 (``first``) from :func:`final_task_accuracy`; ``confirmed`` when the share and the task
    T-1 accuracy both fall (CI below 0)."""
    a, b = refed_label("refed", grad_norm), refed_label("fedavg_replay", grad_norm)
    col = "last old task, share of the cache (%)"
    share = paired_difference(per_seed.loc[a][col].to_numpy(), per_seed.loc[b][col].to_numpy())
    last = paired_difference(final_task[final_task.method == a][f"task {num_tasks - 1}"].to_numpy(),
                             final_task[final_task.method == b][f"task {num_tasks - 1}"].to_numpy())
    first = paired_difference(final_task[final_task.method == a]["task 1"].to_numpy(),
                              final_task[final_task.method == b]["task 1"].to_numpy())
    return {"share": share, "last": last, "first": first, "confirmed": share.high < 0 and last.high < 0}


def first_task_table(runs: ScenarioRuns, kind: str, methods: Sequence[str], seeds: Sequence[int], grad_norm: str):
    """Accuracy (%) on task (domain) 1 right after task 1 and after the last task, one row per (method, seed)."""
    rows = []
    for m in methods:
        for seed in seeds:
            acc = runs(kind, m, seed, track=True)["result"].acc
            rows.append({"method": refed_label(m, grad_norm), "seed": seed, "domain 1 after task 1 (%)": 100 * acc[0, 0],
                         "domain 1 after the last task (%)": 100 * acc[-1, 0]})
    return pd.DataFrame(rows)


def stage_curves(runs: ScenarioRuns):
    """A_t after every stage (``IncrementalResult.curve``) of every tracked run, one frame."""
    return pd.concat([runs.runs[k]["result"].curve().assign(method=runs.runs[k]["result"].method)
                      for k in runs.runs if runs.runs[k]["tracked"]], ignore_index=True)


def round_curves(runs: ScenarioRuns, seed: int):
    """Test accuracy (%) of the global model after every round of the tracked runs of ``seed``, rounds
    counted over all tasks: columns scenario, method, round, accuracy."""
    rows = []
    for k, v in runs.runs.items():
        if v["tracked"] and k[2] == seed:
            start = 0
            for h in v["learner"].histories:
                if h is not None:
                    rows += [{"scenario": v["row"]["scenario"], "method": v["result"].method, "round": start + r,
                              "accuracy": 100 * a} for r, a in zip(h.round, h.test_acc)]
                    start += h.round[-1]
    return pd.DataFrame(rows)


def last_task_curves(runs: ScenarioRuns, kind: str, methods: Sequence[str], seeds: Sequence[int]) -> dict:
    """{method: [test accuracy (%) after every round of the last task, one list per seed]} of the
    tracked runs of ``kind``: the curve the convergence rule reads (the final accuracy is its end). A
    method that does not train on the last task (``fixed``) has no such curve and is left out."""
    last = {m: [runs(kind, m, seed, track=True)["learner"].histories[-1] for seed in seeds] for m in methods}
    return {m: [[100 * a for a in h.test_acc] for h in hs] for m, hs in last.items() if all(h is not None for h in hs)}


def refed_paper_gaps(table1) -> dict[str, float]:
    """The paper's smallest Re-Fed advantage (pp) over FedAvg and FedProx (random caching) in its Table 1
    (``refed_table1()``, floats), per kind of stream: rows 1-3 class-incremental, 4-6 domain-incremental."""
    gap = pd.concat([table1[("Re-Fed", "mean")] - table1[(b, "mean")] for b in ("FedAvg", "FedProx")], axis=1).min(axis=1)
    return {"class": float(gap.iloc[:3].min()), "domain": float(gap.iloc[3:].min())}


def last_task_share(runs: ScenarioRuns, memories: Sequence[int], seeds: Sequence[int], kind: str = "class") -> dict:
    """{M: the last old task's share (%) of Re-Fed's caches at every boundary t >= 2, all clients and
    ``seeds``} for every memory size M of ``memories``."""
    share = {}
    for M in memories:
        logs = [log for seed in seeds for t, log in enumerate(runs(kind, "refed", seed, memory=M)["learner"].memory_log)
                if t >= 2 and "old_tasks" in log]
        share[M] = 100 * sum(log["old_tasks"][:, -1].sum() for log in logs) / max(1, sum(log["old"].sum() for log in logs))
    return share


def largest_pools(runs: ScenarioRuns, methods: Sequence[str], seeds: Sequence[int], memory: int,
                  kind: str = "class") -> list[int]:
    """The largest candidate pool of every boundary of the replay methods' runs with memory ``memory``:
    Re-Fed equals random replay once M holds every pool."""
    return [int(log["pool"].max()) for seed in seeds for m in methods if m in REPLAY_METHODS
            for log in runs(kind, m, seed, memory=memory)["learner"].memory_log if len(log)]


def compare_grad_norms(learner: GradientLearner, *, lam: float, epochs: int, lr: float, batch_size: int, memory: int,
                       num_seen: int = 10, device: str = "cpu") -> dict:
    """Exact (Eq. 4, all parameters) against last-layer gradient norms on the same PIM trajectory:
    :func:`train_pim` from ``learner``'s final model on its largest client pool (generator seed 0),
    once per norm. Returns {"client", "y" (n,), "results" {norm: PIMResult with ``seconds``}, "rho"
    (Spearman of the Early scores), "budget" = min(memory, n // 2), "overlap" of the two top-budget
    selections, "share" (median last-layer share of the exact norm)}."""
    k = int(np.argmax([len(s[1]) for s in learner.local_sets]))
    x_pool, y_pool = learner.local_sets[k][0].to(device), learner.local_sets[k][1].to(device)
    res = {}
    for g_norm in ["exact", "last_layer"]:
        t0 = time.perf_counter()
        res[g_norm] = train_pim(learner.model, x_pool, y_pool, num_seen, lam=lam, epochs=epochs, lr=lr,
                                batch_size=batch_size, grad_norm=g_norm, generator=torch.Generator().manual_seed(0))
        res[g_norm].seconds = time.perf_counter() - t0
    if res["exact"].dist_sq != res["last_layer"].dist_sq:
        raise RuntimeError("the two PIM runs differ: the scoring changed the PIM's steps")
    s_ex, s_ll = res["exact"].scores("early"), res["last_layer"].scores("early")
    budget = min(memory, len(y_pool) // 2)
    overlap = len(set(select_top(s_ex, budget).tolist()) & set(select_top(s_ll, budget).tolist())) / budget
    return {"client": k, "y": y_pool, "results": res, "rho": float(spearmanr(s_ex.numpy(), s_ll.numpy())[0]),
            "budget": budget, "overlap": overlap,
            "share": float((res["last_layer"].grad_sq / res["exact"].grad_sq).median())}


def cost_lines(main, scenarios: dict[str, dict], *, pim_epochs: int, participation: float, grad_norm: str) -> list[str]:
    """The cost section's sentences from the main runs' rows ``main``: per scenario, the PIM epochs
    against the expected local epochs per later task (and the paper's 40 against 1200), the PIM +
    scoring seconds (Re-Fed - random replay), equal upload, and the exact / last-layer time ratio."""
    lines = []
    for kind, s in scenarios.items():
        c = main[main.scenario == s["name"]].groupby("key")[["wall_s", "MiB_up"]].mean()
        if {"refed", "fedavg_replay"} <= set(c.index):
            per_task = s["rounds"] * participation * s["epochs"]
            lines.append(f"{s['name']}: {pim_epochs} PIM epochs per client and task against about {per_task:.1f} "
                         f"expected local epochs of training per later task ({pim_epochs / per_task:.0%}; the paper: 40 "
                         f"against 150 x 0.4 x 20 = 1200, {40 / 1200:.1%})")
            lines.append(f"  PIM + scoring cost about {c.wall_s['refed'] - c.wall_s['fedavg_replay']:.1f} s per run "
                         f"({refed_label('refed', grad_norm)}); upload equal to random replay: "
                         f"{np.isclose(c.MiB_up['refed'], c.MiB_up['fedavg_replay'])}")
        if {"refed", "refed_proxy"} <= set(c.index):
            lines.append(f"  a Re-Fed run with exact norms takes {c.wall_s['refed'] / c.wall_s['refed_proxy']:.2f} x the "
                         "time of one with the last-layer proxy")
    return lines


def summary_lines(main, scenarios: dict[str, dict], diffs: dict, seeds: Sequence[int], grad_norm: str) -> list[str]:
    """The summary's sentences: per scenario the methods ranked by mean A_T, every A_T paired difference
    of ``diffs`` (:func:`paired_differences`) with its verdict, and the mean forgetting without memory,
    with random replay and with Re-Fed."""
    lines = []
    for kind, s in scenarios.items():
        df = main[main.scenario == s["name"]]
        ranking = df.groupby("method")["A_T"].mean().sort_values(ascending=False)
        lines.append(f"{s['name']}: mean final accuracy over {len(seeds)} seeds: "
                     + ", ".join(f"{m} {v:.1f}" for m, v in ranking.items()))
        for (sc, a, b, metric), d in diffs.items():
            if sc == kind and metric == "A_T":
                lines.append(f"  A_T {refed_label(a, grad_norm)} - {refed_label(b, grad_norm)}: {d} -> "
                             + ("resolved" if d.excludes_zero else "not resolved"))
        if {"fedavg", "fedavg_replay"} <= set(df.key):
            f_ = df.groupby("key")["F_T"].mean()
            lines.append(f"  forgetting F_T (mean): no memory {f_['fedavg']:.1f}, random replay {f_['fedavg_replay']:.1f}, "
                         f"Re-Fed {f_['refed']:.1f}")
    return lines
