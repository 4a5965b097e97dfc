"""Coursework and textbook apparatus of the book (fast: no chapter is executed).

* every self-check of `fedlib.evaluation.selfcheck` says "as predicted" on a case that follows the
  prediction and "NOT as predicted" on one that does not; the verdict is printed on its own first
  line and no printed line is wider than `selfcheck.WIDTH`;
* a tiny book of two pages with exercises, solutions and theorems, built with jupyter-book in normal
  and in student mode (`fedlib.runner.student`, what `make html-student` runs): the solution is in
  the first and absent from the second, the exercise in both; exercises are numbered per page and a
  theorem with `:class: number-3-1` reads "Theorem 3.1" (`fedlib.runner.numbering`);
* every `{eq}`, `{cite}`, `{term}`, `{ref}`/`{numref}`/`{prf:ref}` target used in the notebooks and
  prose pages exists, parsed from the sources;
* every chapter cites a paper, and every derivation chapter has a labelled equation (chapters
  whose notebook does not exist yet are skipped);
* every exercise of every chapter has a title and a `{solution}` block (none in a plain dropdown);
  every exercise of a chapter that reproduces a paper has a self-check cell;
* the coursework page's index lists every exercise, in order, with its number, title, goal and run
  time (checked against `notebooks/profiles.yml`);
* a statement quoted from a paper (`{prf:...}` opening with its citation) carries the paper's number
  (`:class: number-...`), and no title says "the paper's Lemma N" beside another number.
"""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedlib.afl import selfcheck as afl_selfcheck
from fedlib.evaluation import selfcheck
from fedlib.fedtsne import selfcheck as fedtsne_selfcheck
from fedlib.refed import selfcheck as refed_selfcheck
from fedlib.stsa import selfcheck as stsa_selfcheck
from fedlib.runner import numbering, student
from fedlib.runner.profiles import measured_durations

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
CHAPTERS = ["afl_derivation", "afl_benchmark", "afl_beyond", "stsa_derivation", "stsa_benchmark", "stsa_beyond",
            "fedtsne_derivation", "fedtsne_benchmark", "fedtsne_privacy", "fedspeclust", "fedtsne_beyond",
            "refed_theory", "refed_benchmark", "refed_beyond"]
# chapters that derive the paper's results: they must label their equations
DERIVATIONS = ["afl_derivation", "stsa_derivation", "fedtsne_derivation", "fedspeclust", "refed_theory",
               "afl_beyond", "stsa_beyond", "fedtsne_beyond", "refed_beyond"]


# ---------------------------------------------------------------------------------------------
# self-checks: one case where the prediction holds, one where it does not
# ---------------------------------------------------------------------------------------------
def _flat(v) -> str:
    """A verdict's text on one line (the printed text is wrapped at selfcheck.WIDTH columns)."""
    return " ".join(str(v).split())


def test_verdict_prints_the_outcome_first_and_wraps():
    yes = selfcheck.Verdict("ex", "p", "measured m", True)
    no = selfcheck.Verdict("ex", "p", "measured m", False)
    assert str(yes).splitlines()[0] == "as predicted" and bool(yes)
    assert str(no).splitlines()[0].startswith("NOT as predicted") and not bool(no)
    assert str(yes).splitlines()[1:] == ["  ex: p; measured m"]
    long = selfcheck.Verdict("AFL benchmark, ex. clients", "AFL's accuracy is the same in every run " * 6,
                             "measured max |acc - centralized| = 0.0e+00 <= 1e-12 over 3 runs", False)
    lines = str(long).splitlines()
    assert lines[0].startswith("NOT as predicted") and len(lines) > 2
    assert all(len(line) <= selfcheck.WIDTH for line in lines), [len(line) for line in lines]
    assert _flat(long).endswith("over 3 runs") and "AFL benchmark, ex. clients:" in _flat(long)
    pending = selfcheck.Verdict("ex", "fill in `my_x`", "it will be compared with y", None)
    assert "predicted" not in str(pending) and not bool(pending)


def test_afl_printed_sign():
    good = pd.DataFrame({"max rel. error": [3e-13, 2.4]})
    assert afl_selfcheck.afl_printed_sign(good)
    assert not afl_selfcheck.afl_printed_sign(pd.DataFrame({"max rel. error": [3e-13, 1e-9]}))
    assert not afl_selfcheck.afl_printed_sign(pd.DataFrame({"max rel. error": [1e-3, 2.4]}))
    with pytest.raises(ValueError, match="max rel. error"):
        afl_selfcheck.afl_printed_sign(pd.DataFrame({"error": [0.0, 1.0]}))


