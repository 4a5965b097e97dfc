"""The self-checks of the Re-Fed chapters' exercises: each takes the student's answer and the
chapter's own numbers and returns a :class:`~fedlib.evaluation.selfcheck.Verdict`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.evaluation.selfcheck import Verdict, answer_choice, answer_number, need, pending
from fedlib.refed.algorithm import q_lambda


def refed_mean_lambda(answer: float, lam_sum: float, n: int, *, rtol: float = 1e-4,
                      exercise: str = "Re-Fed theory, ex. sum versus mean") -> Verdict:
    """lambda' under mean scaling with q(lambda') = q(lambda_sum) / n, i.e. lambda' = 1 / (1 + 2 q / n)."""
    if int(n) < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    lam = 1.0 / (1.0 + 2.0 * q_lambda(lam_sum) / int(n))
    return answer_number(answer, lam, name="my_lambda", asks=f"lambda under 'mean' equivalent to {lam_sum:g} under "
                         f"'sum' for n = {n}", compared_with="lambda' = 1/(1 + 2 q(lambda_sum)/n) from refed.q_lambda",
                         exercise=exercise, rtol=rtol)


def refed_one_step_flat(fin: pd.DataFrame, *, tol: float = 1e-12,
                        exercise: str = "Re-Fed theory, ex. one step") -> Verdict:
    """After s = 1 step of eq. 3 from v = w the PIM does not depend on lambda (flat distance curve).

    ``fin``: the finite-step scan (columns s, lambda, dist).
    """
    need(fin, ["s", "lambda", "dist"], "fin")
    one = fin[fin["s"] == 1]
    if one.empty:
        raise ValueError("fin has no s = 1 rows: keep 1 in pim_steps")
    spread = float(np.ptp(one["dist"].to_numpy()))
    return Verdict(exercise, "the s = 1 distance is the same for every lambda",
                   f"measured spread over {one['lambda'].nunique()} lambdas {spread:.1e} <= {tol:.0e}", bool(spread <= tol))


def refed_full_memory(acc_refed, acc_random, memory: int, largest_pool: int, *,
                      exercise: str = "Re-Fed benchmark, ex. full memory") -> Verdict:
    """Once M holds every client's pool, Re-Fed and random replay keep the same samples and train identically;
    below that they select differently (and in general end with different accuracies).

    ``acc_refed``, ``acc_random``: the two runs' accuracy matrices (tasks x tasks) at memory ``memory``;
    ``largest_pool``: the largest pool of any client at any boundary (`refed.largest_pools`).
    """
    a, b = np.asarray(acc_refed, dtype=float), np.asarray(acc_random, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"acc_refed and acc_random must have one shape, got {a.shape} and {b.shape}")
    same = bool(np.array_equal(a, b, equal_nan=True))
    holds_all = int(memory) >= int(largest_pool)
    pred = "identical accuracy matrices" if holds_all else "different accuracy matrices"
    return Verdict(exercise, f"M = {memory} {'>=' if holds_all else '<'} largest pool {largest_pool}: {pred}",
                   f"measured {'identical' if same else 'different'} matrices", same == holds_all)


def refed_pim_distance(dist_by_lambda: dict, *, exercise: str = "Re-Fed benchmark, ex. importance") -> Verdict:
    """Lemma 1: the PIM's distance to the global model does not decrease as lambda grows.

    ``dist_by_lambda``: {lambda: mean ||v - w||^2 over clients}, from PIMs started at the same global
    model on the same pools (the first boundary of runs that differ only in lambda).
    """
    pred = "the PIM's distance to the global model does not decrease as lambda grows"
    if len(dist_by_lambda) < 2:
        return Verdict(exercise, pred, "this run has fewer than two lambdas (lams): nothing to judge", None)
    lams = sorted(dist_by_lambda)
    d = np.array([float(dist_by_lambda[lam]) for lam in lams])
    ok = bool((np.diff(d) >= -1e-12 * np.abs(d).max()).all())
    return Verdict(exercise, pred, "measured " + ", ".join(f"lambda {lam:g}: {v:.3g}" for lam, v in zip(lams, d)), ok)


def _class_gap(memory_log) -> float:
    """Mean total-variation distance between the class proportions of a client's cache and of its pool."""
    gaps = []
    for log in memory_log:
        if "pool_classes" not in log or "old_classes" not in log:
            continue
        for pool, cache in zip(np.asarray(log["pool_classes"], float), np.asarray(log["old_classes"], float)):
            if pool.sum() > 0 and cache.sum() > 0:
                gaps.append(0.5 * np.abs(cache / cache.sum() - pool / pool.sum()).sum())
    if not gaps:
        raise ValueError("memory_log holds no cache with class counts (pool_classes, old_classes)")
    return float(np.mean(gaps))


