"""Every chapter executed at the `smoke` profile, then the book built from them and inspected:
as files, and in a real browser (headless Chromium over a local HTTP server, no network).

The build runs in a temporary copy of the book's sources, so a developer's executed `quick`
notebooks in book/executed/ are left alone. Screenshots of every page go to _build/screenshots/.
"""
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fedlib.core.specs import Int, Spec
from fedlib.evaluation import claims

from fedlib.runner import profiles, specs

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = profiles.notebook_names()
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    root = tmp_path_factory.mktemp("book")
    for name in ["_config.yml", "_toc.yml"]:
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "book", root / "book", ignore=shutil.ignore_patterns("executed", "_build"))
    (root / "fedlib").symlink_to(REPO / "fedlib")   # the chapters include the algorithms' source from it
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
    defaults = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert defaults and "hide-input" in defaults[0]["metadata"]["tags"]   # folded: the run's values show


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_html_page_has_figures_and_no_error_output(book, name):
    html = (book / "_build" / "html" / "book" / "executed" / f"{name}.html").read_text()
    assert "<img" in html
    assert "Traceback" not in html and "output error" not in html


def test_derivation_chapters_show_the_algorithm_source(book):
    """Each {literalinclude} of a derivation chapter rendered as highlighted code that defines its object."""
    from test_code_page import DERIVATIONS, shown_source

    for chapter in DERIVATIONS:
        html = (book / "_build" / "html" / "book" / "executed" / f"{chapter}.html").read_text()
        for file, obj in shown_source(chapter):
            assert f'<span class="nf">{obj.split(".")[-1]}</span>' in html or \
                f'<span class="nc">{obj}</span>' in html, (chapter, obj)
            assert f"{file}: " in html, (chapter, file)


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
    monkeypatch.setattr(specs, "spec", lambda chapter: Spec({"x": Int()}))
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


# the comparisons of methods: each names its methods, what ran, its budget and its convergence evidence
COMPARATIVE = {"afl-beats-baselines", "stsa-beats-baselines", "refed-beats-random-replay-class",
               "refed-beats-random-replay-domain", "refed-pim-beats-global-importance", "fedtsne-close-to-centralized"}