def test_afl_table1_break():
    k = pd.Index([2, 10, 20, 50], name="K")
    table = pd.DataFrame({"N_k": [5000, 1000, 500, 200], "ΔW w/o RI (ours)": [1e-9, 1e-9, 40.0, 90.0]}, index=k)
    v = afl_selfcheck.afl_table1_break(table, 512)
    assert v and "first at K = 20" in _flat(v)
    assert not afl_selfcheck.afl_table1_break(table, 100)        # predicts no break, but K=20 and 50 broke
    with pytest.raises(ValueError, match="dim"):
        afl_selfcheck.afl_table1_break(table, 0)


def test_afl_gamma_conditioning():
    rows = [("float64", g, s, e) for g, s, e in [(1e-6, "one_solve", 1e-12), (1e-6, "pairwise", 1e-2),
                                                 (1.0, "one_solve", 1e-12), (1.0, "pairwise", 1e-12)]]
    fp = pd.DataFrame(rows, columns=["dtype", "gamma", "server", "max rel. error"])
    assert afl_selfcheck.afl_gamma_conditioning(fp, 1e-10)
    worse = fp.assign(**{"max rel. error": [1e-6, 1e-2, 1e-12, 1e-12]})   # one-solve outside its tolerance
    assert not afl_selfcheck.afl_gamma_conditioning(worse, 1e-10)


def test_afl_accuracy_invariance():
    assert afl_selfcheck.afl_accuracy_invariance([0.81, 0.81, 0.81], 0.81)
    assert not afl_selfcheck.afl_accuracy_invariance([0.81, 0.8102], 0.81)
    with pytest.raises(ValueError, match="at least one"):
        afl_selfcheck.afl_accuracy_invariance([], 0.8)


def test_stsa_checks():
    spatial = pd.DataFrame({"rel. err. W": [1e-13, 3e-12], "same predictions": [True, True]})
    assert stsa_selfcheck.stsa_partition_invariance(spatial, 1e-10)
    assert not stsa_selfcheck.stsa_partition_invariance(spatial.assign(**{"same predictions": [True, False]}), 1e-10)
    # break-even from (M+1) c_t K_D < (M + c_t) M: 1260 * 1250 / (1251 * 10) = 125.9
    assert stsa_selfcheck.stsa_break_even(125, 1250, 10)
    assert not stsa_selfcheck.stsa_break_even(126, 1250, 10)
    assert stsa_selfcheck.stsa_break_even(None, 1250, 10).as_predicted is None
    assert "125" not in _flat(stsa_selfcheck.stsa_break_even(None, 1250, 10)).replace("1250", "")
    assert stsa_selfcheck.stsa_rank({"rank": 40, "bound": 50}, 1250)
    assert not stsa_selfcheck.stsa_rank({"rank": 1250, "bound": 2000}, 1250)


def test_fedtsne_exact_landmarks():
    rng = np.random.default_rng(0)
    x = np.c_[rng.normal(size=(200, 6)), np.zeros((200, 4))]       # 10 features, affine rank 6
    rows = [("FedDL IID", n, e) for n, e in [(4, 0.3), (6, 0.1), (8, 1e-9), (20, 1e-10)]]
    sweep = pd.DataFrame(rows + [("uniform sample (oracle)", 4, 0.2)], columns=["landmarks", "n_y", "rel. error of D_hat"])
    v = fedtsne_selfcheck.fedtsne_exact_landmarks(sweep, x)
    assert v and "r + 2 = 8" in _flat(v)
    bad = sweep.copy()
    bad.loc[2, "rel. error of D_hat"] = 1e-2                    # n_y = 8 = r + 2 but not exact
    assert not fedtsne_selfcheck.fedtsne_exact_landmarks(bad, x)


def test_fedtsne_accountants():
    assert fedtsne_selfcheck.fedtsne_accountants(1.3, 1.1)
    assert fedtsne_selfcheck.fedtsne_accountants(None, None).as_predicted is None
    assert not fedtsne_selfcheck.fedtsne_accountants(0.9, 1.1)
    with pytest.raises(ValueError, match="positive"):
        fedtsne_selfcheck.fedtsne_accountants(0.0, 1.0)


def test_refed_checks():
    assert refed_selfcheck.refed_mean_lambda(1 / 1.0005, 0.8, 500)
    assert not refed_selfcheck.refed_mean_lambda(0.8, 0.8, 500)
    none = refed_selfcheck.refed_mean_lambda(None, 0.8, 500)
    assert none.as_predicted is None and "my_lambda" in _flat(none) and "0.9995" not in _flat(none)
    fin = pd.DataFrame({"s": [1, 1, 1, 5, 5], "lambda": [0.2, 0.5, 0.8, 0.2, 0.8], "dist": [0.3, 0.3, 0.3, 0.1, 0.5]})
    assert refed_selfcheck.refed_one_step_flat(fin)
    assert not refed_selfcheck.refed_one_step_flat(fin.assign(dist=[0.3, 0.31, 0.3, 0.1, 0.5]))


