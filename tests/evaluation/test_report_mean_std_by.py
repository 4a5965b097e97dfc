"""Tests for fedlib.evaluation.report.mean_std_by ("mean ± sample std" per group)."""
from __future__ import annotations

import pandas as pd
import pytest

from fedlib.evaluation.report import mean_std_by


def test_mean_std_by_values_order_and_count():
    f = pd.DataFrame({"m": ["b", "b", "a", "a", "c"], "x": [1.0, 3.0, 2.0, 2.0, 5.0], "y": [0, 2, 4, 8, 1]})
    t = mean_std_by(f, "m", ["x", "y"], digits=1, count="x")
    assert list(t.index) == ["b", "a", "c"] and list(t.columns) == ["x", "y", "n"]
    assert t.loc["b", "x"] == "2.0 ± 1.4" and t.loc["a", "y"] == "6.0 ± 2.8" and t.loc["c", "x"] == "5.0 (n=1)"
    assert list(t["n"]) == [2, 2, 1]
    assert mean_std_by(f, "m", ["x"]).loc["b", "x"] == "2.00 ± 1.41"
    with pytest.raises(ValueError, match="z"):
        mean_std_by(f, "m", ["z"])
