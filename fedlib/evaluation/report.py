"""Table helpers for the book's chapters, paper-independent: a paper's table beside ours, "mean ± std"
cells from a table of means and stds, one metric's values of the rows matching a setting (for paired
differences), and a one-line listing of paired differences."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fedlib.evaluation.stats import mean_std, paired_difference, pm

__all__ = ["beside", "stacked", "pm_table", "mean_std_table", "column_by", "listing", "mean_std_by"]


def beside(paper: pd.DataFrame, ours: pd.DataFrame, labels: tuple[str, str] = ("paper", "ours"),
           level: str = "source") -> pd.DataFrame:
    """``paper`` and ``ours`` interleaved row by row: for every row of ``ours`` (in its order), the
    paper's row of the same index (NaN where the paper has none), then ours. The result's index is
    ``ours``' index plus a last level ``level`` holding ``labels`` = (paper label, ours label)."""
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"labels must be two distinct names (paper, ours), got {labels!r}")
    names = [n if n is not None else f"level_{i}" for i, n in enumerate(ours.index.names)]
    ours = ours.rename_axis(names)
    both = pd.concat({labels[0]: paper.rename_axis(names).reindex(ours.index), labels[1]: ours}, names=[level])
    both = both.reorder_levels([*names, level])
    keys = [(*(key if isinstance(key, tuple) else (key,)), source) for key in ours.index for source in labels]
    return both.reindex(pd.MultiIndex.from_tuples(keys, names=both.index.names))


def stacked(paper: pd.DataFrame, ours: pd.DataFrame, sources: tuple[str, str], digits: int = 2,
            names: Mapping[str, str] | None = None, level: str = "source") -> pd.DataFrame:
    """The paper's table and ours as one table of text cells, aligned column by column: the paper's
    rows, then ours, under a first index level ``level`` naming each row's ``sources`` (paper, ours:
    say the data, e.g. "paper (CIFAR-10)" and "ours (Fashion-MNIST)"). Our columns take the paper's
    names (``names`` maps ours to the paper's; otherwise matched ignoring case) and order; a column
    only one side has comes last; a missing cell is "—". Numbers are written with ``digits``
    decimals, text cells ("83.02 ± 0.41") as they are. The two tables' row indexes must have as
    many levels (a paper's dataset level belongs in its ``sources`` label, or the rows' label)."""
    if len(sources) != 2 or sources[0] == sources[1]:
        raise ValueError(f"sources must be two distinct names (paper, ours), got {sources!r}")
    if paper.index.nlevels != ours.index.nlevels:
        raise ValueError(f"the paper's rows have {paper.index.nlevels} index level(s), ours {ours.index.nlevels}")
    by_case = {str(c).lower(): c for c in paper.columns}
    rename = {c: (names or {}).get(c, by_case.get(str(c).lower(), c)) for c in ours.columns}
    ours = ours.rename(columns=rename)
    columns = list(paper.columns) + [c for c in ours.columns if c not in set(paper.columns)]
    cell = lambda v: "—" if v is None or (isinstance(v, float) and np.isnan(v)) else (
        f"{v:.{digits}f}" if isinstance(v, (float, np.floating)) else str(v))
    parts = {src: t.reindex(columns=columns).astype(object).map(cell) for src, t in zip(sources, (paper, ours))}
    out = pd.concat(parts, names=[level])
    out.index = out.index.set_names([level, *[n or "" for n in paper.index.names]])
    label = lambda v: f"{v:g}" if isinstance(v, (float, np.floating)) else v   # γ = 0.1, not 0.100000
    out.columns = out.columns.map(lambda c: tuple(map(label, c)) if isinstance(c, tuple) else label(c))
    return out


def pm_table(frame: pd.DataFrame, keys: Sequence | None = None, digits: int = 4, names=None,
             missing: str = "-") -> pd.DataFrame:
    """"mean ± std" cells from a table whose columns are (*key, "mean") and (*key, "std") (a paper's
    transcribed table): one column per key in ``keys`` (default: every key of ``frame``, in order),
    ``missing`` where the frame has no such key. Tuple keys give MultiIndex columns named ``names``."""
    if keys is None:
        keys = list(dict.fromkeys(c[:-1] if len(c) > 2 else c[0] for c in frame.columns))
    out = {}
    for key in keys:
        parts = key if isinstance(key, tuple) else (key,)
        if (*parts, "mean") not in frame.columns:
            out[key] = [missing] * len(frame)
            continue
        out[key] = [pm(m, s, digits) for m, s in zip(frame[(*parts, "mean")], frame[(*parts, "std")])]
    table = pd.DataFrame(out, index=frame.index)
    if keys and isinstance(keys[0], tuple):
        table.columns = pd.MultiIndex.from_tuples(list(keys), names=names)
    elif names is not None:
        table.columns.name = names
    return table


