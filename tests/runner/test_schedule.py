"""Chapters side by side (fedlib.runner.schedule): order, dependencies, concurrency, failures."""
import json
import os
import time
from pathlib import Path

import pytest

from fedlib.runner import cli, profiles, schedule


def test_plan_puts_dependencies_first_then_the_longest():
    last = {"a": 10.0, "b": 100.0, "c": 50.0, "d": None}
    # d never ran: first; b is the longest but waits for a
    assert schedule.plan(["a", "b", "c", "d"], {"b": ["a"]}, last) == ["d", "c", "a", "b"]
    assert schedule.plan(["a", "b", "c"], {}, last) == ["b", "c", "a"]


def test_after_outside_the_run_is_not_waited_for_and_cycles_are_refused():
    assert schedule.check_after(["b"], {"b": ["a"]}) == {"b": []}
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        schedule.check_after(["a", "b"], {"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="must list chapters"):
        schedule.check_after(["a"], {"a": "b"})


def test_profiles_after_names_chapters_in_the_order_and_respects_it():
    after, order = profiles.chapter_after(), profiles.notebook_names()
    assert after, "profiles.yml: the feature-sharing chapters must be listed under after"
    for chapter, before in after.items():
        assert chapter in order and all(b in order for b in before)
        assert all(order.index(b) < order.index(chapter) for b in before)   # the book's order already respects it


def _fake_run(name, profile, overrides):
    """A chapter that logs its start and end; one of ``overrides["meet"]`` waits (up to 60 s) until
    every other one of them has started, so two chapters only both finish when they ran at once."""
    t0 = time.time()
    if name == "boom":
        raise RuntimeError("cell failed")
    log = Path(overrides["log"])
    (log.parent / f"{name}.started").touch()
    met = True
    if name in overrides.get("meet", []):
        others = [log.parent / f"{o}.started" for o in overrides["meet"] if o != name]
        while not all(p.exists() for p in others):
            if time.time() - t0 > 60:
                met = False
                break
            time.sleep(0.01)
    with open(log, "a") as f:
        f.write(json.dumps([name, t0, time.time(), met, os.environ.get("FEDLIB_WORKERS"),
                            os.environ.get("OPENBLAS_NUM_THREADS"), os.environ.get("OMP_NUM_THREADS")]) + "\n")
    return name, time.time() - t0, 0.0


def test_run_chapters_two_at_once_waits_for_dependencies(tmp_path, monkeypatch):
    from fedlib.core.parallel import default_workers

    monkeypatch.delenv("FEDLIB_WORKERS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    log = tmp_path / "log.jsonl"
    lines = []
    times = schedule.run_chapters(["a", "b", "c"], "quick", 2, {"b": ["a"]}, {}, {"meet": ["a", "c"], "log": str(log)},
                                  run_one=_fake_run, log=lines.append)
    assert set(times) == {"a", "b", "c"}
    rows = {r[0]: r[1:] for r in map(json.loads, log.read_text().splitlines())}
    assert rows["b"][0] >= rows["a"][1] - 0.05      # b started after a ended
    assert rows["a"][2] and rows["c"][2]            # a and c ran at the same time (each saw the other start)
    assert any("done 3/3" in line for line in lines)
    # two chapters side by side: each may fork its half of the cores (fedlib.core.parallel.default_workers),
    # and NumPy's BLAS, torch and OpenMP get as many threads
    share = str(max(1, default_workers() // 2))
    assert {r[3] for r in rows.values()} == {r[4] for r in rows.values()} == {r[5] for r in rows.values()} == {share}


def test_run_chapters_raises_the_first_failure_and_starts_nothing_after_it(tmp_path):
    log = tmp_path / "log.jsonl"
    with pytest.raises(RuntimeError, match="cell failed"):
        schedule.run_chapters(["boom", "x"], "quick", 1, {"x": ["boom"]}, {}, {"log": str(log)},
                              run_one=_fake_run, log=lambda s: None)
    assert not Path(log).exists()
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        schedule.run_chapters(["x"], "quick", 0, {}, {}, run_one=_fake_run)


def test_cli_refuses_output_with_jobs(capsys):
    with pytest.raises(ValueError, match="--output"):
        cli.main(["afl_derivation", "--jobs", "2", "--output", "x.ipynb"])


def test_the_record_of_a_whole_run_lists_every_chapter_slowest_first(tmp_path):
    text = schedule.write_record(tmp_path / "book_run_quick.txt", "quick", 2, {"a": (10.0, 18.0), "b": (30.0, 29.0)},
                                 41.0, 0.5)
    rows = [line.split() for line in text.splitlines()[3:]]
    assert rows[0] == ["b", "30", "29"] and rows[1] == ["a", "10", "18"]
    assert rows[2][-2:] == ["40", "47"] and rows[3][3] == "41"
    assert "2 at a time" in text and (tmp_path / "book_run_quick.txt").read_text() == text
    assert "machine speed" not in text
    timed = schedule.write_record(tmp_path / "r.txt", "quick", 2, {"a": (10.0, 18.0)}, 10.0, 0.5, (0.4123, 0.45))
    assert timed.splitlines()[1].endswith("0.412 ms before the run, 0.450 ms after")


def test_reference_kernel_is_a_positive_time_of_the_product():
    ms = schedule.reference_kernel_ms(repeats=20)
    assert 0.0 < ms < 1000.0


def test_time_left_on_several_workers_is_bounded_by_the_longest_chapter():
    last = {"a": 60.0, "b": 120.0, "c": 180.0, "d": None}
    assert schedule.time_left(["a", "b"], last, 2) == "about 2.0 min left by the last runs"        # max(120, 90)
    assert schedule.time_left(["a", "b", "c"], last, 2) == "about 3.0 min left by the last runs"   # max(180, 180)
    assert schedule.time_left(["a", "d"], last, 1).endswith("plus 1 chapter(s) never run at this profile")
    assert schedule.time_left([], last, 2) == "nothing left"