# ---------------------------------------------------------------------------------------------
# student build of a tiny book
# ---------------------------------------------------------------------------------------------
TINY_PAGE = """# Tiny

$$ a = b $$ (tiny-eq)

```{prf:theorem} A law
:label: tiny-thm

THEOREMTEXT
```

```{prf:theorem} A paper's law
:label: tiny-paper-thm
:class: number-3-1

PAPERTHEOREM
```

```{exercise} A question
:label: tiny-ex

EXERCISETEXT, see {eq}`tiny-eq`, {prf:ref}`tiny-thm` and {prf:ref}`tiny-paper-thm`.
```

````{solution} tiny-ex
:class: dropdown

SOLUTIONTEXT
````

```{exercise} Another question
:label: tiny-ex-2

SECONDTEXT
```

See {numref}`tiny-ex`.
"""

TINY_PAGE_2 = """# Second

```{exercise} A question on the second page
:label: tiny-two-ex

PAGETWOTEXT
```

````{solution} tiny-two-ex
:class: dropdown

SOLUTIONTWO
````

See {numref}`tiny-ex-2`.
"""


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_student_build_removes_solutions_and_keeps_exercises(tmp_path):
    cfg = yaml.safe_load((REPO / "_config.yml").read_text())
    extensions = cfg["sphinx"]["extra_extensions"]
    assert "sphinx_exercise" in extensions and "sphinx_proof" in extensions
    assert "fedlib.runner.numbering" in extensions
    tiny = {"title": "tiny", "only_build_toc_files": True, "execute": {"execute_notebooks": "off"},
            "parse": cfg["parse"],
            "sphinx": {"extra_extensions": ["sphinx_exercise", "sphinx_proof", "fedlib.runner.numbering"]}}
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(tiny))
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: second\n")
    (tmp_path / "intro.md").write_text(TINY_PAGE)
    (tmp_path / "second.md").write_text(TINY_PAGE_2)
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(tmp_path), "-W", "--keep-going"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    normal = (tmp_path / "_build" / "html" / "intro.html").read_text()
    second = _text((tmp_path / "_build" / "html" / "second.html").read_text())
    out = student.build(tmp_path)
    assert out == tmp_path / "_build" / "student" / "html"
    students = (out / "intro.html").read_text()
    for html in (normal, students):
        assert "EXERCISETEXT" in html and "THEOREMTEXT" in html and "Exercise 1" in html
    assert "SOLUTIONTEXT" in normal
    assert "SOLUTIONTEXT" not in students and "SOLUTIONTWO" not in (out / "second.html").read_text()
    # numbered per page: the second page starts again at 1; its reference to the first page's
    # second exercise reads "Exercise 2"
    first = _text(normal)
    assert "Exercise 1 (A question)" in first and "Exercise 2 (Another question)" in first
    assert "Exercise 1 (A question on the second page)" in second and "Exercise 3" not in second
    assert "See Exercise 2" in second and "Solution to Exercise 1 (A question on the second page)" in second
    # a fixed number: the paper's Theorem 3.1 reads so in its title and in a {prf:ref}; the other theorem is 1
    assert "Theorem 3.1 (A paper" in first and "Theorem 1 (A law)" in first
    assert "Theorem 1 and Theorem 3.1" in first


def test_page_numbers():
    assert numbering.fixed_number(["proof", "number-3-1"]) == (3, 1)
    assert numbering.fixed_number(["number-2"]) == (2,) and numbering.fixed_number(["numbered"]) is None
    ids = ["a", "b", "c", "d"]
    assert numbering.page_numbers(ids, {}) == {"a": (1,), "b": (2,), "c": (3,), "d": (4,)}
    # b fixed at 1: the automatic numbers skip it; a fixed 3.1 does not take 3
    assert numbering.page_numbers(ids, {"b": (1,), "d": (3, 1)}) == {"a": (2,), "b": (1,), "c": (3,), "d": (3, 1)}


def test_student_config_needs_sphinx_exercise(tmp_path):
    (tmp_path / "c.yml").write_text(yaml.safe_dump({"sphinx": {"extra_extensions": []}}))
    with pytest.raises(ValueError, match="sphinx_exercise"):
        student.student_config(tmp_path / "c.yml", tmp_path / "out.yml")
    out = student.student_config(REPO / "_config.yml", tmp_path / "student.yml")
    assert yaml.safe_load(out.read_text())["sphinx"]["config"]["hide_solutions"] is True


def test_makefile_has_the_student_target():
    assert re.search(r"^html-student:", (REPO / "Makefile").read_text(), re.M)


# ---------------------------------------------------------------------------------------------
# references in the sources resolve
# ---------------------------------------------------------------------------------------------
def _markdown(path: Path) -> str:
    """The markdown text of a page: a .md file, or the markdown cells of a jupytext percent notebook."""
    text = path.read_text()
    if path.suffix == ".md":
        return text
    cells, md = [], False
    for line in text.splitlines():
        if line.startswith("# %%"):
            md = "[markdown]" in line
            continue
        if md:
            cells.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return "\n".join(cells)


