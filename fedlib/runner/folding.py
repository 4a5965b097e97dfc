"""Sphinx extension of the book: the rest of a section folded behind one line that opens it.

A chapter keeps its answer, its method and its main results in view and folds the depth a reader
may want only once (stopping rules, sweeps, diagnostics, checks), so that the page stays short. In a
Markdown cell (or in Markdown that a cell prints)::

    ## 4. How the stopping rule was checked

    One sentence that stays in view.

    :::{folded} The stopping rule, round by round
    :::

Everything after the marker up to the end of its section, the following cells, their outputs and
any subsections included, goes into one HTML ``<details>`` element whose summary is the directive's
argument (default "Details"): closed when the page opens, opened by a click, found by the browser's
search once open. Numbers of figures and exercises inside it are the page's as before; its
subsections leave the page's table of contents. A ``:::{unfold}`` marker later in the same section
ends the fold early: what follows it (a verdict, say) stays in view.
"""
from __future__ import annotations

from html import escape

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


class fold_marker(nodes.General, nodes.Element):
    """Where a section's folded rest begins (replaced by :class:`folded` once the page is read)."""


class unfold_marker(nodes.General, nodes.Element):
    """Where a fold ends before its section does (removed once the page is read)."""


class folded(nodes.General, nodes.Element):
    """The folded rest of a section; ``summary``: the line that opens it."""


class FoldedDirective(SphinxDirective):
    optional_arguments = 1
    final_argument_whitespace = True
    has_content = False

    def run(self):
        return [fold_marker(summary=self.arguments[0] if self.arguments else "Details")]


class UnfoldDirective(SphinxDirective):
    has_content = False

    def run(self):
        return [unfold_marker()]


def fold(doctree: nodes.Node) -> int:
    """Move every marker's later siblings, up to its section's end or the next ``unfold`` marker
    among them, into a :class:`folded` node in its place; the number folded. Markers are handled
    from the last to the first, so a marker folded into an earlier one's rest keeps its own fold."""
    markers = list(doctree.findall(fold_marker))
    for marker in reversed(markers):
        parent = marker.parent
        at = parent.index(marker)
        end = next((i for i in range(at + 1, len(parent)) if isinstance(parent[i], unfold_marker)), len(parent))
        rest = parent.children[at + 1:end]
        box = folded(summary=marker["summary"])
        del parent.children[at:end + 1 if end < len(parent) else end]   # the unfold marker goes too
        for child in rest:
            child.parent = None
        box.extend(rest)
        parent.insert(at, box)
    for stray in list(doctree.findall(unfold_marker)):   # an unfold without a fold before it
        stray.parent.remove(stray)
    return len(markers)


def _fold_doctree(app, doctree) -> None:
    fold(doctree)


def _visit_html(self, node) -> None:
    self.body.append(f'<details class="fedlib-folded"><summary>{escape(node["summary"])}</summary>\n')


def _depart_html(self, node) -> None:
    self.body.append("</details>\n")


def _pass(self, node) -> None:
    pass


def setup(app):
    app.add_node(fold_marker)
    app.add_node(unfold_marker)
    app.add_node(folded, html=(_visit_html, _depart_html), latex=(_pass, _pass), text=(_pass, _pass),
                 man=(_pass, _pass), texinfo=(_pass, _pass))
    app.add_directive("folded", FoldedDirective)
    app.add_directive("unfold", UnfoldDirective)
    # before Sphinx's collectors read the page (priority 500): its table of contents and figure numbers
    app.connect("doctree-read", _fold_doctree, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