def test_every_comparison_names_its_budget_and_convergence_and_what_ran(book):
    """No verdict rests on a budget that did not converge, and none covers a method that did not run
    (``claims.make_record`` refuses both; this checks that the comparisons use those fields)."""
    recs = {r["id"]: r for r in claims.collect(book / "book" / "executed", NOTEBOOKS)}
    assert COMPARATIVE <= set(recs), sorted(COMPARATIVE - set(recs))
    for cid in COMPARATIVE:
        r = recs[cid]
        assert r.get("methods") and r.get("ran") and r.get("budget") and r.get("convergence"), cid
        assert isinstance(r.get("converged"), bool), cid
        if not r["converged"]:
            assert r["verdict"] in ("inconclusive", "not comparable"), cid
        if set(r["methods"]) - set(r["ran"]):
            assert r["verdict"] != "verified", cid
    for r in recs.values():
        assert r["profile"] == "smoke" and r["overrides"] == {}, r["id"]   # the ledger shows the run's profile
        if r["verdict"] == "inconclusive":
            assert r.get("rules_out"), r["id"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_chapter_opens_with_its_findings(book, name):
    """The first thing under a chapter's title: one line per claim it registered, with our verdict,
    linked to the cell that decided it (generated from the executed chapter when the book is built)."""
    html = (book / "_build" / "html" / "book" / "executed" / f"{name}.html").read_text()
    recs = claims.claims_in_notebook(book / "book" / "executed" / f"{name}.ipynb")
    start = html.index("What this chapter finds")
    assert start < html.index('class="cell docutils container"'), "the findings come before the first cell"
    block = html[start:html.index("</ul>", start)]
    assert block.count("<li>") == len(recs)
    for r in recs:
        assert f'href="#claim-{r["id"]}"' in block and r["verdict"] in block, r["id"]
    # each line's claim, as shortened for the first screen, tells the claims apart (the class- and the
    # domain-incremental headline once read the same up to the cut)
    said = [re.sub(r"<[^>]+>", "", li).split(" — ")[0].strip() for li in block.split("<li>")[1:]]
    assert len(set(said)) == len(said), said


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_figures_are_numbered_per_chapter_and_captioned(book, name):
    """Fig. 1, 2, ... on every chapter (fedlib.runner.numbering), each with its caption."""
    html = (book / "_build" / "html" / "book" / "executed" / f"{name}.html").read_text()
    numbers = re.findall(r'<span class="caption-number">Fig\. (\d+) </span>', html)
    assert numbers and numbers == [str(i) for i in range(1, len(numbers) + 1)], numbers
    assert html.count("<figcaption>") >= len(numbers)


def test_first_page_opens_with_the_books_findings(book):
    recs = claims.collect(book / "book" / "executed", NOTEBOOKS)
    page = (book / "_build" / "html" / "book" / "intro.html").read_text()
    assert page.index("What we found") < page.index("What this book is")
    for r in recs:
        assert f'executed/{r["chapter"]}.html#claim-{r["id"]}' in page, r["id"]


def test_claims_ledger_page_lists_every_registered_claim(book):
    recs = claims.collect(book / "book" / "executed", NOTEBOOKS)
    page = (book / "_build" / "html" / "book" / "claims.html").read_text()
    for r in recs:
        assert f'executed/{r["chapter"]}.html#claim-{r["id"]}' in page, r["id"]
        chapter = (book / "_build" / "html" / "book" / "executed" / f'{r["chapter"]}.html').read_text()
        assert f'id="claim-{r["id"]}"' in chapter, r["id"]
    assert {r["paper"] for r in recs} == set(claims.PAPERS)


# --- The built book in a real browser: headless Chromium (Debian packages chromium and
# chromium-driver, installed by `make browser`) driven by Selenium, over a local HTTP server on
# 127.0.0.1. One browser session visits every page of the toc once (`browser_visits`); the tests
# below each check one property of all pages, so a failure lists every page that has it.
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_table_carries_its_caption(book, name):
    """Every table of a chapter, in its outputs or its prose, has its own caption (fedlib.evaluation.style.captioned,
    a Styler's set_caption, or a MyST table directive): no printed line above it stands in for one."""
    html = (book / "_build" / "html" / "book" / "executed" / f"{name}.html").read_text()
    tables = re.findall(r"<table.*?</table>", html, re.S)
    bare = [re.sub(r"<[^>]+>|\s+", " ", t)[:80] for t in tables if "<caption" not in t]
    assert not bare, bare


def test_refed_table1_beside_ours_has_every_method_we_ran(book):
    """The paper's Table 1 beside ours, per kind of stream: each of the paper's methods that we ran
    (FedAvg and FedProx with random replay, Fixed, Re-Fed) has our value, not "—" (Re-Fed's own row
    was once empty, its label carrying the gradient-norm note)."""
    nb = json.loads((book / "book" / "executed" / "refed_benchmark.ipynb").read_text())
    tables = ["".join(o["data"]["text/html"]) for c in nb["cells"] for o in c.get("outputs", [])
              if "Table 1 on its datasets" in "".join(o.get("data", {}).get("text/html", ""))]
    assert tables
    for html in tables:
        rows = {m.group(1): m.group(2) for m in re.finditer(r'<th[^>]*row_heading[^>]*>([^<]+)</th>(.*?)</tr>', html, re.S)}
        for method in ("FedAvg", "Fixed", "Re-Fed"):
            last = re.findall(r"<td[^>]*>([^<]*)</td>", rows[method])[-1].strip()
            assert last != "—" and "±" in last, (method, last)


# FEDLIB_BOOK_HTML=path/to/_build/html checks a book already built there (for example by `make
# html`) instead of building one at `smoke` (the pages are then those of the toc beside _build/).

CHROMIUM = Path(os.environ.get("FEDLIB_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FEDLIB_CHROMEDRIVER", "/usr/bin/chromedriver"))
SCREENSHOTS = REPO / "_build" / "screenshots"   # kept after the tests, for review (git-ignored)
WINDOW = (1400, 1000)   # one "screen" of the page
RAW_TEX = ("$$", "\\(", "\\[", "\\begin{")
REMOTE_TAG = re.compile(r"<(?:script|img|iframe|link|source|audio|video|embed)\b[^>]*?\s(?:src|href)=[\"']?(?:https?:)?//",
                        re.IGNORECASE)

# After a page has loaded: wait for MathJax's first typeset, the images and the fonts, then report
# what a reader sees. Visible text excludes code (pre, code) and typeset math (mjx-container).
PAGE_STATE_JS = """
const done = arguments[arguments.length - 1];
const mathjax = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
(mathjax || Promise.resolve()).then(async () => {
  await Promise.all(Array.from(document.images).filter(i => !i.complete)
                    .map(i => new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  await document.fonts.ready;
  // the page's length as it opens (folded sections closed); then every fold opened, so that what
  // it holds (figures, tables, code) is measured like the rest, and closed again at the end
  const screens = document.documentElement.scrollHeight / window.innerHeight;
  const lead = Array.from(document.querySelectorAll('article p')).find(e => e.textContent.startsWith('What this chapter finds'));
  const findings = lead ? lead.getBoundingClientRect().top + window.scrollY : null;
  const closed = Array.from(document.querySelectorAll('details:not([open])'));
  closed.forEach(d => { d.open = true; });
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const text = document.body.cloneNode(true);
  text.querySelectorAll('pre, code, script, style, textarea, mjx-container').forEach(e => e.remove());
  const math = Array.from(document.querySelectorAll('.math'));
  // wide content (tables, code, outputs, images, display math) must stay inside the content column or
  // sit in a box that scrolls horizontally (book/_static/fedlib.css), never run past the column's edge
  const article = document.querySelector('article.bd-article');
  const edge = article ? Math.min(article.getBoundingClientRect().right, document.documentElement.clientWidth) + 1 : 0;
  const scrolls = e => {
    for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if ((o === 'auto' || o === 'scroll') && p.getBoundingClientRect().right <= edge) return true;
    }
    return false;
  };
  const overflow = article ? Array.from(article.querySelectorAll(
      'table, pre, img, .cell_output .output, mjx-container[display="true"], .pst-scrollable-table-container'))
    .filter(e => e.getBoundingClientRect().right > edge && !scrolls(e))
    .map(e => `${e.tagName.toLowerCase()} ${Math.round(e.getBoundingClientRect().right - edge)} px past the column: `
              + e.textContent.trim().slice(0, 60)) : [];
  const result = {
    mathjax: Boolean(mathjax),
    text: text.textContent,
    images: Array.from(document.images).map(i => [i.currentSrc || i.src, i.complete && i.naturalWidth > 0]),
    math: math.length,
    typeset: document.querySelectorAll('mjx-container').length,
    untypeset: math.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.trim().slice(0, 80)),
    math_errors: Array.from(document.querySelectorAll('mjx-merror'))
                      .map(e => e.getAttribute('data-mjx-error') || e.textContent),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    nav: Array.from(document.querySelectorAll('nav.bd-docs-nav a[href]')).map(a => a.href),
    resources: performance.getEntriesByType('resource').map(e => e.name),
    overflow: overflow,
    // what a reader meets (the book's reading standards): text in outputs, table cells, boxes whose
    // content is wider than the box, figures (shown width, natural width, alt text, caption), length
    outputs: Array.from(document.querySelectorAll('.cell_output')).map(e => e.textContent).join(' | '),
    cells: Array.from(document.querySelectorAll('article td, article th')).map(e => e.textContent.trim()),
    clipped: article ? Array.from(article.querySelectorAll(
        '.cell_output .output, div.highlight pre, .pst-scrollable-table-container, div.math'))
      .filter(e => e.scrollWidth > e.clientWidth + 2)
      .map(e => `${e.className.split(' ')[0] || e.tagName.toLowerCase()}: ${e.textContent.trim().slice(0, 50)}`) : [],
    figures: article ? Array.from(article.querySelectorAll('.cell_output img')).map(i => ({
      src: (i.currentSrc || i.src).slice(-40), shown: i.getBoundingClientRect().width, natural: i.naturalWidth,
      alt: i.getAttribute('alt') || '', caption: Boolean(i.closest('figure') && i.closest('figure').querySelector('figcaption'))
    })) : [],
    screens: screens,
    findings: findings,
    folds: document.querySelectorAll('details.fedlib-folded').length,
  };
  closed.forEach(d => { d.open = false; });
  done(result);
}).catch(e => done({error: String(e)}));
"""


def toc_pages(root: Path) -> list[str]:
    """Every page of the book whose sources are at ``root``, in toc order: its root, then each
    ``file`` of _toc.yml's parts / chapters / sections (e.g. "book/executed/afl_derivation")."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages, todo = [toc["root"]], [toc]
    while todo:
        entry = todo.pop(0)
        if "file" in entry and entry is not toc:
            pages.append(entry["file"])
        todo[:0] = entry.get("parts", []) + entry.get("chapters", []) + entry.get("sections", [])
    return [p.removesuffix(".md").removesuffix(".ipynb") for p in pages]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):   # the browser closing a connection early
        pass


@pytest.fixture(scope="module")
def site(request):
    """(html directory, origin, toc pages): the built book served on 127.0.0.1 at a free port by a
    thread of this process, shut down after the module."""
    if os.environ.get("FEDLIB_BOOK_HTML"):
        html = Path(os.environ["FEDLIB_BOOK_HTML"]).resolve()
    else:
        html = request.getfixturevalue("book") / "_build" / "html"
    server = _QuietServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(html)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield html, f"http://127.0.0.1:{server.server_address[1]}", toc_pages(html.parent.parent)
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium session for the module, with Debian's chromium and chromedriver given
    explicitly (Selenium Manager, which would download a driver, is never asked). Host names other
    than 127.0.0.1 do not resolve, so the browser is offline even on a machine with internet."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"headless Chromium is needed for the browser tests; missing: {', '.join(missing)}. "
                    "Install the Debian packages chromium and chromium-driver (`make browser` does it as root), "
                    "or set FEDLIB_CHROMIUM / FEDLIB_CHROMEDRIVER.")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",   # screenshots of exactly WINDOW
                               {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
        driver.set_page_load_timeout(60)
        driver.set_script_timeout(60)
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser_visits(site, browser):
    """Every toc page (and search, genindex) loaded once in the browser: {page: what it showed (PAGE_STATE_JS) + the
    console's errors ("console") + every URL the page requested ("requests", from the DevTools
    network log)}. Saves a screenshot of each page's top (WINDOW) under SCREENSHOTS, and one with
    the page's first figure in view (NAME__figure.png) where it has images."""
    html, origin, pages = site
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    visits = {}
    for page in pages + ["search", "genindex"]:   # and the two pages Sphinx adds
        browser.get(f"{origin}/{page}.html")
        state = browser.execute_async_script(PAGE_STATE_JS)
        state["console"] = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        events = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
        state["requests"] = [ev["params"]["request"]["url"] for ev in events if ev["method"] == "Network.requestWillBeSent"]
        shot = SCREENSHOTS / page.replace("/", "__")
        browser.save_screenshot(f"{shot}.png")
        if browser.execute_script("const i = document.querySelector('main img');"
                                  "if (i) { i.scrollIntoView({block: 'center'}); } return Boolean(i);"):
            browser.save_screenshot(f"{shot}__figure.png")
        visits[page] = state
    return visits