def _sources() -> dict[str, str]:
    pages = sorted(NOTEBOOKS.glob("*.py")) + sorted((REPO / "book").glob("*.md"))
    return {p.name: _markdown(p) for p in pages}


def _roles(text: str, role: str) -> list[str]:
    """Targets of {role}`...` (the part in <...> when the role has an explicit title)."""
    out = []
    for body in re.findall(r"\{" + re.escape(role) + r"\}`([^`]+)`", text):
        m = re.search(r"<([^>]+)>\s*$", body)
        out.append((m.group(1) if m else body).strip())
    return out


def _bib_keys() -> set[str]:
    return set(re.findall(r"@\w+\s*\{\s*([^,\s]+)\s*,", (REPO / "book" / "references.bib").read_text()))


def _labels(texts) -> tuple[set[str], set[str]]:
    """(equation labels, other labels: `(x)=` targets and `:label:` options) in the sources."""
    eqs, others = set(), set()
    for text in texts:
        eqs |= set(re.findall(r"\$\$\s*\(([\w:.-]+)\)\s*$", text, re.M))
        others |= set(re.findall(r"^\s*\(([\w:.-]+)\)=\s*$", text, re.M))
        others |= set(re.findall(r"^\s*:label:\s*([\w:.-]+)\s*$", text, re.M))
    return eqs, others


def _glossary_terms() -> set[str]:
    text = (REPO / "book" / "glossary.md").read_text()
    block = re.search(r"```\{glossary\}\n(.*?)\n```", text, re.S)
    assert block, "book/glossary.md must hold a {glossary} directive"
    return {line.strip().lower() for line in block.group(1).splitlines()
            if line.strip() and not line.startswith((" ", "\t", ":"))}


def test_every_reference_in_the_sources_resolves():
    sources = _sources()
    eqs, others = _labels(sources.values())
    keys, terms = _bib_keys(), _glossary_terms()
    problems = []
    for name, text in sources.items():
        problems += [f"{name}: {{eq}}`{t}`" for t in _roles(text, "eq") if t not in eqs]
        problems += [f"{name}: {{cite}}`{k}`" for r in ("cite", "cite:p", "cite:t") for t in _roles(text, r)
                     for k in t.split(",") if k.strip() not in keys]
        problems += [f"{name}: {{term}}`{t}`" for t in _roles(text, "term") if t.lower() not in terms]
        problems += [f"{name}: {{{r}}}`{t}`" for r in ("ref", "numref", "prf:ref") for t in _roles(text, r)
                     if t not in others]
    assert not problems, "unresolved targets: " + "; ".join(problems)


def test_labels_are_unique():
    seen: dict[str, str] = {}
    dup = []
    for name, text in _sources().items():
        eqs, others = _labels([text])
        for label in eqs | others:
            if label in seen:
                dup.append(f"{label} ({seen[label]}, {name})")
            seen[label] = name
    assert not dup, dup


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_cites_and_labels_equations(chapter):
    path = NOTEBOOKS / f"{chapter}.py"
    if not path.exists():
        pytest.skip(f"{path.name} does not exist yet")
    text = _markdown(path)
    assert any(_roles(text, r) for r in ("cite", "cite:p", "cite:t")), f"{chapter} cites nothing"
    if chapter in DERIVATIONS:
        assert _labels([text])[0], f"{chapter} has no labelled equation"


def test_glossary_is_in_the_toc_and_used():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    first = toc["parts"][0]
    assert first["caption"] == "Using this book"
    assert "book/glossary" in [c["file"] for c in first["chapters"]]
    used = {t.lower() for text in _sources().values() for t in _roles(text, "term")}
    assert len(used) >= 5, used


# ---------------------------------------------------------------------------------------------
# coursework: exercises with solutions and self-checks, at least two per paper
# ---------------------------------------------------------------------------------------------
def _exercises(text: str) -> list[tuple[str, str]]:
    """(title, label) of every {exercise} of a page's markdown, in order (title "" when it has none)."""
    return [(t.strip(), lab) for t, lab in re.findall(r"```\{exercise\}([^\n]*)\n:label:\s*(\S+)", text)]


def _exercise_labels(text: str) -> list[str]:
    return [label for _, label in _exercises(text)]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercises_have_titles_and_solutions(chapter):
    """Every chapter, the beyond-the-paper ones included: exercises with a title, each solved in a
    {solution} block (what the student build removes), no solution in a plain admonition."""
    text = _markdown(NOTEBOOKS / f"{chapter}.py")
    exercises = _exercises(text)
    assert exercises, f"{chapter} has no {{exercise}}"
    assert all(title for title, _ in exercises), f"{chapter}: exercises without a title: {exercises}"
    labels = [label for _, label in exercises]
    solved = re.findall(r"`\{solution\}\s+(\S+)", text)
    assert set(labels) <= set(solved), f"{chapter}: exercises without a solution: {set(labels) - set(solved)}"
    assert set(solved) <= set(labels), f"{chapter}: solutions of no exercise on the page: {set(solved) - set(labels)}"
    assert not re.search(r"\{admonition\}[^\n]*[Ss]olution", text), \
        f"{chapter}: solutions must be {{solution}} blocks (removed from the student build), not admonitions"


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if not c.endswith("_beyond")])
def test_paper_chapters_have_selfchecks(chapter):
    assert "selfcheck." in (NOTEBOOKS / f"{chapter}.py").read_text(), f"{chapter} has no self-check cell"


