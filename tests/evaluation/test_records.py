"""Recorded runs: written atomically with their provenance, read back, matched to a chapter's run."""
import json

import pytest

from fedlib.evaluation import records


def test_a_record_keeps_its_command_machine_date_parameters_and_results(tmp_path):
    path = records.write_record("demo", "python -m fedlib.records demo", {"rounds": 200, "seeds": [0, 1]},
                                {"acc": [0.5, 0.6]}, 61.0, folder=tmp_path)
    rec = records.load_record("demo", folder=tmp_path)
    assert path == tmp_path / "demo.json" and not list(tmp_path.glob(".*partial"))
    assert set(records.FIELDS) <= set(rec) and rec["results"] == {"acc": [0.5, 0.6]}
    assert "cores" in rec["machine"] and rec["date"].endswith("UTC")
    caption = records.record_caption(rec)
    assert "python -m fedlib.records demo" in caption and "1 min" in caption and rec["commit"] not in caption
    assert records.differences(rec, {"rounds": 200, "seeds": [0, 1]}, ["rounds", "seeds"]) == []
    assert records.differences(rec, {"rounds": 20, "seeds": [0, 1]}, ["rounds", "seeds"]) == ["rounds"]
    assert records.differences(None, {"rounds": 20}, ["rounds"]) == ["rounds"]


def test_a_missing_or_incomplete_record_says_how_to_make_it(tmp_path):
    assert records.load_record("absent", folder=tmp_path, missing_ok=True) is None
    with pytest.raises(FileNotFoundError, match="python -m fedlib.records absent"):
        records.load_record("absent", folder=tmp_path)
    (tmp_path / "broken.json").write_text(json.dumps({"name": "broken"}))
    with pytest.raises(ValueError, match="lacks command"):
        records.load_record("broken", folder=tmp_path)


def test_union_merges_disjoint_keys_and_refuses_disagreeing_values():
    a = {"afl": {"s": 0.8}, "final": {"s": {"fedavg": [0.7]}}}
    b = {"afl": {"s": 0.8}, "final": {"s": {"moon": [0.6]}}}
    assert records.union(a, b) == {"afl": {"s": 0.8}, "final": {"s": {"fedavg": [0.7], "moon": [0.6]}}}
    with pytest.raises(ValueError, match=r"results\['afl'\]\['s'\]: 0.8 against 0.9"):
        records.union(a, {"afl": {"s": 0.9}})
    assert records.record_caption({"name": "n", "command": "c", "date": "d", "machine": "m", "seconds": 120,
                                   "parts": ["p1", "p2"]}).endswith("2 min, as 2 processes side by side).")


def test_record_source_says_what_a_verdict_rests_on():
    from fedlib.evaluation.records import record_caption, record_source

    rec = {"name": "r", "command": "python -m fedlib.records r", "date": "2026-11-27 01:00 UTC", "machine": "m",
           "seconds": 120.0, "parameters": {"seeds": [0, 1]}}
    assert record_source(rec, [], "its own runs") == record_caption(rec)
    assert record_source(None, ["seeds"], "its own runs") == "There is no recorded run, so what follows rests on its own runs."
    assert "other parameters (seeds)" in record_source(rec, ["seeds"], "its own 3 rounds")