def test_every_page_loads_without_console_errors(browser_visits):
    bad = {p: v.get("error") or v["console"] for p, v in browser_visits.items() if v.get("error") or v["console"]}
    assert not bad, bad


def test_every_image_loads(browser_visits):
    bad = {p: broken for p, v in browser_visits.items() if (broken := [src for src, ok in v["images"] if not ok])}
    assert not bad, bad
    for name in NOTEBOOKS if not os.environ.get("FEDLIB_BOOK_HTML") else []:
        assert browser_visits[f"book/executed/{name}"]["images"], f"{name}: no image on the page"


def test_wide_content_scrolls_inside_the_content_column(browser_visits):
    """No table, code block, output, image or display formula runs past the right edge of the content
    column unless it sits in a box that scrolls horizontally (book/_static/fedlib.css)."""
    bad = {p: v["overflow"][:3] for p, v in browser_visits.items() if v.get("overflow")}
    assert not bad, bad


def test_no_box_is_clipped(browser_visits):
    """Every table, code block, output and display formula fits the column (folds opened): a box
    that scrolls still hides its right-hand part from a reader and from print."""
    bad = {p: v["clipped"] for p, v in browser_visits.items() if v.get("clipped")}
    assert not bad, bad


REPR = re.compile(r"\{'[\w-]+': |\{-?\d+(?:\.\d+)?: |<[\w.]+ object at 0x[0-9a-f]+>|\bdict_(?:keys|values|items)\(")
MISSING_CELLS = {"nan", "NaN", "None", "<NA>", "NaT"}


