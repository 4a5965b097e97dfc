"""The book's folding extension: the rest of a section goes into one closed <details>, with its
subsections and figures, and the page keeps what comes before the marker and after the section."""
import re

from sphinx.cmd.build import build_main

PAGE = """# Chapter

The answer, in view.

## Method

Kept in view.

:::{folded} The stopping rule, round by round
:::

Folded paragraph.

### A subsection

```{figure} pic.png
:name: fig-inside

Caption inside.
```

## Results

After the fold, in view.
"""


def build(tmp_path, page: str) -> str:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "conf.py").write_text("extensions = ['myst_parser', 'fedlib.runner.folding']\n"
                                 "myst_enable_extensions = ['colon_fence']\nnumfig = True\n")
    (src / "index.md").write_text(page)
    (src / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert build_main(["-q", "-b", "html", str(src), str(out)]) == 0
    return (out / "index.html").read_text()


def test_the_rest_of_a_section_is_folded_and_the_next_section_is_not(tmp_path):
    html = build(tmp_path, PAGE)
    body = re.search(r'<details class="fedlib-folded"><summary>(.*?)</summary>(.*?)</details>', html, re.S)
    assert body and body.group(1) == "The stopping rule, round by round"
    inside = body.group(2)
    assert "Folded paragraph." in inside and "A subsection" in inside and "Caption inside." in inside
    assert "Fig. 1" in inside                                   # the figure keeps its number
    assert "Kept in view." not in inside and "After the fold" not in inside
    assert html.index("Kept in view.") < html.index("<details") < html.index("After the fold")


def test_without_a_summary_the_fold_says_details(tmp_path):
    html = build(tmp_path, "# T\n\n## S\n\n:::{folded}\n:::\n\nHidden.\n")
    assert '<details class="fedlib-folded"><summary>Details</summary>' in html and "Hidden." in html


def test_an_unfold_marker_ends_the_fold_before_the_section_does(tmp_path):
    page = ("# T\n\n## S\n\nIntro.\n\n:::{folded} The runs\n:::\n\nRun log.\n\n:::{unfold}\n:::\n\n"
            "The verdict.\n\n## Next\n\nMore.\n")
    html = build(tmp_path, page)
    inside = re.search(r'<details class="fedlib-folded"><summary>The runs</summary>(.*?)</details>', html, re.S).group(1)
    assert "Run log." in inside and "The verdict." not in inside
    assert html.index("</details>") < html.index("The verdict.") < html.index("More.")
