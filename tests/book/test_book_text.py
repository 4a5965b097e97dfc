"""The book speaks of the work only: no project history, no internal decision ids, no references to
files outside the repository. Every chapter source (``notebooks/*.py``: Markdown and printed
strings), every prose page (``book/*.md``, top level only) and every ``fedlib`` source file (its
docstrings are shown in the book) is scanned for the forbidden patterns; a failure names every
offending file:line, so they can all be fixed in one pass."""
import re

from fedlib.core.paths import REPO

FORBIDDEN = {
    "decision id": re.compile(r"\[D\d+\]"),
    "notes file": re.compile(r"papers/\w+\.md"),
    "paper version id": re.compile(r"version 000", re.IGNORECASE),
    "seed text": re.compile(r"seed text", re.IGNORECASE),
    "issue number": re.compile(r"issue \d+", re.IGNORECASE),
    "project history": re.compile(r"before this version", re.IGNORECASE),
}


def scanned_files():
    files = sorted((REPO / "notebooks").glob("*.py")) + sorted((REPO / "book").glob("*.md"))
    files += sorted((REPO / "fedlib").rglob("*.py"))
    return files


def test_the_scanned_files_exist():
    files = scanned_files()
    assert any(f.parent.name == "notebooks" for f in files)
    assert any(f.parent.name == "book" for f in files)
    assert any("fedlib" in f.parts for f in files)


def test_no_history_decision_ids_or_outside_files_in_the_book_sources():
    found = []
    for path in scanned_files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                match = pattern.search(line)
                if match:
                    found.append(f"{path.relative_to(REPO)}:{lineno}: {what} {match.group(0)!r}: {line.strip()}")
    assert not found, "text that is not about the work:\n" + "\n".join(found)


def test_every_chapter_folds_its_set_up_cell():
    """The imports and set-up (the cell that calls book_style()) are plumbing: folded (hide-input)."""
    import jupytext

    unfolded = []
    for path in sorted((REPO / "notebooks").glob("*.py")):
        setup = [c for c in jupytext.read(path).cells if c.cell_type == "code" and "book_style()" in c.source]
        if len(setup) != 1 or "hide-input" not in setup[0].metadata.get("tags", []):
            unfolded.append(path.name)
    assert not unfolded, unfolded


GLUED = re.compile(r"""\bglue\(\s*['"]([\w-]+)['"]""")
SHOWN_MD = re.compile(r"^# ```\{glue:md\} ([\w-]+)$", re.MULTILINE)
SHOWN_TEXT = re.compile(r"\{glue:text\}`([\w-]+)(?::[^`]*)?`")
SHOWN_MD_INLINE = re.compile(r"\{glue:md\}`([\w-]+)(?::[^`]*)?`")


def test_computed_prose_is_glued_into_markdown_cells():
    """A computed sentence enters the text through myst-nb's glue: the code cell glues its values or
    its Markdown (never displays Markdown), and Markdown cells show them, a number inline
    (``{glue:text}`key:.2f```), a phrase inline (``{glue:md}`key```) or a paragraph (``{glue:md}``
    block, each shown once); every glued key is
    shown and every shown key is glued in the same chapter (a missing key would fail the build)."""
    bad = []
    for path in sorted((REPO / "notebooks").glob("*.py")):
        src = path.read_text(encoding="utf-8")
        if "display(Markdown(" in src:
            bad.append(f"{path.name}: displays Markdown from a code cell")
        md, text = SHOWN_MD.findall(src), SHOWN_TEXT.findall(src) + SHOWN_MD_INLINE.findall(src)
        if len(md) != len(set(md)):
            bad.append(f"{path.name}: a glued paragraph is shown twice")
        if set(GLUED.findall(src)) != set(md) | set(text):
            bad.append(f"{path.name}: glued {sorted(set(GLUED.findall(src)))} but shown {sorted(set(md) | set(text))}")
    assert not bad, bad
    sources = [p.read_text() for p in (REPO / "notebooks").glob("*.py")]
    assert any(SHOWN_MD.search(s) for s in sources) and any(SHOWN_TEXT.search(s) for s in sources)

def test_no_markdown_paragraph_is_left_as_comments_in_a_code_cell():
    """A paragraph written as comments at the end of a code cell never reaches the reader (a code
    cell's comments are folded or removed with its code): prose with emphasis or math belongs in a
    Markdown cell."""
    bad = []
    for path in sorted((REPO / "notebooks").glob("*.py")):
        for cell in re.split(r"(?m)^(?=# %%)", path.read_text(encoding="utf-8")):
            if not cell.startswith("# %%") or cell.startswith("# %% [markdown]"):
                continue
            lines = cell.split("\n", 1)[-1].rstrip("\n").split("\n")
            tail = []
            for line in reversed(lines):
                if not line.startswith("#"):
                    break
                tail.append(line)
            if len(tail) >= 2 and any(re.search(r"\*\*|\$", line) for line in tail):
                bad.append(f"{path.name}: {tail[-1][:70]}")
    assert not bad, bad


def test_every_figure_coloured_by_method_uses_its_papers_colours():
    """A plot whose hue is the method takes its order and colours from ``style.method_hue``, so a method
    has one colour across its paper's figures."""
    bad = []
    for path in sorted((REPO / "notebooks").glob("*.py")):
        for call in re.findall(r"sns\.\w+\((?:[^()]|\([^()]*(?:\([^()]*\)[^()]*)*\))*\)", path.read_text(encoding="utf-8")):
            if 'hue="method"' in call and "method_hue(" not in call:
                bad.append(f"{path.name}: {call[:80]}")
    assert not bad, bad