def test_no_dollar_sign_reaches_the_reader(browser_visits):
    """Math in generated Markdown is typeset too (myst-nb renders displayed Markdown as MyST)."""
    bad = {p: v["text"][max(0, i - 50):i + 50] for p, v in browser_visits.items() if (i := v["text"].find("$")) >= 0}
    assert not bad, bad


def test_no_python_repr_in_the_outputs(browser_visits):
    """No dict or object repr under a verdict box or anywhere else (claim cells show their box only)."""
    bad = {p: m.group(0) for p, v in browser_visits.items() if (m := REPR.search(v["outputs"]))}
    assert not bad, bad


def test_no_table_cell_reads_nan_or_none(browser_visits):
    """Missing values read "—" (fedlib.evaluation.style)."""
    bad = {p: sorted(set(v["cells"]) & MISSING_CELLS) for p, v in browser_visits.items() if set(v["cells"]) & MISSING_CELLS}
    assert not bad, bad


def has_alt(figure: dict) -> bool:
    """Alt text that describes the figure (not empty, not the image's file name)."""
    alt = figure["alt"].strip()
    return bool(alt) and not re.search(r"\.(?:png|svg|jpe?g)$", alt)


def reading_audit(visits: dict) -> dict:
    """Counts of what the book's reading standards ask for, page by page and in total: boxes whose
    content is wider than the box, figures shown at under 80 % of their width or without a caption
    or alt text, and the page's length in screens (WINDOW)."""
    pages = {}
    for page, v in visits.items():
        figs = v.get("figures", [])
        pages[page] = {"clipped boxes": len(v.get("clipped", [])),
                       "figures under 80 %": sum(f["natural"] and f["shown"] < 0.8 * f["natural"] for f in figs),
                       "figures without caption": sum(not f["caption"] for f in figs),
                       "figures without alt text": sum(not has_alt(f) for f in figs),
                       "figures": len(figs), "folds": v.get("folds", 0), "screens": round(v.get("screens", 0), 1),
                       "clipped": v.get("clipped", [])}
    total = {k: sum(p[k] for p in pages.values()) for k in next(iter(pages.values())) if k not in ("screens", "clipped")}
    total["pages over 15 screens"] = sum(p["screens"] > 15 for p in pages.values())
    return {"window": list(WINDOW), "total": total, "pages": pages}


