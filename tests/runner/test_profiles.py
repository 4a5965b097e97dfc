"""The notebook runner: profiles, overrides and their validation (no notebook executed here)."""
import re
from pathlib import Path

import pytest
import yaml

from fedlib.runner import cli, profiles

REPO = Path(__file__).resolve().parents[2]


def test_every_notebook_has_parameters_and_is_in_toc_and_order():
    toc = (REPO / "_toc.yml").read_text()
    order = profiles.notebook_names()
    sources = sorted(p.stem for p in (REPO / "notebooks").glob("*.py"))
    assert sorted(order) == sources
    for name in sources:
        assert profiles.notebook_parameters(name), name
        assert f"book/executed/{name}" in toc, f"{name} missing from _toc.yml"


@pytest.mark.parametrize("profile", ["smoke", "quick", "paper"])
def test_profiles_only_name_existing_parameters(profile):
    for name in profiles.notebook_names():
        params = profiles.resolve_parameters(name, profile)
        assert set(params) <= set(profiles.notebook_parameters(name))


def test_parameter_cell_parsed():
    params = profiles.notebook_parameters("afl_benchmark")
    assert params["num_clients"] == 100 and params["alphas"] == [0.1, 0.05]


def test_overrides_parsed_as_yaml():
    assert profiles.parse_overrides(["alpha=0.05", "seeds=[0, 1]", "n_train=null", "device=cpu"]) == \
        {"alpha": 0.05, "seeds": [0, 1], "n_train": None, "device": "cpu"}


def test_the_readmes_re_execution_examples_pass_the_checks():
    """Every `make run NB=... ARGS="..."` and `python -m fedlib.runner NAME ...` line of the README and of
    the book's reproduce page is a
    command whose parameters the runner accepts (it once showed one that failed inside a cell)."""
    import re
    import shlex

    text = (profiles.REPO / "README.md").read_text() + (profiles.REPO / "book" / "reproduce.md").read_text()
    commands = [(nb, shlex.split(args)) for nb, args in re.findall(r'make run NB=(\w+) ARGS="([^"]*)"', text)]
    commands += [(m.group(1), [a for a in shlex.split(m.group(2)) if "=" in a])
                 for m in re.finditer(r"-m fedlib\.runner (\w+) --profile quick ([^\n#]*)", text)]
    commands = [(nb, args) for nb, args in commands if nb != "all"]
    assert len(commands) >= 2
    for nb, args in commands:
        profiles.resolve_parameters(nb, "quick", profiles.parse_overrides(args))


def test_floats_without_a_dot_are_numbers():
    """YAML 1.1 (PyYAML) reads 1e-6 as a string, so gammas=[1e-6, 1.0] used to be refused as not a number."""
    assert profiles.parse_overrides(["gammas=[1e-6, 1.0]", "a=2E3", "b=-3e-2", "c=12", "d=1_000", "e=e5"]) == \
        {"gammas": [1e-6, 1.0], "a": 2000.0, "b": -0.03, "c": 12, "d": 1000, "e": "e5"}
    params = profiles.resolve_parameters("afl_benchmark", "smoke", profiles.parse_overrides(["gammas=[1e-6, 1.0]"]))
    assert params["gammas"] == [1e-6, 1.0]


def test_override_beats_profile():
    params = profiles.resolve_parameters("afl_benchmark", "smoke", {"num_clients": 6})
    assert params["num_clients"] == 6


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile 'fast'.*smoke"):
        profiles.resolve_parameters("afl_benchmark", "fast")


def test_unknown_parameter_name():
    with pytest.raises(ValueError, match="unknown parameter.*num_client\\b.*allowed"):
        profiles.resolve_parameters("afl_benchmark", "quick", {"num_client": 300})


def test_unknown_notebook():
    with pytest.raises(ValueError, match="unknown notebook"):
        profiles.resolve_parameters("nope", "quick")


def test_malformed_override():
    with pytest.raises(ValueError, match="name=value"):
        profiles.parse_overrides(["alpha"])


def test_cli_refuses_before_work(capsys):
    with pytest.raises(ValueError, match="num_client"):
        cli.main(["afl_benchmark", "--profile", "smoke", "num_client=3"])


def test_environment_yml_agrees_with_pyproject():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    norm = lambda s: re.sub(r"\s+", "", s).lower()
    assert sorted(map(norm, pip)) == sorted(map(norm, wanted))


