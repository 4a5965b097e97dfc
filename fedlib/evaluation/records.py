"""Recorded runs: a comparison too long for the book's default profile, run once by a command
anyone can repeat, its output committed under ``book/records/NAME.json``.

A record holds the command, the machine, the date, the commit, the parameters and the results; a
chapter reads it with :func:`load_record` and shows it, and a claim whose verdict rests on it names
it (``claims.register(..., record=NAME)``).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from fedlib.core.paths import RECORD_DIR, REPO

__all__ = ["machine", "commit", "write_record", "load_record", "record_caption", "record_source", "differences", "union"]
FIELDS = ("name", "command", "machine", "date", "commit", "seconds", "parameters", "results")


def machine() -> str:
    """This machine in one line: CPU, cores, accelerator, torch version."""
    cpu = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        cpu = model
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def commit() -> str:
    """The repository's HEAD, short ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_record(name: str, command: str, parameters: dict[str, Any], results: dict[str, Any], seconds: float,
                 folder: Path | None = None, **provenance: Any) -> Path:
    """Write ``folder/NAME.json`` (default ``book/records``) atomically and return its path.
    ``provenance`` replaces the fields this process would fill (``machine``, ``date``, ``commit``) or
    adds others (``parts``: the commands of a run made as several processes)."""
    folder = Path(folder) if folder is not None else RECORD_DIR
    folder.mkdir(parents=True, exist_ok=True)
    rec = {"name": name, "command": command, "machine": machine(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": commit(), "seconds": round(float(seconds), 1), "parameters": parameters, "results": results,
           **provenance}
    path = folder / f"{name}.json"
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_text(json.dumps(rec, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_record(name: str, folder: Path | None = None, missing_ok: bool = False) -> dict[str, Any] | None:
    """The record ``NAME`` (every field of :data:`FIELDS` present); when it is missing, None with
    ``missing_ok``, else FileNotFoundError naming the command that writes it."""
    path = (Path(folder) if folder is not None else RECORD_DIR) / f"{name}.json"
    if not path.exists():
        if missing_ok:
            return None
        raise FileNotFoundError(f"no recorded run {path}; write it with: python -m fedlib.records {name}")
    rec = json.loads(path.read_text())
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise ValueError(f"record {path} lacks {', '.join(missing)}")
    return rec


def record_caption(rec: dict[str, Any]) -> str:
    """One sentence on where a record comes from: command, machine, date, time taken."""
    split = f", as {len(rec['parts'])} processes side by side" if rec.get("parts") else ""
    return (f"Recorded run `{rec['name']}`: `{rec['command']}`, run on {rec['date']} ({rec['machine']}; "
            f"{rec['seconds'] / 60:.0f} min{split}).")


def record_source(rec: dict[str, Any] | None, mismatch: list[str], own: str) -> str:
    """The sentence that says what a chapter's verdict rests on: the record (:func:`record_caption`)
    when ``mismatch`` (:func:`differences`) is empty, else why not and ``own`` (its own runs)."""
    if not mismatch:
        return record_caption(rec)
    why = "There is no recorded run" if rec is None else f"The recorded run used other parameters ({', '.join(mismatch[:4])})"
    return f"{why}, so what follows rests on {own}."


def union(a: Any, b: Any, where: str = "results") -> Any:
    """Two parts' results as one: dictionaries merged key by key, any other value present in both
    equal (floats to 1e-9 relative); a disagreement -> ValueError naming where."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: union(a[k], v, f"{where}[{k!r}]") if k in a else v for k, v in b.items()}}
    same = (math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) if all(isinstance(v, float) for v in (a, b)) else a == b)
    if not same:
        raise ValueError(f"the parts disagree at {where}: {a!r} against {b!r}")
    return a


def differences(rec: dict[str, Any] | None, params: dict[str, Any], keys) -> list[str]:
    """The names among ``keys`` whose value in ``params`` (a chapter's run) differs from the record's
    (all of them when there is no record): a record is the evidence for a chapter's claim only where
    it ran the same data, model and seeds."""
    return list(keys) if rec is None else [k for k in keys if rec["parameters"].get(k) != params.get(k)]