def test_every_figure_has_a_caption_and_alt_text(browser_visits):
    """Each chapter figure sits in a <figure> with its <figcaption> and has alt text (the cell's
    ``mystnb`` metadata: figure.caption, image.alt)."""
    bad = {p: [f["src"] for f in v["figures"] if not (f["caption"] and has_alt(f))] for p, v in browser_visits.items()}
    bad = {p: srcs for p, srcs in bad.items() if srcs}
    assert not bad, bad


def test_every_figure_is_shown_at_80_percent_of_its_width_or_more(browser_visits):
    """Figures are drawn for the column (fedlib.evaluation.style.fit_column / facet_size), so the page
    does not shrink them, and their labels, to illegible sizes."""
    bad = {p: [(f["src"], round(f["shown"] / f["natural"], 2)) for f in v["figures"]
               if f["natural"] and f["shown"] < 0.8 * f["natural"]] for p, v in browser_visits.items()}
    bad = {p: figs for p, figs in bad.items() if figs}
    assert not bad, bad


def test_every_page_fits_in_15_screens(browser_visits):
    """A page opens at most 15 screens long (WINDOW): methodology depth is folded
    (fedlib.runner.folding), the ledger's tables too."""
    long = {p: round(v["screens"], 1) for p, v in browser_visits.items() if v["screens"] > 15}
    assert not long, long


