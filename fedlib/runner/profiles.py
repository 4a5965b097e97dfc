"""Profiles and the notebook runner: jupytext -> papermill -> executed notebook for the book.

A profile (``smoke``, ``quick``, ``paper``) gives the parameter values of every notebook, in the
one versioned file ``notebooks/profiles.yml``. ``run_notebook`` converts ``notebooks/NAME.py``
(jupytext percent format) to ipynb, executes it with papermill using the profile's values plus
any override, and writes ``book/executed/NAME.ipynb`` where the book reads it. The run goes to a
scratch file that replaces the chapter only when every cell ran: a cell that raises makes papermill
raise, the chapter already in the book is left as it was, and the failed run is kept under
``FAILED_DIR`` for inspection (the book's Sphinx extension also refuses any executed notebook that
holds an error).

Command line::

    python -m fedlib.runner afl_benchmark --profile quick alpha=0.05 num_clients=300
    python -m fedlib.runner all --profile smoke
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from fedlib.runner import specs
from fedlib.runner.paths import EXECUTED_DIR, FAILED_DIR, NOTEBOOK_DIR, PROFILE_FILE, REPO  # noqa: F401


def load_profiles(path: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{profile: {notebook: {parameter: value}}}`` from the versioned profiles file."""
    path = path or PROFILE_FILE
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or "profiles" not in data:
        raise ValueError(f"{path} must hold a top-level 'profiles' mapping")
    return data["profiles"]


def notebook_names() -> list[str]:
    """Chapters in the order the book builds them (``notebooks/profiles.yml``: ``order``)."""
    with open(PROFILE_FILE) as f:
        return list(yaml.safe_load(f)["order"])


def notebook_parameters(name: str) -> dict[str, Any]:
    """Default values of the cell tagged ``parameters`` in ``notebooks/NAME.py``."""
    source = _notebook_path(name).read_text()
    match = re.search(r'^# %%[^\n]*tags=\[[^\]]*"parameters"[^\]]*\][^\n]*\n(.*?)(?=^# %%)', source,
                      re.S | re.M)
    if not match:
        raise ValueError(f"notebooks/{name}.py has no cell tagged 'parameters'")
    params: dict[str, Any] = {}
    for node in ast.parse(match.group(1)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            params[node.targets[0].id] = ast.literal_eval(node.value)
    return params


def _notebook_path(name: str) -> Path:
    path = NOTEBOOK_DIR / f"{name}.py"
    if not path.exists():
        known = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.py"))
        raise ValueError(f"unknown notebook {name!r}; allowed: {', '.join(known)}")
    return path


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["alpha=0.05", "seeds=[0,1]"]`` -> ``{"alpha": 0.05, "seeds": [0, 1]}`` (values read as YAML)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like name=value")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def resolve_parameters(name: str, profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The profile's values for notebook ``name`` updated by ``overrides``; every name is checked
    against the notebook's parameters cell before anything runs."""
    profiles = load_profiles()
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; allowed: {', '.join(profiles)}")
    defaults = notebook_parameters(name)
    params = dict(profiles[profile].get(name, {}))
    params.update(overrides or {})
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for notebook {name!r}; "
                         f"allowed: {', '.join(defaults)}")
    specs.check(name, {**defaults, **params, "profile": profile})   # typed checks, before any work
    return params


def to_ipynb(name: str, dest: Path) -> Path:
    """Convert ``notebooks/NAME.py`` to ipynb with a python3 kernelspec (papermill needs one)."""
    import jupytext

    nb = jupytext.read(_notebook_path(name))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    jupytext.write(nb, dest, fmt="ipynb")
    return dest


def run_notebook(name: str, profile: str = "quick", overrides: Mapping[str, Any] | None = None,
                 output: Path | None = None, cwd: Path | None = None) -> Path:
    """Execute one chapter at ``profile`` with ``overrides``; return the executed notebook's path."""
    import papermill

    params = resolve_parameters(name, profile, overrides)
    params["profile"] = profile
    output = Path(output) if output else EXECUTED_DIR / f"{name}.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = to_ipynb(name, Path(tmp) / f"{name}.ipynb")
        # execute into a scratch file; the chapter is replaced only when every cell ran
        scratch = Path(tmp) / f"{name}.executed.ipynb"
        try:
            papermill.execute_notebook(str(source), str(scratch), parameters=params, kernel_name="python3",
                                       cwd=str(cwd or NOTEBOOK_DIR), progress_bar=False, log_output=False)
        except BaseException:
            if scratch.exists():  # keep the failed run for inspection, away from the book
                failed = FAILED_DIR / f"{name}.ipynb"
                failed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(scratch, failed)
                print(f"[{profile}] {name} failed; {output} left unchanged; failed run: {failed}",
                      file=sys.stderr, flush=True)
            raise
        staged = output.with_name(f".{output.name}.partial")   # same folder: os.replace is atomic
        shutil.copyfile(scratch, staged)
        os.replace(staged, output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", help="notebook name (notebooks/NAME.py) or 'all'")
    parser.add_argument("overrides", nargs="*", help="parameter overrides name=value (YAML values)")
    parser.add_argument("--profile", default="quick", help="smoke, quick or paper (default quick)")
    parser.add_argument("--output", type=Path, help="executed notebook path (one notebook only)")
    args = parser.parse_intermixed_args(argv)
    overrides = parse_overrides(args.overrides)
    if args.notebook == "all" and (overrides or args.output):
        raise ValueError("parameter overrides and --output apply to one notebook; name it instead of 'all'")
    names = notebook_names() if args.notebook == "all" else [args.notebook]
    for name in names:  # validate every name before any long work
        resolve_parameters(name, args.profile, overrides)
    for name in names:
        t0 = time.perf_counter()
        out = run_notebook(name, args.profile, overrides, args.output)
        print(f"[{args.profile}] {name}: {time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return 0


def cli(argv: list[str] | None = None) -> None:
    """``python -m fedlib.runner``: bad input and failed cells end in a one-line error, no traceback."""
    try:
        sys.exit(main(argv))
    except ValueError as err:  # bad input: a clear message, no traceback
        sys.exit(f"error: {err}")
    except Exception as err:
        if type(err).__name__ != "PapermillExecutionError":
            raise
        sys.exit(f"error: a cell raised {err.ename}: {err.evalue}\n(the chapter in the book is unchanged; "
                 f"the failed run is in {FAILED_DIR})")


if __name__ == "__main__":
    cli()
