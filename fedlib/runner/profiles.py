"""Profiles and the notebook runner: jupytext -> papermill -> executed notebook for the book.

A profile (``smoke``, ``quick``, ``paper``) gives the parameter values of every notebook, in the
one versioned file ``notebooks/profiles.yml``. ``run_notebook`` converts ``notebooks/NAME.py``
(jupytext percent format) to ipynb, executes it with papermill using the profile's values plus
any override, and writes ``book/executed/NAME.ipynb`` where the book reads it. The run goes to a
scratch file that replaces the chapter only when every cell ran: a cell that raises makes papermill
raise, the chapter already in the book is left as it was, and the failed run is kept under
``FAILED_DIR`` for inspection (the book's Sphinx extension also refuses any executed notebook that
holds an error).

Command line (:mod:`fedlib.runner.cli`)::

    python -m fedlib.runner afl_benchmark --profile quick alpha=0.05 num_clients=300
    python -m fedlib.runner all --profile smoke
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import yaml

from fedlib.core.paths import BENCHMARK_DIR, EXECUTED_DIR, FAILED_DIR, NOTEBOOK_DIR, PROFILE_FILE, REPO  # noqa: F401
from fedlib.evaluation import claims
from fedlib.runner import memory, specs


class _Loader(yaml.SafeLoader):
    """YAML as PyYAML reads it, plus floats written without a dot (``1e-6``, ``2E3``): YAML 1.1, which
    PyYAML follows, reads those as strings; YAML 1.2 and Python read them as numbers."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def read_yaml(text):
    """``text`` (a string or an open file) read as YAML with :class:`_Loader`."""
    return yaml.load(text, Loader=_Loader)