def test_at_least_two_selfchecked_exercises_per_paper():
    for paper in ["afl", "stsa", "fedtsne", "refed"]:
        files = list(NOTEBOOKS.glob(f"{paper}_*.py")) + ([NOTEBOOKS / "fedspeclust.py"] if paper == "fedtsne" else [])
        # calls in code (not in markdown, whose lines start with '#')
        calls = sum(len(re.findall(r"^[^#\n]*\bselfcheck\.\w+\(", p.read_text(), re.M)) for p in files)
        assert calls >= 2, f"{paper}: {calls} self-check cells"


INDEX_ROW = re.compile(r"^\| \{doc\}`(?P<chapter>[^`<]+?) <executed/(?P<nb>\w+)>` \| Ex\. (?P<n>\d+): "
                       r"\{ref\}`(?P<title>[^`<]+?) <(?P<label>[^>]+)>` \| (?P<goal>[^|]+) \| (?P<time>[^|]+) \| "
                       r"(?P<check>[^|]+) \|$", re.M)


def _minutes(seconds: float) -> int:
    return max(1, math.floor(seconds / 60 + 0.5))


def test_coursework_page_lists_every_exercise():
    """The index of book/coursework.md: one row per exercise of every chapter, in the book's order,
    with the chapter, the exercise's number in its chapter, its title (as in the directive) and label,
    a one-line goal, the run time (the chapter's measured quick duration, or "none") and the self-check
    the cell under it calls (none for the beyond-the-paper chapters)."""
    page = (REPO / "book" / "coursework.md").read_text()
    assert "make html-student" in page
    rows = [m.groupdict() for m in INDEX_ROW.finditer(page)]
    expected = [(chapter, str(n), title, label) for chapter in CHAPTERS
                for n, (title, label) in enumerate(_exercises(_markdown(NOTEBOOKS / f"{chapter}.py")), 1)]
    assert [(r["nb"], r["n"], r["title"], r["label"]) for r in rows] == expected
    durations = measured_durations("quick")
    for r in rows:
        chapter, time, check = r["nb"], r["time"].strip(), r["check"].strip()
        assert 10 < len(r["goal"].strip()) < 160, r
        minutes = re.match(r"~(\d+) min", time)
        assert minutes or time.startswith("none"), r
        if minutes:
            assert int(minutes.group(1)) == _minutes(durations[chapter]), (r, durations[chapter])
        src = (NOTEBOOKS / f"{chapter}.py").read_text()
        if chapter.endswith("_beyond"):
            assert check.startswith("none"), r
        else:
            fn = re.search(r"`(\w+)`", check)
            assert fn and re.search(rf"^[^#\n]*\bselfcheck\.{fn.group(1)}\(", src, re.M), r


# a statement quoted from a paper keeps the paper's number (fedlib.runner.numbering's `number-...` class)
PAPER_NUMBERS = {"afl-thm-aa": "1", "afl-thm-ri": "2", "stsa-prop-unbiased": "3-1", "refed-lemma-1": "1",
                 "refed-thm-3-1": "3-1"}
PRF = re.compile(r"```\{prf:(?P<kind>\w+)\}(?P<title>[^\n]*)\n(?P<options>(?::[^\n]*\n)*)\s*(?P<body>[^\n]*)")


def test_paper_statements_carry_the_papers_numbers():
    found = {}
    for name, text in _sources().items():
        for m in PRF.finditer(text):
            if m["kind"] == "proof":
                continue
            label = re.search(r":label:\s*(\S+)", m["options"])
            fixed = re.search(r":class:[^\n]*\bnumber-([\d-]+)", m["options"])
            where = f"{name}: {m['kind']} {label.group(1) if label else m['title']}"
            assert not re.search(r"paper's (Lemma|Theorem|Prop)", m["title"], re.I), \
                f"{where}: the title names the paper's number; fix the number instead (:class: number-N)"
            if m["body"].lstrip().startswith("{cite"):        # quoted from a paper
                assert fixed, f"{where} quotes a paper but has no :class: number-... (the paper's number)"
            if label and fixed:
                found[label.group(1)] = fixed.group(1)
    assert found == PAPER_NUMBERS