def test_a_fresh_clone_schedules_the_longest_quick_chapters_first(tmp_path, monkeypatch):
    from fedlib.runner import schedule

    monkeypatch.setattr(profiles, "EXECUTED_DIR", tmp_path)           # nothing executed yet
    names = profiles.notebook_names()
    measured = profiles.measured_durations("quick")
    assert set(measured) == set(names) and all(s > 0 for s in measured.values())
    last = {n: profiles.last_duration(n, "quick") for n in names}
    assert last == measured
    order = schedule.plan(names, profiles.chapter_after(), last)
    assert order[0] == max(measured, key=measured.get)
    assert profiles.last_duration("afl_derivation", "smoke") is None   # none committed for smoke


def test_all_refuses_overrides():
    with pytest.raises(ValueError, match="one notebook"):
        cli.main(["all", "--profile", "smoke", "num_clients=3"])


def test_time_left_comes_from_the_last_runs_at_that_profile(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(profiles, "EXECUTED_DIR", tmp_path)
    for name, prof, secs in [("a", "quick", 120.0), ("b", "smoke", 5.0)]:
        meta = {"metadata": {"papermill": {"parameters": {"profile": prof}, "duration": secs}}}
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(meta))
    (tmp_path / "broken.ipynb").write_text("{not json")
    assert profiles.last_duration("a", "quick") == 120.0
    assert profiles.last_duration("a", "smoke") is None and profiles.last_duration("b", "quick") is None
    assert profiles.last_duration("broken", "quick") is None and profiles.last_duration("none", "quick") is None
    assert cli._estimate(["a", "b"], "quick") == "about 2.0 min left by the last runs, plus 1 chapter(s) never run at this profile"
    assert cli._estimate(["b"], "quick").startswith("no earlier run")


def test_cell_timings_slowest_first_and_cli(tmp_path, monkeypatch, capsys):
    import json

    cells = [{"cell_type": "markdown", "source": "# t", "metadata": {}},
             {"cell_type": "code", "source": "x = 1\ny = 2", "metadata": {"papermill": {"duration": 0.5}}},
             {"cell_type": "code", "source": ["slow()\n", "more()"], "metadata": {"papermill": {"duration": 12.25}}},
             {"cell_type": "code", "source": "never_ran()", "metadata": {}}]
    path = tmp_path / "afl_derivation.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}}))
    assert profiles.cell_timings(path) == [(2, 12.25, "slow()"), (1, 0.5, "x = 1")]
    assert profiles.cell_timings(path, top=1) == [(2, 12.25, "slow()")]
    monkeypatch.setattr(cli, "EXECUTED_DIR", tmp_path)
    assert cli.main(["afl_derivation", "--timings"]) == 0
    out = capsys.readouterr().out
    assert "afl_derivation: 13 s in 2 code cells" in out and "cell   2    12.2 s  slow()" in out


def test_executed_notebook_folds_the_default_parameters_cell():
    import json

    nb = {"cells": [{"cell_type": "code", "source": "a = 1", "metadata": {"tags": ["parameters"]}},
                    {"cell_type": "code", "source": "a = 2", "metadata": {"tags": ["injected-parameters"]}},
                    {"cell_type": "code", "source": "b = a", "metadata": {}}], "metadata": {}}
    out = json.loads(profiles._finish(json.dumps(nb), "quick", {"rounds": 200}))
    assert [c["metadata"]["tags"] for c in out["cells"]] == [["parameters", "hide-input"], ["injected-parameters"], []]
    assert [c["source"] for c in out["cells"]] == ["a = 1", "a = 2", "b = a"]


def test_executed_notebook_hides_claim_registration_but_keeps_the_verdict_box():
    import json

    box = {"output_type": "display_data", "data": {"text/html": "<div>verdict</div>"}, "metadata": {}}
    repr_ = {"output_type": "execute_result", "data": {"text/plain": "{'id': 'x'}"}, "metadata": {}, "execution_count": 1}
    nb = {"cells": [{"cell_type": "code", "source": "claims.register(\n  'x', 'afl')", "metadata": {},
                     "outputs": [box, repr_]},
                    {"cell_type": "code", "source": "df", "metadata": {}, "outputs": [repr_]}], "metadata": {}}
    out = json.loads(profiles._finish(json.dumps(nb), "quick", {}))
    assert out["cells"][0]["metadata"]["tags"] == ["remove-input"] and out["cells"][0]["outputs"] == [box]
    assert out["cells"][1]["metadata"]["tags"] == [] and out["cells"][1]["outputs"] == [repr_]


