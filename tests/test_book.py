"""Every chapter executed at the `smoke` profile, then the book built from them and inspected.

The build runs in a temporary copy of the book's sources, so a developer's executed `quick`
notebooks in book/executed/ are left alone.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedlib.evaluation import claims

from fedlib.runner import profiles, specs

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = profiles.notebook_names()
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    root = tmp_path_factory.mktemp("book")
    for name in ["_config.yml", "_toc.yml"]:
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "book", root / "book", ignore=shutil.ignore_patterns("executed", "_build"))
    for name in NOTEBOOKS:
        profiles.run_notebook(name, "smoke", output=root / "book" / "executed" / f"{name}.ipynb")
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(root), "-W", "--keep-going"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return root


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executed_without_errors_and_with_figures(book, name):
    nb = json.loads((book / "book" / "executed" / f"{name}.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} shows no figure"
    params = [c for c in nb["cells"] if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
    assert params and "profile = \"smoke\"" in "".join(params[0]["source"])


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_html_page_has_figures_and_no_error_output(book, name):
    html = (book / "_build" / "html" / "book" / "executed" / f"{name}.html").read_text()
    assert "<img" in html
    assert "Traceback" not in html and "output error" not in html


def test_html_pages_of_the_book_exist(book):
    html = book / "_build" / "html"
    for page in ["index.html", "book/intro.html", "book/reproduce.html", "book/coursework.html",
                 "book/afl_performance.html", "book/references.html"]:
        assert (html / page).exists(), page
    assert "pairwise AA law" in (html / "book" / "afl_performance.html").read_text()


def test_a_failing_run_leaves_the_chapter_unchanged(tmp_path, monkeypatch):
    """papermill raises on a cell that raises; the chapter already in the book is not overwritten
    (the failed run goes to FAILED_DIR instead), so a typo in a parameter cannot blank a page."""
    import papermill

    (tmp_path / "broken.py").write_text('# %% tags=["parameters"]\nprofile = "quick"\nx = 1\n\n'
                                        '# %%\nassert x == 2, "claim does not hold"\n')
    (tmp_path / "profiles.yml").write_text("order: [broken]\nprofiles:\n  smoke: {}\n")
    monkeypatch.setattr(profiles, "NOTEBOOK_DIR", tmp_path)
    monkeypatch.setattr(profiles, "PROFILE_FILE", tmp_path / "profiles.yml")
    monkeypatch.setattr(profiles, "FAILED_DIR", tmp_path / "failed")
    monkeypatch.setattr(specs, "spec", lambda chapter: specs.Spec({"x": specs.Int()}))
    out = tmp_path / "out.ipynb"
    out.write_text("previous good run")
    with pytest.raises(papermill.PapermillExecutionError, match="claim does not hold"):
        profiles.run_notebook("broken", "smoke", output=out)
    assert out.read_text() == "previous good run"
    assert "claim does not hold" in (tmp_path / "failed" / "broken.ipynb").read_text()
    profiles.run_notebook("broken", "smoke", {"x": 2}, output=out)   # a good run replaces it
    assert json.loads(out.read_text())["cells"] and not list(tmp_path.glob(".*partial"))


def test_book_build_fails_on_an_executed_notebook_with_an_error(tmp_path):
    """The book's extension refuses a notebook with an error output, even one written by hand."""
    import nbformat

    shutil.copy(REPO / "_config.yml", tmp_path / "_config.yml")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/executed/ch\n")
    (tmp_path / "book" / "executed").mkdir(parents=True)
    (tmp_path / "book" / "intro.md").write_text("# Intro\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Chapter"), nbformat.v4.new_code_cell("1/0")])
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                                                  traceback=["ZeroDivisionError"])]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "book" / "executed" / "ch.ipynb")
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(tmp_path), "-W", "--keep-going"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ch.ipynb: ZeroDivisionError: division by zero" in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_chapter_registers_its_claims(book, name):
    recs = claims.claims_in_notebook(book / "book" / "executed" / f"{name}.ipynb")
    assert recs, f"{name} registers no claim"
    assert all(r["verdict"] in claims.VERDICTS for r in recs)


def test_claims_ledger_page_lists_every_registered_claim(book):
    recs = claims.collect(book / "book" / "executed", NOTEBOOKS)
    page = (book / "_build" / "html" / "book" / "claims.html").read_text()
    for r in recs:
        assert f'executed/{r["chapter"]}.html#claim-{r["id"]}' in page, r["id"]
        chapter = (book / "_build" / "html" / "book" / "executed" / f'{r["chapter"]}.html').read_text()
        assert f'id="claim-{r["id"]}"' in chapter, r["id"]
    assert {r["paper"] for r in recs} == set(claims.PAPERS)
