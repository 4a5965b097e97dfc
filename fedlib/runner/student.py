"""Student build of the book: the same pages with every ``{solution}`` removed.

``python -m fedlib.runner.student [BOOK_ROOT] [--out _build/student/html]`` (``make html-student``)
copies the book's ``_config.yml`` with sphinx-exercise's ``hide_solutions: True`` set, builds with
jupyter-book from the already executed notebooks (nothing is executed) and leaves the HTML in
``_build/student/html``. The exercises, their numbers and cross-references stay; the solution
text is not in the HTML at all (not merely collapsed), so the folder can be handed out as is.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml


def student_config(config: Path, out: Path) -> Path:
    """Write ``config`` (a jupyter-book ``_config.yml``) to ``out`` with ``hide_solutions: True``."""
    cfg = yaml.safe_load(Path(config).read_text()) or {}
    sphinx = cfg["sphinx"] = cfg.get("sphinx") or {}
    extensions = list(sphinx.get("extra_extensions") or [])
    if "sphinx_exercise" not in extensions:
        raise ValueError(f"{config}: sphinx.extra_extensions must list 'sphinx_exercise' for a student build; "
                         f"found {extensions}")
    sphinx["config"] = {**(sphinx.get("config") or {}), "hide_solutions": True}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return out


def build(root: Path = Path("."), out: Path | None = None, strict: bool = True) -> Path:
    """Build the student HTML of the book at ``root`` into ``out`` (default ``root/_build/student/html``)."""
    root = Path(root).resolve()
    if not (root / "_config.yml").exists():
        raise ValueError(f"root={root} has no _config.yml: pass the book's root folder")
    work = root / "_build" / "student"
    out = Path(out).resolve() if out is not None else work / "html"
    config = student_config(root / "_config.yml", work / "_config.yml")
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "--config", str(config),
           "--path-output", str(work)]
    if strict:
        cmd += ["-W", "--keep-going"]
    subprocess.run(cmd, check=True)
    built = work / "_build" / "html"
    if out != built:
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(built), str(out))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=".", help="book root (holds _config.yml and _toc.yml)")
    ap.add_argument("--out", default=None, help="HTML output folder (default ROOT/_build/student/html)")
    args = ap.parse_args(argv)
    out = build(Path(args.root), Path(args.out) if args.out else None)
    print(f"Student book (no solutions) built: {out / 'index.html'}")


if __name__ == "__main__":
    main()