def test_every_chapter_shows_its_findings_on_the_first_screen(browser_visits):
    """A chapter's findings block starts on its first screen, with room for its first lines."""
    chapters = {p: v for p, v in browser_visits.items() if p.startswith("book/executed/")}
    assert len(chapters) == len(NOTEBOOKS)
    late = {p: v["findings"] for p, v in chapters.items() if v["findings"] is None or v["findings"] > WINDOW[1] - 150}
    assert not late, late


def test_reading_audit_is_written_and_counts_every_page(browser_visits):
    """The audit (_build/screenshots/audit.json) covers every visited page; figures stay within the
    column (never scaled past it, book/_static/fedlib.css)."""
    audit = reading_audit(browser_visits)
    (SCREENSHOTS / "audit.json").write_text(json.dumps(audit, indent=1))
    assert set(audit["pages"]) == set(browser_visits)
    too_wide = {p: [f for f in v["figures"] if f["shown"] > 0 and f["shown"] > f["natural"] + 1]
                for p, v in browser_visits.items()}
    assert not any(too_wide.values()), too_wide


def test_every_formula_is_typeset_from_the_build(browser_visits):
    """MathJax (served by the build) typeset every formula: no raw TeX left in the visible text,
    every .math element holds an mjx-container, no MathJax error."""
    bad = {}
    for page, v in browser_visits.items():
        problems = [f"raw {t!r} in the text" for t in RAW_TEX if t in v["text"]]
        if v["math"] and not (v["mathjax"] and v["typeset"]):
            problems.append(f"{v['math']} formulas but MathJax did not run")
        problems += [f"not typeset: {m}" for m in v["untypeset"][:3]] + [f"MathJax error: {m}" for m in v["math_errors"]]
        if problems:
            bad[page] = problems
    assert not bad, bad
    assert sum(v["typeset"] for v in browser_visits.values()) > 0, "no formula anywhere in the book"


def test_every_internal_link_resolves(site, browser_visits):
    """Each link to a page of the site answers 200, and its #anchor exists in the target."""
    import urllib.error
    import urllib.parse
    import urllib.request

    _, origin, _ = site
    fetched = {}

    def fetch(url):
        if url not in fetched:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    body = r.read().decode("utf-8", "replace")
                    fetched[url] = (r.status, set(re.findall(r'\b(?:id|name)="([^"]+)"', body)))
            except urllib.error.HTTPError as err:
                fetched[url] = (err.code, set())
        return fetched[url]

    bad = {}
    for page, v in browser_visits.items():
        for href in set(v["links"]):
            if not href.startswith(origin + "/"):
                continue
            url, _, anchor = href.partition("#")
            status, ids = fetch(url)
            if status != 200:
                bad.setdefault(page, []).append(f"{href}: HTTP {status}")
            elif anchor and urllib.parse.unquote(anchor) not in ids:
                bad.setdefault(page, []).append(f"{href}: no anchor #{anchor}")
    assert not bad, bad