def test_later_selfchecks():
    assert stsa_selfcheck.stsa_beta_invariance(pd.Series([0.0, 0.0]), 0.01)
    assert not stsa_selfcheck.stsa_beta_invariance(pd.Series([0.0, 0.4]), 0.01)
    quality = pd.DataFrame({"estimate": ["FedDL landmarks", "FedDL landmarks", "FedDL landmarks, plain"],
                            "n_y": [10, 70, 70], "D-hat rel. error": [0.2, 1e-9, 0.05]})
    assert fedtsne_selfcheck.fedtsne_plain_vs_squared(quality, 64)
    assert not fedtsne_selfcheck.fedtsne_plain_vs_squared(quality.assign(**{"D-hat rel. error": [0.2, 1e-9, 1e-12]}), 64)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 5))
    flat = x.copy()
    flat[:, 4] = x[:, 4].mean()                              # projection on a 4-dim affine span
    assert fedtsne_selfcheck.fedtsne_reconstruction(x, x, x, 5)       # span is all of R^5: exact
    assert fedtsne_selfcheck.fedtsne_reconstruction(flat, flat, x, 4)  # smaller span: the projection, not exact
    assert not fedtsne_selfcheck.fedtsne_reconstruction(flat, flat, x, 5)   # full span but not exact
    assert not fedtsne_selfcheck.fedtsne_reconstruction(x, flat, x, 4)      # reconstruction is not the projection
    acc = np.tril(rng.uniform(size=(3, 3)))
    assert refed_selfcheck.refed_full_memory(acc, acc.copy(), 500, 400)
    assert not refed_selfcheck.refed_full_memory(acc, acc + 0.01, 500, 400)
    assert refed_selfcheck.refed_full_memory(acc, acc + 0.01, 100, 400)


# ---------------------------------------------------------------------------------------------
# the answer helpers and the checks of the exercises that had none (issue 15)
# ---------------------------------------------------------------------------------------------
def _pending(v, *hidden):
    """A fill-in check while the answer is None: no verdict, names what to fill in, hides the answer."""
    text = _flat(v)
    assert v.as_predicted is None and not bool(v) and "fill in" in text and "predicted" not in text, text
    for h in hidden:
        assert str(h) not in text, (h, text)


def test_answer_helpers():
    kw = dict(name="my_x", asks="a number", compared_with="the chapter's number", exercise="ex")
    _pending(selfcheck.answer_number(None, 3.41, **kw), "3.41")
    assert selfcheck.answer_number(3.4, 3.414, rtol=0.01, **kw)
    assert not selfcheck.answer_number(2.0, 3.414, rtol=0.01, **kw)
    assert selfcheck.answer_number(60, 58, interval=(58, 64), **kw)
    assert not selfcheck.answer_number(70, 58, interval=(58, 64), **kw)
    with pytest.raises(ValueError, match="my_x"):
        selfcheck.answer_number("abc", 1.0, **kw)
    _pending(selfcheck.answer_choice(None, "yes", ["yes", "no"], **kw))
    assert selfcheck.answer_choice("YES", "yes", ["yes", "no"], **kw)
    assert not selfcheck.answer_choice("no", "yes", ["yes", "no"], **kw)
    with pytest.raises(ValueError, match="one of"):
        selfcheck.answer_choice("maybe", "yes", ["yes", "no"], **kw)


def test_afl_partition_variance():
    _pending(afl_selfcheck.afl_partition_variance(None, [1.8, 2.2]))
    assert afl_selfcheck.afl_partition_variance("grows", [1.8, 2.2, 0.9])
    assert not afl_selfcheck.afl_partition_variance("grows", [0.7, 0.9])
    assert afl_selfcheck.afl_partition_variance("grows", [np.nan]).as_predicted is None   # one seed: no std


def test_fedtsne_nystrom_exact():
    rng = np.random.default_rng(0)
    x = np.c_[rng.normal(size=(100, 5)), np.zeros((100, 3))]      # m = 8, affine rank 5
    assert fedtsne_selfcheck.fedtsne_nystrom_exact([1e-10, 3e-9], 7, x)     # n_y >= r + 2 = 7: exact
    assert not fedtsne_selfcheck.fedtsne_nystrom_exact([1e-10, 0.2], 7, x)
    assert fedtsne_selfcheck.fedtsne_nystrom_exact([0.1, 0.3], 5, x)        # below r + 2: not exact
    assert not fedtsne_selfcheck.fedtsne_nystrom_exact([1e-12], 5, x)


def test_fedtsne_early_rounds():
    idx = pd.MultiIndex.from_tuples([("a", "IID"), ("a", "non-IID")])
    conv = pd.DataFrame({0: [0.2, 0.2], 10: [0.3, 0.25], 50: [0.8, 0.7], 100: [0.9, np.nan]}, index=idx)
    assert fedtsne_selfcheck.fedtsne_early_rounds(conv)
    fast = conv.copy()
    fast[10] = [0.85, 0.25]                                                          # 0.65 of the gain at round 10
    assert not fedtsne_selfcheck.fedtsne_early_rounds(fast)
    assert fedtsne_selfcheck.fedtsne_early_rounds(conv[[0, 10]]).as_predicted is None     # no run past round 10
    assert fedtsne_selfcheck.fedtsne_early_rounds(conv[[0, 50]]).as_predicted is None     # no checkpoint at round 10
    with pytest.raises(ValueError, match="round 0"):
        fedtsne_selfcheck.fedtsne_early_rounds(conv[[10, 50]])


