"""Sphinx extension of the book (``sphinx: extra_extensions: [fedlib.runner.book]`` in ``_config.yml``).

When the build starts it
1. refuses any executed notebook that holds an error output (or that papermill marked as failed):
   a failed run must never reach the book, whoever wrote the file;
2. writes the claims ledger table (``fedlib_claims_table``), the book's findings table
   (``fedlib_findings_table``, on the intro page) and each chapter's findings (``fedlib_findings_dir``,
   included on its first screen) from the claims registered in the executed notebooks
   (``fedlib_executed_dir``), so these pages show what ran.

Before the pages are written it also keeps one copy of each inline script (see
``_one_copy_of_each_inline_script``): without it every page raises a SyntaxError in the browser.
"""
from __future__ import annotations

import json
from pathlib import Path

from sphinx.errors import ExtensionError

from fedlib.evaluation import claims
from fedlib.runner.profiles import notebook_names


def notebook_errors(path: Path) -> list[str]:
    """Why ``path`` must not be rendered: error outputs (ename: evalue) or papermill's failure flag."""
    nb = json.loads(Path(path).read_text())
    found = [f"{o.get('ename', 'error')}: {str(o.get('evalue', ''))[:200]}"
             for c in nb.get("cells", []) if c.get("cell_type") == "code"
             for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if nb.get("metadata", {}).get("papermill", {}).get("exception") and not found:
        found.append("papermill marked the run as failed")
    return found


def _on_builder_inited(app) -> None:
    src = Path(app.srcdir)
    executed = src / app.config.fedlib_executed_dir
    bad = {p.name: errs for p in sorted(executed.glob("*.ipynb")) if (errs := notebook_errors(p))}
    if bad:
        detail = "; ".join(f"{name}: {errs[0]}" for name, errs in bad.items())
        raise ExtensionError(f"executed notebook(s) with errors must not be rendered: {detail}. "
                             "Re-run them (python -m fedlib.runner NAME) or delete them.")
    table = src / app.config.fedlib_claims_table
    table.parent.mkdir(parents=True, exist_ok=True)
    order = notebook_names()
    extra = sorted(p.stem for p in executed.glob("*.ipynb") if p.stem not in order)
    records = claims.collect(executed, order + extra)
    _write_if_changed(table, claims.ledger_markdown(records))
    _write_if_changed(src / app.config.fedlib_findings_table, claims.findings_markdown(records))
    for name in order + extra:   # each chapter's first screen includes its own findings
        _write_if_changed(src / app.config.fedlib_findings_dir / f"{name}.md",
                          claims.chapter_findings_markdown([r for r in records if r["chapter"] == name]))


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless ``path`` holds it already (an unchanged file keeps Sphinx from re-reading pages)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _one_copy_of_each_inline_script(app, env) -> None:
    """Sphinx 7.4 writes an inline script that an extension adds after the builder started twice:
    ``app.add_js_file(None, body=...)`` gives the builder an asset named ``None``, and
    ``prepare_writing`` adds the registry's copy again named ``''``, which does not compare equal.
    sphinx-thebe's ``const THEBE_JS_URL = ...`` then runs twice on every page (a SyntaxError in the
    console). Renaming ``None`` to ``''`` here, after reading and before writing, lets Sphinx's own
    de-duplication drop the second copy."""
    from sphinx.builders.html._assets import _JavaScript

    scripts = getattr(app.builder, "_js_files", None)
    if scripts is not None:
        scripts[:] = [_JavaScript("", priority=s.priority, **s.attributes) if s.filename is None else s
                      for s in scripts]


def setup(app):
    app.add_config_value("fedlib_executed_dir", "book/executed", "env")
    app.add_config_value("fedlib_claims_table", "book/generated/claims_table.md", "env")
    app.add_config_value("fedlib_findings_table", "book/generated/findings_table.md", "env")
    app.add_config_value("fedlib_findings_dir", "book/generated/findings", "env")
    app.connect("builder-inited", _on_builder_inited)
    app.connect("env-updated", _one_copy_of_each_inline_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