def test_a_cell_that_writes_prose_shows_the_prose_not_its_code():
    import json

    md = {"output_type": "display_data", "data": {"text/markdown": "AFL leads by $2$ pp.", "text/plain": "<md>"},
          "metadata": {}}
    table = {"output_type": "display_data", "data": {"text/html": "<table></table>"}, "metadata": {}}
    printed = {"output_type": "stream", "name": "stdout", "text": "x"}
    nb = {"cells": [{"cell_type": "code", "source": "display(Markdown(f'...'))", "metadata": {}, "outputs": [md]},
                    {"cell_type": "code", "source": "display(t); display(Markdown(s))", "metadata": {},
                     "outputs": [table, md]},
                    {"cell_type": "code", "source": "print(1); display(Markdown(s))", "metadata": {},
                     "outputs": [printed, md]},
                    {"cell_type": "code", "source": "display(t)", "metadata": {}, "outputs": [table]}],
          "metadata": {}}
    glued = {"output_type": "display_data", "data": {"application/papermill.record/text/markdown": "AFL leads.",
                                                     "application/papermill.record/text/plain": "<md>"},
             "metadata": {"scrapbook": {"name": "lead", "mime_prefix": "application/papermill.record/"}}}
    nb["cells"] += [{"cell_type": "code", "source": "glue('lead', Markdown(s), display=False)", "metadata": {},
                     "outputs": [glued]},
                    {"cell_type": "code", "source": "display(t); glue('lead', Markdown(s), display=False)",
                     "metadata": {}, "outputs": [table, glued]},
                    {"cell_type": "code", "source": "plt.show(); glue('gain', 0.12, display=False)", "metadata": {},
                     "outputs": [table, {**glued, "data": {"application/papermill.record/text/plain": "0.12"}}]}]
    out = json.loads(profiles._finish(json.dumps(nb), "quick", {}))
    assert [c["metadata"]["tags"] for c in out["cells"]] == [["remove-input"], ["hide-input"], ["hide-input"], [],
                                                             ["remove-input"], ["hide-input"], ["hide-input"]]


def test_executed_notebook_records_its_profile_and_overrides_for_the_ledger(tmp_path):
    """Each claim record collected from a chapter carries the profile and overrides it ran with, so a
    chapter re-executed with new parameters says so on the ledger."""
    import json

    from fedlib.evaluation import claims

    rec = claims.make_record("x-claim", "afl", "A claim.", holds=True, evidence="measured 1")
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {},
                     "outputs": [{"output_type": "display_data", "metadata": {claims.METADATA_KEY: rec}}]}],
          "metadata": {}}
    path = tmp_path / "afl_benchmark.ipynb"
    path.write_text(profiles._finish(json.dumps(nb), "quick", {"rounds": 200, "seeds": [0, 1]}))
    (got,) = claims.collect(tmp_path)
    assert got["profile"] == "quick" and got["overrides"] == {"rounds": 200, "seeds": [0, 1]}
    assert claims.run_label(got) == "quick; rounds=200; seeds=[0, 1]"
    assert "quick; rounds=200" in claims.ledger_markdown([got])


def test_embedding_chapters_stop_idle_openmp_threads_from_spinning_before_numpy_loads():
    """Chapters that run t-SNE / UMAP (a ``methods`` parameter) set OMP_WAIT_POLICY=PASSIVE before
    numpy / sklearn / numba load: otherwise UMAP's idle threads spin and slow the t-SNE runs after it
    (fedtsne_privacy lacked it)."""
    chapters = [n for n in profiles.notebook_names() if "methods" in profiles.notebook_parameters(n)
                and n.startswith("fedtsne")]
    assert set(chapters) >= {"fedtsne_benchmark", "fedtsne_privacy", "fedtsne_beyond"}
    for name in chapters:
        lines = (profiles.NOTEBOOK_DIR / f"{name}.py").read_text().splitlines()
        policy = next((i for i, l in enumerate(lines) if 'os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")' in l), None)
        first_numpy = next(i for i, l in enumerate(lines) if l.startswith(("import numpy", "from numpy", "import sklearn",
                                                                           "from sklearn")))
        assert policy is not None and policy < first_numpy, name