def refed_class_balance(my_prediction, refed_log, random_log, *,
                        exercise: str = "Re-Fed benchmark, ex. class balance") -> Verdict:
    """Predict-then-check: whose caches keep the pool's class proportions more closely, Re-Fed's top-k or
    random replay? Judged by the mean total-variation distance between cache and pool class proportions.

    ``refed_log``, ``random_log``: the two runs' ``learner.memory_log``.
    """
    try:
        g_refed, g_random = _class_gap(refed_log), _class_gap(random_log)
    except ValueError:
        return Verdict(exercise, "whose caches are closer to the pools' class proportions",
                       "these runs cached nothing with class counts (one task?): nothing to judge", None)
    truth = "refed" if g_refed < g_random else "random"
    v = answer_choice(my_prediction, truth, ["refed", "random"], name="my_prediction",
                      asks="whose caches are closer to the pools' class proportions",
                      compared_with="the mean distance between cache and pool class proportions in this run",
                      exercise=exercise)
    if v.as_predicted is None:
        return v
    return Verdict(exercise, v.prediction, f"{v.measured} (measured distance: Re-Fed {g_refed:.3f}, random "
                                           f"{g_random:.3f})", v.as_predicted)


def refed_rate_constant(my_A, rate_tab: pd.DataFrame, g0: float, *, power: float = 0.5, rtol: float = 0.01,
                        exercise: str = "Re-Fed theory, ex. rates") -> Verdict:
    """The largest admissible A (in units of g0) for g(t) = g0 (t+1)^-p, against the chapter's
    `rate_feasibility` table (columns "g(t)", "largest admissible A")."""
    need(rate_tab, ["g(t)", "largest admissible A"], "rate_tab")
    row = rate_tab[rate_tab["g(t)"].astype(str).str.strip() == f"g0 (t+1)^-{power}"]
    if row.empty:
        raise ValueError(f"rate_tab has no row for g(t) = g0 (t+1)^-{power}")
    truth = float(row["largest admissible A"].iloc[0]) / float(g0)
    return answer_number(my_A, truth, name="my_A", asks=f"the largest admissible A / g0 for p = {power:g}",
                         compared_with="the largest admissible A / g0 of the chapter's rate table", rtol=rtol,
                         exercise=exercise)


def refed_score_limits(my_scores, *, num_classes: int = 10, atol: float = 0.05,
                       exercise: str = "Re-Fed theory, ex. scores") -> Verdict:
    """||pi - e_y||^2 for a confidently correct and a confidently wrong prediction, against softmax(50 e_j)
    with j = y and j != y (``num_classes`` classes)."""
    if my_scores is None:
        return pending("my_scores", "(confidently correct, confidently wrong): the value of ||pi - e_y||^2",
                       "||softmax(z) - e_y||^2 at a large logit on the right class and on a wrong one", exercise)
    try:
        a_ok, a_bad = (float(v) for v in my_scores)
    except (TypeError, ValueError):
        raise ValueError(f"my_scores must be a pair of numbers, got {my_scores!r}") from None
    e = np.eye(num_classes)

    def err(j):
        z = 50.0 * e[j]
        pi = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        return float(((pi - e[0]) ** 2).sum())

    t_ok, t_bad = err(0), err(1)
    ok = abs(a_ok - t_ok) <= atol and abs(a_bad - t_bad) <= atol
    return Verdict(exercise, f"||pi - e_y||^2: confidently correct {t_ok:.3f}, confidently wrong {t_bad:.3f} (± {atol:g})",
                   f"your answer ({a_ok:.3g}, {a_bad:.3g})", bool(ok))


def refed_memory_holds_all(same_as_replay, same_as_fedavg, *,
                           exercise: str = "Re-Fed theory, ex. memory") -> Verdict:
    """With a memory that holds every pool, Re-Fed is bit-identical to random replay at every stage, and to
    FedAvg (no memory) on the first stage only.

    ``same_as_replay``, ``same_as_fedavg``: per stage, whether the global weights are bit-identical.
    """
    rep, fed = np.asarray(same_as_replay, bool), np.asarray(same_as_fedavg, bool)
    if rep.size == 0 or rep.shape != fed.shape:
        raise ValueError(f"same_as_replay and same_as_fedavg must be per-stage flags of one length, got {rep.shape}, "
                         f"{fed.shape}")
    ok = bool(rep.all() and fed[0] and not fed[1:].any())
    return Verdict(exercise, "identical to random replay at every stage; to FedAvg at stage 1 only",
                   f"measured identical to random replay at {int(rep.sum())} of {rep.size} stages, to FedAvg at "
                   f"stages {[int(i) + 1 for i in np.flatnonzero(fed)]}", ok)