def test_fedtsne_weights():
    ident = pd.DataFrame({"split": ["IID", "IID", "skew", "skew"], "weights": ["n_p/n", "1/P", "n_p/n", "1/P"],
                          "client sizes": ["120-120", "120-120", "107-134", "107-134"],
                          "rel. error vs pooled gradient": [3e-14, 3e-14, 3e-14, 0.11]})
    assert fedtsne_selfcheck.fedtsne_weights(ident)
    assert not fedtsne_selfcheck.fedtsne_weights(ident.assign(**{"rel. error vs pooled gradient": [3e-14, 0.1, 3e-14, 0.11]}))


def test_fedtsne_budget():
    from fedlib.fedtsne.dp import dp_noise_sd
    target = dp_noise_sd(2.0, 1e-5, 0.01, "dp_gradient", compositions=10)
    kw = dict(delta=1e-5, sensitivity=0.01, rounds=10)
    _pending(fedtsne_selfcheck.fedtsne_budget(None, target, **kw))
    assert fedtsne_selfcheck.fedtsne_budget(2.0, target, **kw)
    assert not fedtsne_selfcheck.fedtsne_budget(8.0, target, **kw)


def test_fedspeclust_checks():
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(size=(20, 4)), rng.normal(size=(20, 4)) + 3.0]
    iid = [x[0::2], x[1::2]]
    noniid = [x[:20], x[20:]]
    _pending(fedtsne_selfcheck.fedsc_splits_differ(None, iid, noniid))
    assert fedtsne_selfcheck.fedsc_splits_differ({"weights": "uniform"}, iid, [x[:10], x[10:]])   # unequal sizes
    assert not fedtsne_selfcheck.fedsc_splits_differ({}, iid, noniid)                                # the chapter's options
    low_rank = np.c_[x[:, :3], np.zeros(40)]                                                 # rank 3 in R^4
    _pending(fedtsne_selfcheck.fedsc_linear_kernel_landmarks(None, low_rank))
    assert fedtsne_selfcheck.fedsc_linear_kernel_landmarks(4, low_rank) and fedtsne_selfcheck.fedsc_linear_kernel_landmarks(3, low_rank)
    assert not fedtsne_selfcheck.fedsc_linear_kernel_landmarks(6, low_rank)
    runs = pd.DataFrame({"dataset": ["a", "a", "a"], "gamma": [0.01, 0.01, 0.01]})
    assert fedtsne_selfcheck.fedsc_kernel_width(runs, "moments")
    assert not fedtsne_selfcheck.fedsc_kernel_width(runs.assign(gamma=[0.01, 0.02, 0.01]), "moments")
    assert fedtsne_selfcheck.fedsc_kernel_width(runs.assign(gamma=[0.01, 0.02, 0.01]), "median")
    idx = pd.MultiIndex.from_tuples([(d, v, s) for d in ("a", "b") for v in ("Fed", "Fed+") for s in ("IID", "non-IID")],
                                    names=["dataset", "variant", "split"])
    diag = pd.DataFrame({"kernel rel. error": [0.03, 0.03, 0.031, 0.037, 0.04, 0.04, 0.041, 0.05]}, index=idx)
    _pending(fedtsne_selfcheck.fedsc_noise_column(None, diag), "Fed+ non-IID:")
    assert fedtsne_selfcheck.fedsc_noise_column("Fed+ non-IID", diag)
    assert not fedtsne_selfcheck.fedsc_noise_column("Fed IID", diag)
    err = pd.DataFrame({"FedDL": [0.1, 0.03], "uniform sample (oracle, not federated)": [0.2, 0.02]},
                       index=pd.Index([10, 400], name="n_y"))
    _pending(fedtsne_selfcheck.fedsc_rounds_oracle(None, err))
    assert fedtsne_selfcheck.fedsc_rounds_oracle("no", err)
    assert not fedtsne_selfcheck.fedsc_rounds_oracle("yes", err)


