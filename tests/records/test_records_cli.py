"""``python -m fedlib.records``: each recorded comparison runs at a tiny size, and the committed
records are the ones the chapters read."""
import numpy as np

from fedlib.core.paths import RECORD_DIR
from fedlib.evaluation.records import FIELDS, load_record
from fedlib.records.__main__ import RECORDS, main, parameters
from fedlib.runner import specs


def test_afl_record_runs_small_and_its_curves_end_at_the_final_accuracy(tmp_path, capsys):
    assert main(["afl_converged", "--profile", "smoke", "--out", str(tmp_path), "rounds=3"]) == 0
    rec = load_record("afl_converged", folder=tmp_path)
    assert rec["command"] == "python -m fedlib.records afl_converged --profile smoke rounds=3"
    p, res = rec["parameters"], rec["results"]
    assert p["rounds"] == 3 and p["profile"] == "smoke"
    for setting, finals in res["final"].items():
        assert set(finals) == set(p["methods"]) and 0 < res["afl"][setting] <= 1
        for m, accs in finals.items():
            curves = res["curves"][setting][m]
            assert len(accs) == len(p["seeds"]) and all(len(c) == 3 for c in curves)
            assert np.allclose([c[-1] for c in curves], accs)   # the curve is the run that gave the final accuracy


def test_a_bad_parameter_is_refused_before_any_work(tmp_path, capsys):
    assert main(["afl_converged", "--profile", "smoke", "--out", str(tmp_path), "rounds=0"]) == 2
    assert "rounds" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_committed_records_load_and_match_their_chapters_parameters():
    for path in sorted(RECORD_DIR.glob("*.json")):
        rec = load_record(path.stem)
        assert set(FIELDS) <= set(rec) and rec["name"] in RECORDS, path
        module = RECORDS[rec["name"]]
        specs.check(module.CHAPTER, rec["parameters"])   # a record's parameters are a valid run of its chapter
        assert rec["command"].startswith(f"python -m fedlib.records {rec['name']}")
        # `make records` (the record's defaults) reproduces the committed run's budget and seeds
        assert {k: rec["parameters"][k] for k in module.DEFAULTS} == module.DEFAULTS, path
        own = getattr(module, "OWN", {})
        assert {k: rec["parameters"][k] for k in own} == own, path
    assert parameters("afl_converged", "quick", {})["rounds"] == RECORDS["afl_converged"].DEFAULTS["rounds"]


def test_refed_record_runs_small_with_every_seed_and_the_last_tasks_curves(tmp_path):
    assert main(["refed_resolved", "--profile", "smoke", "--out", str(tmp_path), "rounds=2", "rounds_domain=3",
                 "seeds=[0, 1]", "more_seeds={class: [5]}"]) == 0
    rec = load_record("refed_resolved", folder=tmp_path)
    res = rec["results"]
    assert res["seeds"] == {"class": [0, 1, 5], "domain": [0, 1]} and rec["parameters"]["more_seeds"] == {"class": [5]}
    assert set(res["A_T"]) == {"class", "domain"} == set(res["curves"])
    for kind, rounds in (("class", 2), ("domain", 3)):
        n = len(res["seeds"][kind])
        for m in RECORDS["refed_resolved"].METHODS:
            assert len(res["A_T"][kind][m]) == n and all(0 <= a <= 100 for a in res["A_T"][kind][m])
            assert [len(c) for c in res["curves"][kind][m]] == [rounds] * n


def test_refed_records_own_seeds_are_checked_before_any_work(tmp_path, capsys):
    for bad in ("more_seeds={class: [1]}", "more_seeds={tasks: [9]}", "more_seeds={class: [9, 9]}",
                "more_seeds={class: 3}"):
        assert main(["refed_resolved", "--profile", "smoke", "--out", str(tmp_path), "seeds=[0, 1]", bad]) == 2, bad
        assert "more_seeds" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_pim_record_runs_small_and_equals_the_chapters_own_runs(tmp_path):
    """The record's runs are the chapter's (the same scenario from beyond_setup, the same seeds): its
    A_T per seed equals run_rules' at the same parameters, and each curve has one point per round."""
    from fedlib.refed.beyond import beyond_setup, run_rules

    assert main(["refed_pim", "--profile", "smoke", "--out", str(tmp_path), "rounds=2", "seeds=[0, 1]",
                 "pim_epochs=2"]) == 0
    rec = load_record("refed_pim", folder=tmp_path)
    p, res = rec["parameters"], rec["results"]
    scenario, settings = beyond_setup(p)
    rows = run_rules(scenario, ["grand"], [0, 1], settings=settings, lam_local=p["lam_local"], workers=1,
                     progress=False)
    assert np.allclose(res["A_T"]["grand"], rows.sort_values("seed")["A_T"])
    for rule in RECORDS["refed_pim"].RULES:
        assert len(res["A_T"][rule]) == 2 and [len(c) for c in res["curves"][rule]] == [2, 2]


def test_a_split_run_equals_the_whole_run_and_names_its_parts(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    args = ["afl_converged", "--profile", "smoke", "rounds=2", "workers=1"]
    assert main([*args, "--out", str(whole)]) == 0
    assert main([*args, "--split", "--out", str(split)]) == 0
    one, parts = load_record("afl_converged", folder=whole), load_record("afl_converged", folder=split)
    assert [p.name for p in split.iterdir()] == ["afl_converged.json"]   # the parts' folder is gone
    assert parts["command"].endswith("--split") and parts["parameters"] == one["parameters"]
    methods = one["parameters"]["methods"]
    assert len(parts["parts"]) == len(methods) and all(f'methods=["{m}"]' in c for m, c in zip(methods, parts["parts"]))
    for key in ("afl", "final", "curves"):   # each run is seeded by its own configuration
        assert parts["results"][key] == one["results"][key], key


def test_merge_refuses_parts_of_another_run_or_that_leave_a_method_out(tmp_path, capsys):
    args = ["afl_converged", "--profile", "smoke", "rounds=2", "workers=1"]
    assert main([*args, "methods=[fedavg]", "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "methods=[moon]", "resample_methods=[]", "lr=0.02", "--out", str(tmp_path / "b")]) == 0
    a, b = (str(tmp_path / x / "afl_converged.json") for x in "ab")
    assert main([*args, "--merge", a, "--out", str(tmp_path / "m")]) == 2
    assert "leave out moon" in capsys.readouterr().err
    assert main([*args, "--merge", a, b, "--out", str(tmp_path / "m")]) == 2
    assert "other lr" in capsys.readouterr().err and not (tmp_path / "m").exists()
    assert main(["refed_resolved", "--profile", "smoke", "--split", "--out", str(tmp_path / "r")]) == 2
    assert "not run in parts" in capsys.readouterr().err


def test_a_record_keeps_the_commit_it_started_from(tmp_path, monkeypatch):
    """A long run outlives commits made meanwhile: the record names the code that ran, the HEAD at
    its start, not the HEAD when it is written."""
    import fedlib.evaluation.records as records_module
    import fedlib.records.__main__ as cli

    monkeypatch.setattr(cli, "records_commit", lambda: "start00")
    monkeypatch.setattr(records_module, "commit", lambda: "later00")
    assert main(["afl_converged", "--profile", "smoke", "--out", str(tmp_path), "rounds=1", "workers=1"]) == 0
    assert load_record("afl_converged", folder=tmp_path)["commit"] == "start00"