def mean_std_table(frame: pd.DataFrame, metrics: Sequence[str], rows: Sequence[str], columns: Sequence[str],
                   digits: int = 4, row_order: Sequence | None = None,
                   column_order: Sequence | None = None) -> pd.DataFrame:
    """"mean ± sample std" of each metric (:func:`fedlib.evaluation.stats.mean_std`) over the runs of
    ``frame`` (one row per run): index (*rows, "metric"), columns ``columns``; ``row_order`` /
    ``column_order`` (tuples) reindex both."""
    long = frame.melt(id_vars=[*rows, *columns], value_vars=list(metrics), var_name="metric")
    table = (long.groupby([*rows, "metric", *columns])["value"].agg(lambda v: mean_std(v, digits=digits))
             .unstack(list(columns)))
    if row_order is not None:
        table = table.reindex(index=pd.MultiIndex.from_tuples(list(row_order), names=[*rows, "metric"]))
    if column_order is not None:
        table = table.reindex(columns=pd.MultiIndex.from_tuples(list(column_order), names=list(columns)))
    return table


def column_by(frame: pd.DataFrame, metric: str, order: str = "seed", **where: Any) -> np.ndarray:
    """``frame[metric]`` of the rows where every column named in ``where`` equals its value (a value
    of None matches every row), sorted by ``order``: the per-seed values a paired difference pairs."""
    mask = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        if value is None:
            continue
        if column not in frame.columns:
            raise ValueError(f"unknown column {column!r}; allowed: {', '.join(map(str, frame.columns))}")
        mask &= (frame[column] == value).to_numpy()
    return frame[mask].sort_values(order)[metric].to_numpy()


def listing(differences: Mapping, digits: int = 4) -> str:
    """"k1 k2: mean [low, high]; ..." for ``{key tuple: PairedDifference}`` (one line of evidence)."""
    return "; ".join(f"{' '.join(map(str, k if isinstance(k, tuple) else (k,)))}: {d.format(digits)}"
                     for k, d in differences.items())


def paired_table(pivot: pd.DataFrame, levels: Sequence, base: str, other: str,
                 level_name: str = "shift scale") -> tuple[pd.DataFrame, dict]:
    """One row per ``level`` of a pivot (one row per seed, columns (level, method)): ``level_name``,
    the two methods' "mean ± std", and "other − base (paired)" (:func:`paired_difference`); and for each
    of the two methods the paired effect of the last level against the first: ``{method: PairedDifference}``."""
    rows = [{level_name: lv, base: mean_std(pivot[(lv, base)]), other: mean_std(pivot[(lv, other)]),
             f"{other} − {base} (paired)": str(paired_difference(pivot[(lv, other)], pivot[(lv, base)]))}
            for lv in levels]
    effects = {m: paired_difference(pivot[(levels[-1], m)], pivot[(levels[0], m)]) for m in (base, other)}
    return pd.DataFrame(rows).set_index(level_name), effects


def mean_std_by(frame: pd.DataFrame, by, columns: Sequence[str], digits: int = 2, count: str | None = None) -> pd.DataFrame:
    """"mean ± sample std" (:func:`fedlib.evaluation.stats.mean_std`, "m (n=1)" for one run) of each
    of ``columns`` per group of ``by`` (groups in order of appearance); with ``count`` a last column
    ``"n"`` holds the number of rows of each group with a value in column ``count``."""
    missing = [c for c in [*columns, *([count] if count else [])] if c not in frame.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the frame; columns: {', '.join(map(str, frame.columns))}")
    groups = frame.groupby(by, sort=False)
    table = groups[list(columns)].agg(lambda v: mean_std(v.to_numpy(), digits))
    if count is not None:
        table["n"] = groups[count].count()
    return table
