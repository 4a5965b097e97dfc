"""Sphinx extension of the book: exercise and theorem numbers that restart on every page, and
numbers fixed by the author (``sphinx: extra_extensions: [fedlib.runner.numbering]``).

Sphinx numbers the enumerable nodes (sphinx-exercise's exercises, sphinx-proof's theorems, lemmas,
...) with one counter per type that runs across the whole book unless the toctree is numbered (then
by section, ``numfig_secnum_depth``). This book's toctree is not numbered, so its exercises ran
from 1 to 40 across the chapters and a chapter's "Lemma 2" could be a paper's Lemma 1. Once Sphinx
has assigned its numbers (``env-get-updated``, after its toctree collector) this extension rewrites
them in ``env.toc_fignumbers``, the table that the HTML writer, ``{numref}``, sphinx-exercise's
titles and ``{prf:ref}`` all read, for the types of ``fedlib_page_numbered_types`` (default: the
exercise, the figure and every sphinx-proof type):

* the numbers restart at 1 on every page (each chapter is one page): Exercise 1, 2, ... in each
  chapter, in the order of the page;
* a node with the class ``number-N`` or ``number-N-M`` (``:class: number-3-1`` on the directive)
  gets the number N or N.M whatever its place: a statement taken from a paper keeps the paper's
  number ("Lemma 1", "Theorem 3.1"). The automatic numbers of that type on that page skip the
  numbers fixed there.
"""
from __future__ import annotations

import re

from docutils import nodes
from sphinx_proof.proof_type import PROOF_TYPES

FIXED = re.compile(r"^number-(\d+(?:-\d+)*)$")


def fixed_number(classes) -> tuple[int, ...] | None:
    """The number a ``number-3-1`` class fixes, ``(3, 1)``; None without such a class."""
    for c in classes or ():
        m = FIXED.match(c)
        if m:
            return tuple(int(x) for x in m.group(1).split("-"))
    return None


def page_numbers(ids: list[str], fixed: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Numbers of one type on one page: ``ids`` in page order, ``fixed`` the ids whose number is
    fixed; the others get 1, 2, ... skipping the one-part numbers fixed on the page."""
    taken = {fixed[i] for i in ids if i in fixed}
    out, k = {}, 0
    for i in ids:
        if i in fixed:
            out[i] = fixed[i]
            continue
        k += 1
        while (k,) in taken:
            k += 1
        out[i] = (k,)
    return out


def _types(config) -> set[str]:
    if config.fedlib_page_numbered_types is not None:
        return set(config.fedlib_page_numbered_types)
    return {"exercise", "figure", *PROOF_TYPES}


def _collect_fixed(app, doctree) -> None:
    """At read time: the fixed numbers of the page (id -> number), kept in the environment."""
    env = app.env
    found = {}
    for node in doctree.findall(nodes.Element):
        number = fixed_number(node.get("classes"))
        if number is not None and node.get("ids"):
            found[node["ids"][0]] = number
    store = env.__dict__.setdefault("fedlib_fixed_numbers", {})
    if found:
        store[env.docname] = found
    else:
        store.pop(env.docname, None)


def _purge(app, env, docname) -> None:
    env.__dict__.setdefault("fedlib_fixed_numbers", {}).pop(docname, None)


def _merge(app, env, docnames, other) -> None:
    store = env.__dict__.setdefault("fedlib_fixed_numbers", {})
    theirs = getattr(other, "fedlib_fixed_numbers", {})
    store.update({d: theirs[d] for d in docnames if d in theirs})


def _renumber(app, env) -> list[str]:
    """After Sphinx's numbering: per-page numbers for the chosen types; the pages that changed."""
    types = _types(app.config)
    fixed_all = getattr(env, "fedlib_fixed_numbers", {})
    changed = []
    for docname, table in env.toc_fignumbers.items():
        fixed = fixed_all.get(docname, {})
        for figtype in [t for t in table if t in types]:
            new = page_numbers(list(table[figtype]), fixed)
            if new != table[figtype]:
                table[figtype] = new
                changed.append(docname)
    return sorted(set(changed))


def setup(app):
    app.add_config_value("fedlib_page_numbered_types", None, "env")
    app.connect("doctree-read", _collect_fixed)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-get-updated", _renumber, priority=900)   # after Sphinx's TocTreeCollector (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