def load_profiles(path: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{profile: {notebook: {parameter: value}}}`` from the versioned profiles file."""
    path = path or PROFILE_FILE
    with open(path) as f:
        data = read_yaml(f)
    if not isinstance(data, dict) or "profiles" not in data:
        raise ValueError(f"{path} must hold a top-level 'profiles' mapping")
    return data["profiles"]


def notebook_names() -> list[str]:
    """Chapters in the order the book builds them (``notebooks/profiles.yml``: ``order``)."""
    with open(PROFILE_FILE) as f:
        return list(read_yaml(f)["order"])


def chapter_after() -> dict[str, list[str]]:
    """``{chapter: [chapters it must come after]}`` (``notebooks/profiles.yml``: ``after``): a chapter
    that reads a cache another chapter writes waits for it when chapters run side by side."""
    with open(PROFILE_FILE) as f:
        return dict(read_yaml(f).get("after") or {})


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
        out[key.strip()] = read_yaml(value)
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


def measured_durations(profile: str) -> dict[str, float]:
    """``{chapter: seconds}`` measured at ``profile`` and committed (``notebooks/profiles.yml``:
    ``durations``), so that a fresh clone also schedules its longest chapters first."""
    with open(PROFILE_FILE) as f:
        table = (read_yaml(f).get("durations") or {}).get(profile) or {}
    return {name: float(seconds) for name, seconds in table.items()}


def last_duration(name: str, profile: str) -> float | None:
    """Seconds the chapter's executed notebook in the book took at ``profile`` (papermill's record);
    without one (first run, or a run at another profile) the committed measurement
    (:func:`measured_durations`), or None."""
    path = EXECUTED_DIR / f"{name}.ipynb"
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get("papermill", {})
    except (OSError, ValueError):
        meta = {}
    if meta.get("parameters", {}).get("profile") != profile or meta.get("duration") is None:
        return measured_durations(profile).get(name)
    return float(meta["duration"])


def cell_timings(path: Path, top: int | None = None) -> list[tuple[int, float, str]]:
    """Papermill's per-cell record of an executed notebook: ``(cell number, seconds, first source
    line)`` of its code cells, slowest first (``top``: only that many)."""
    cells = json.loads(Path(path).read_text())["cells"]
    rows = []
    for i, cell in enumerate(cells):
        seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell.get("cell_type") == "code" and seconds is not None:
            source = "".join(cell.get("source", "")).strip().splitlines()
            rows.append((i, float(seconds), source[0][:80] if source else ""))
    rows.sort(key=lambda r: -r[1])
    return rows[:top] if top else rows


REGISTERS_A_CLAIM = "claims.register("
GLUED = "scrapbook"   # the output metadata of myst_nb.glue(name, value, display=False): a value for the text


def _finish(notebook_json: str, profile: str, overrides: Mapping[str, Any] | None) -> str:
    """The executed notebook with the run's profile and overrides in its metadata (the claims ledger
    shows them beside each verdict) and its ``parameters`` cell (the notebook's own defaults) tagged
    ``hide-input``: the book folds it, and shows papermill's ``injected-parameters`` cell (the values
    this run used) open, instead of two parameter cells one after the other. A cell that registers a
    claim is plumbing: its code is removed from the page (``remove-input``) and so is its return
    value's repr; the verdict box it displays stays. A cell that writes prose (values or Markdown
    glued with ``myst_nb.glue`` and shown by ``{glue:text}`` roles or a ``{glue:md}`` directive in
    the Markdown cell after it, parsed as MyST so that its math is typeset) has its code removed when
    prose is all it outputs, folded (``hide-input``) when it also shows a table or a figure."""
    nb = json.loads(notebook_json)
    nb.setdefault("metadata", {})[claims.RUN_KEY] = {"profile": profile, "overrides": dict(overrides or {})}
    for cell in nb["cells"]:
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if "parameters" in tags and "hide-input" not in tags:
            tags.append("hide-input")
        if cell["cell_type"] == "code" and REGISTERS_A_CLAIM in "".join(cell.get("source", "")):
            if "remove-input" not in tags:
                tags.append("remove-input")
            cell["outputs"] = [o for o in cell.get("outputs", []) if o.get("output_type") != "execute_result"]
        shown = [o for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
        prose = [o for o in shown if "text/markdown" in o.get("data", {}) or GLUED in o.get("metadata", {})]
        if cell["cell_type"] == "code" and prose and not {"remove-input", "hide-input"} & set(tags):
            tags.append("remove-input" if len(prose) == len(cell["outputs"]) else "hide-input")
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def run_notebook(name: str, profile: str = "quick", overrides: Mapping[str, Any] | None = None,
                 output: Path | None = None, cwd: Path | None = None, progress: bool | dict = True) -> Path:
    """Execute one chapter at ``profile`` with ``overrides``; return the executed notebook's path.
    ``progress``: a per-cell bar on stderr (chapter, cell, elapsed, estimated time left); a dict adds
    tqdm options (``{"position": 1}``: the second row, when chapters run side by side)."""
    import papermill

    params = resolve_parameters(name, profile, overrides)
    params["profile"] = profile
    memory.check_fits(name, {**notebook_parameters(name), **params})   # refuse, with the numbers, what cannot fit
    output = Path(output) if output else EXECUTED_DIR / f"{name}.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = output.with_name(f".{output.name}.partial")   # same folder: os.replace is atomic
    with tempfile.TemporaryDirectory(prefix=f"fedlib-{name}-") as tmp, _kernel_files_in(Path(tmp) / "kernel"):
        source = to_ipynb(name, Path(tmp) / f"{name}.ipynb")
        # execute into a scratch file; the chapter is replaced only when every cell ran
        scratch = Path(tmp) / f"{name}.executed.ipynb"
        try:
            bar = ({"desc": f"[{profile}] {name}", "unit": "cell", "leave": True,
                    **(progress if isinstance(progress, dict) else {})} if progress else False)
            papermill.execute_notebook(str(source), str(scratch), parameters=params, kernel_name="python3",
                                       cwd=str(cwd or NOTEBOOK_DIR), progress_bar=bar, log_output=False)
        except Exception:
            if scratch.exists():  # keep the failed run for inspection, away from the book
                failed = FAILED_DIR / f"{name}.ipynb"
                failed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(scratch, failed)
                print(f"[{profile}] {name} failed; {output} left unchanged; failed run: {failed}",
                      file=sys.stderr, flush=True)
            raise
        try:
            staged.write_text(_finish(scratch.read_text(), profile, overrides))
            os.replace(staged, output)
        finally:
            staged.unlink(missing_ok=True)
    return output


@contextlib.contextmanager
def _kernel_files_in(path: Path):
    """Jupyter's runtime folder and this process's temporary files (the kernel's connection file is a
    ``tempfile``) inside the run's scratch folder while it runs, so that a stopped run leaves none behind."""
    path.mkdir()
    before = os.environ.get("JUPYTER_RUNTIME_DIR"), tempfile.tempdir
    os.environ["JUPYTER_RUNTIME_DIR"], tempfile.tempdir = str(path), str(path)
    try:
        yield
    finally:
        tempfile.tempdir = before[1]
        if before[0] is None:
            os.environ.pop("JUPYTER_RUNTIME_DIR", None)
        else:
            os.environ["JUPYTER_RUNTIME_DIR"] = before[0]