def test_refed_new_checks():
    assert refed_selfcheck.refed_pim_distance({0.2: 0.01, 0.8: 0.05})
    assert not refed_selfcheck.refed_pim_distance({0.2: 0.05, 0.8: 0.01})
    assert refed_selfcheck.refed_pim_distance({0.8: 0.05}).as_predicted is None
    pool = np.array([[10, 10], [5, 5]])

    def log(cache):
        return [{"new": np.zeros(2)}, {"pool_classes": pool, "old_classes": np.array(cache)}]

    balanced, skewed = log([[5, 5], [2, 2]]), log([[9, 1], [4, 0]])
    _pending(refed_selfcheck.refed_class_balance(None, skewed, balanced))
    assert refed_selfcheck.refed_class_balance("random", skewed, balanced)
    assert not refed_selfcheck.refed_class_balance("refed", skewed, balanced)
    rate = pd.DataFrame({"g(t)": ["g0 (t+1)^-0.25", "g0 (t+1)^-0.5"], "largest admissible A": [6.285, 3.414]})
    _pending(refed_selfcheck.refed_rate_constant(None, rate, 1.0), "3.41")
    assert refed_selfcheck.refed_rate_constant(3.41, rate, 1.0)
    assert not refed_selfcheck.refed_rate_constant(2.0, rate, 1.0)
    _pending(refed_selfcheck.refed_score_limits(None))
    assert refed_selfcheck.refed_score_limits((0, 2))
    assert not refed_selfcheck.refed_score_limits((0, 1))
    assert refed_selfcheck.refed_memory_holds_all([True, True, True], [True, False, False])
    assert not refed_selfcheck.refed_memory_holds_all([True, True, True], [True, True, False])
    assert not refed_selfcheck.refed_memory_holds_all([True, False, True], [True, False, False])


def test_stsa_new_checks():
    rows = [("M (pretrained)", m, "STSA", a) for m, a in [(1280, 83.0), (1000, 82.0), (2000, 84.0)]]
    rows += [("M (scratch)", m, "STSA", a) for m, a in [(32, 40.0), (250, 55.0), (1000, 60.0)]]
    abl = pd.DataFrame(rows, columns=["ablation", "value", "method", "A_T"])
    dims = {"M (scratch)": 32, "M (pretrained)": 1280}
    assert stsa_selfcheck.stsa_random_features(abl, dims)
    assert not stsa_selfcheck.stsa_random_features(abl.assign(A_T=[83.0, 82.0, 99.0, 40.0, 45.0, 41.0]), dims)
    assert stsa_selfcheck.stsa_random_features(abl, {"M (scratch)": 64, "M (pretrained)": 1280}).as_predicted is None
    # STSA: 191.12 MiB at M = 1000, c_t = 2; FedLwF 6.11 MiB: (M + 2) M * 191.12 / (1002 * 1000) > 6.11 from M = 178
    _pending(stsa_selfcheck.stsa_upload_crossing(None, 6.11, 191.12, 1000, 2), "178")
    assert stsa_selfcheck.stsa_upload_crossing(178, 6.11, 191.12, 1000, 2)
    assert not stsa_selfcheck.stsa_upload_crossing(1000, 6.11, 191.12, 1000, 2)
    bias = pd.DataFrame({"K_D": [25, 25], "k_mode": ["global", "per_class"], "covariance ratio": [0.25, 1.0]})
    _pending(stsa_selfcheck.stsa_dummy_ratio(None, bias, 25), "0.25")
    assert stsa_selfcheck.stsa_dummy_ratio(31 / 124, bias, 25)
    assert not stsa_selfcheck.stsa_dummy_ratio(0.8, bias, 25)
    with pytest.raises(ValueError, match="bias_dummy"):
        stsa_selfcheck.stsa_dummy_ratio(0.3, bias, 5)


def _cells(path: Path) -> list[tuple[str, str]]:
    """(kind, text) of the cells of a jupytext percent notebook, kind "markdown" or "code"."""
    cells, kind, lines = [], None, []
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            if kind is not None:
                cells.append((kind, "\n".join(lines)))
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    if kind is not None:
        cells.append((kind, "\n".join(lines)))
    return cells


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if not c.endswith("_beyond")])
def test_every_exercise_has_a_selfcheck_cell(chapter):
    """Every {exercise} is followed, before the next exercise or heading, by a code cell calling selfcheck."""
    path = NOTEBOOKS / f"{chapter}.py"
    assert "No self-check" not in path.read_text(), f"{chapter}: an exercise says it has no self-check"
    cells = _cells(path)
    missing = []
    for i, (kind, text) in enumerate(cells):
        if kind != "markdown":
            continue
        parts = text.split("```{exercise}")
        for j, after in enumerate(parts[1:], start=1):
            label = re.search(r":label:\s*(\S+)", after)
            label = label.group(1) if label else f"{chapter} exercise"
            if j < len(parts) - 1:                       # another exercise in the same markdown cell
                missing.append(label)
                continue
            ok = False
            for kind2, text2 in cells[i + 1:]:
                if kind2 == "code":
                    ok = bool(re.search(r"^[^#\n]*\bselfcheck\.\w+\(", text2, re.M))
                    break
                if "```{exercise}" in text2 or re.search(r"^# #", text2, re.M):
                    break
            if not ok:
                missing.append(label)
    assert not missing, f"{chapter}: exercises without a self-check cell right after them: {missing}"
