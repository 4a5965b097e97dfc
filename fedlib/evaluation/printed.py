"""Frames from numbers as the papers print them: a dict of rows, cells ``"mean±std"`` or plain numbers."""
from __future__ import annotations

import pandas as pd


def cells(printed: str) -> list[float]:
    """``'0.9618±0.0015 0.9400±0.0017'`` -> ``[0.9618, 0.0015, 0.9400, 0.0017]`` (mean, std per cell)."""
    values = []
    for cell in printed.split():
        mean, sep, std = cell.partition("±")
        if not sep:
            raise ValueError(f"cell {cell!r} is not printed as mean±std")
        values += [float(mean), float(std)]
    return values


def multi_frame(data: dict, index_names: list[str], columns) -> pd.DataFrame:
    """A frame with rows ``data`` (tuple key -> list of cells), a MultiIndex named ``index_names``."""
    frame = pd.DataFrame.from_dict(data, orient="index", columns=columns)
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=index_names)
    return frame


def pm_frame(rows: dict, index_names: list[str], column_keys: list, column_names: list[str]) -> pd.DataFrame:
    """Rows of ``"mean±std"`` cells (key -> printed string) as floats: one (column key..., stat)
    column per cell and stat in (mean, std); the column levels are ``column_names`` + ["stat"]."""
    data = {key: cells(printed) for key, printed in rows.items()}
    cols = pd.MultiIndex.from_tuples([(*(c if isinstance(c, tuple) else (c,)), stat)
                                      for c in column_keys for stat in ("mean", "std")],
                                     names=[*column_names, "stat"])
    frame = pd.DataFrame.from_dict(data, orient="index", columns=cols)
    if all(isinstance(k, tuple) for k in frame.index):
        frame.index = pd.MultiIndex.from_tuples(frame.index, names=index_names)
    else:
        frame.index.name = index_names[0]
    return frame


def printed_frame(rows: dict, columns) -> pd.DataFrame:
    """Rows of printed cells (key -> space-separated string) as strings, exactly as printed."""
    return pd.DataFrame({k: v.split() for k, v in rows.items()}, index=columns).T
