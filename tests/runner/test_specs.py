"""The typed parameter specifications: framework, coverage of every chapter, runner integration,
and notebooks free of checking code and helper definitions."""
import re

import pytest

from fedlib.runner import profiles, specs
from fedlib.core.paths import NOTEBOOK_DIR
from fedlib.core.specs import NULL, Choice, Dict, Int, List, Real, Seeds, Spec

CHAPTERS = profiles.notebook_names()


def test_types_accept_and_reject_naming_the_parameter():
    assert Int(1)("k", 3) == 3
    for bad in (0, 2.5, True, "3"):
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            Int(1)("k", bad)
    assert Real(0.0)("beta", 0.5) == 0.5
    with pytest.raises(ValueError, match="beta must be a finite number > 0.0"):
        Real(0.0)("beta", 0.0)
    with pytest.raises(ValueError, match=r"seeds must not repeat"):
        Seeds()("seeds", [0, 0])
    with pytest.raises(ValueError, match=r"alphas\[1\] must be a finite number > 0"):
        List(Real(0.0))("alphas", [0.1, -1.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        List(Int(2), increasing=True)("grid", [4, 3])
    opt = Int(1) | NULL
    assert opt("max_points", None) is None and opt("max_points", 5) == 5
    with pytest.raises(ValueError, match="max_points must be an integer >= 1 or null, got 0"):
        opt("max_points", 0)
    with pytest.raises(ValueError, match=r"unknown dataset 'x'; allowed: a, b"):
        Choice(["a", "b"])("dataset", "x")
    with pytest.raises(ValueError, match=r"subsets\['a'\]"):
        Dict(Choice(["a"]), List(Int(1)))("subsets", {"a": [0]})


def test_spec_rules_and_unknown_names():
    def rule(v):
        if v["n_test"] > v["n_train"]:
            raise ValueError("n_test must be <= n_train")

    s = Spec({"n_train": Int(1), "n_test": Int(1)}, rules=[rule])
    assert s.check({"n_train": 10, "n_test": 5}) == {"n_train": 10, "n_test": 5}
    with pytest.raises(ValueError, match="n_test must be <= n_train"):
        s.check({"n_train": 1, "n_test": 5})
    with pytest.raises(ValueError, match="unknown parameter.*typo"):
        s.check({"n_train": 1, "n_test": 1, "typo": 3})


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_spec_for_exactly_its_parameters(chapter):
    declared = set(specs.spec(chapter).params) | set(specs.COMMON)
    assert set(profiles.notebook_parameters(chapter)) == declared


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_defaults_and_every_profile_pass(chapter):
    defaults = profiles.notebook_parameters(chapter)
    specs.check(chapter, defaults)
    for profile in profiles.load_profiles():
        profiles.resolve_parameters(chapter, profile)


def test_runner_rejects_a_bad_typed_value_before_running(monkeypatch):
    ran = []
    monkeypatch.setattr("papermill.execute_notebook", lambda *a, **k: ran.append(a))
    name = CHAPTERS[0]
    some_int = next(k for k, v in profiles.notebook_parameters(name).items()
                    if isinstance(v, int) and not isinstance(v, bool))
    with pytest.raises(ValueError, match=some_int):
        profiles.run_notebook(name, "smoke", {some_int: "many"})
    assert not ran


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebooks_hold_no_checking_code_and_no_helpers(chapter):
    source = (NOTEBOOK_DIR / f"{chapter}.py").read_text()
    assert source.count(f'specs.check("{chapter}", globals())') == 1
    assert "raise ValueError" not in source
    assert not re.search(r"^(def|class) ", source, re.M), "reusable definitions belong in fedlib"