def test_navigation_lists_every_chapter_on_every_page(site, browser_visits):
    _, origin, pages = site
    expected = {f"{origin}/{p}.html" for p in pages}
    bad = {p: missing for p, v in browser_visits.items()
           if (missing := sorted(expected - {h.partition("#")[0] for h in v["nav"]}))}
    assert not bad, bad


def test_no_page_requests_anything_from_another_host(site, browser_visits):
    """Every request a page made (DevTools network log and the Resource Timing API) went to the
    local server: scripts, styles, fonts, MathJax and images all come from the build."""
    _, origin, _ = site
    local = (origin + "/", "data:", "blob:", "about:")
    bad = {p: remote for p, v in browser_visits.items()
           if (remote := sorted({u for u in v["requests"] + v["resources"] if not u.startswith(local)}))}
    assert not bad, bad
    assert all(any(u.endswith(".js") or ".js?" in u for u in v["requests"]) for v in browser_visits.values())


def test_built_pages_reference_nothing_on_another_host(site):
    """Static counterpart of the browser check, over every HTML file of the build (not only the toc's):
    no script, style, image or frame is loaded from another host, and no stylesheet imports a remote
    url(). Links (<a href>) to the web are allowed. MathJax is served from _static/mathjax/."""
    html, _, _ = site
    bad = [str(f.relative_to(html)) for f in html.rglob("*.html") if REMOTE_TAG.search(f.read_text(errors="replace"))]
    bad += [str(f.relative_to(html)) for f in (html / "_static").rglob("*.css")
            if re.search(r"url\(\s*[\"']?(?:https?:)?//", f.read_text(errors="replace"))]
    assert not bad, bad
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()
    twice = [str(f.relative_to(html)) for f in html.rglob("*.html") if f.read_text(errors="replace").count("const THEBE_JS_URL") > 1]
    assert not twice, f"inline script written twice (fedlib.runner.book._one_copy_of_each_inline_script): {twice}"
    assert re.search(r'src="\.\./\.\./_static/mathjax/tex-chtml\.js(\?v=\w+)?"',
                     (html / "book" / "executed" / "afl_derivation.html").read_text())


def test_readme_and_first_page_say_how_to_open_the_built_book():
    for doc in [REPO / "README.md", REPO / "book" / "intro.md"]:
        text = doc.read_text()
        assert "_build/html/index.html" in text and "http.server -d _build/html" in text, doc.name
    assert "make html" in (REPO / "README.md").read_text()


def test_make_test_installs_the_browser_first():
    rules = {m.group(1): m.group(2).split() for m in re.finditer(r"^([\w-]+):([^=\n]*)$", (REPO / "Makefile").read_text(), re.M)}
    assert "browser" in rules["test"] and "browser" in rules
    assert "chromium-driver" in (REPO / "Makefile").read_text()


def test_publishing_workflow_runs_make_all_and_deploys_the_html():
    """.github/workflows/book.yml (it cannot run here): its one build command is `make all`, and it
    publishes what `make all` builds (_build/html) with the GitHub Pages actions."""
    import yaml

    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "book.yml").read_text())["jobs"]
    build = jobs["build"]["steps"]
    runs = [s["run"] for s in build if "run" in s]
    assert runs[-1] == "make all" and not any("jupyter-book" in r or "fedlib.runner" in r for r in runs)
    upload = next(s for s in build if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    assert jobs["deploy"]["needs"] == "build"
    assert any(s.get("uses", "").startswith("actions/deploy-pages@") for s in jobs["deploy"]["steps"])
    assert re.search(r"^all: book$", (REPO / "Makefile").read_text(), re.M)
