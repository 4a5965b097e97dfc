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

from fedlib import profiles

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


def test_a_failing_cell_fails_the_run(tmp_path, monkeypatch):
    """papermill raises on a cell that raises, so `make notebooks` (and the book) stop there."""
    import papermill

    (tmp_path / "broken.py").write_text('# %% tags=["parameters"]\nprofile = "quick"\nx = 1\n\n'
                                        '# %%\nassert x == 2, "claim does not hold"\n')
    (tmp_path / "profiles.yml").write_text("order: [broken]\nprofiles:\n  smoke: {}\n")
    monkeypatch.setattr(profiles, "NOTEBOOK_DIR", tmp_path)
    monkeypatch.setattr(profiles, "PROFILE_FILE", tmp_path / "profiles.yml")
    with pytest.raises(papermill.PapermillExecutionError, match="claim does not hold"):
        profiles.run_notebook("broken", "smoke", output=tmp_path / "out.ipynb")
