"""The harness of every benchmark (scripts that print speed ratios against a baseline run in the same
process: ``python -m fedlib.afl.bench``, ``fedlib.bench.extraction`` ...; see each module's docstring).
Not tests: nothing here asserts a time; the book shows their output (``book/benchmarks/NAME.txt``).

- :func:`parser` -- argparse with the common options ``--out`` (default
  ``fedlib.core.paths.BENCHMARK_DIR / "NAME.txt"``; ``--out -`` prints only), ``--seed`` and
  ``--repeats``; :func:`require_positive` rejects options below 1 by name.
- :func:`timed` (one call), :func:`measure` (warm-up, then ``repeats`` interleaved rounds of
  several methods; best and median of each as a :class:`Timing`).
- :func:`ratio_rows` (each method's time over the baseline's), :func:`row` (one aligned report
  line), :func:`machine` (the machine line), :func:`peak_memory_gib`, :func:`relative_error` (max |a - b| / max |b|,
  from :mod:`fedlib.evaluation.compare`).
- :func:`check_row` (an agreement check: value, tolerance, passed or FAILED); :func:`finish`
  (peak-memory line, :func:`write_report`, exit code) ends every ``main``.
- :func:`write_report` prints the report and writes it to ``--out``; :func:`read_rows` reads its rows
  back (with :func:`leading_number`).
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch

from fedlib.core.linalg import relative_error
from fedlib.core.paths import BENCHMARK_DIR

__all__ = ["parser", "require_positive", "default_out", "timed", "Timing", "measure", "ratio_rows", "row",
           "check_row", "machine", "peak_memory_gib", "relative_error", "write_report", "finish", "read_rows",
           "leading_number"]


def default_out(name: str) -> Path:
    """Where benchmark ``name`` writes its report by default: ``BENCHMARK_DIR / f"{name}.txt"``."""
    return BENCHMARK_DIR / f"{name}.txt"


def parser(doc: str, name: str, *, repeats: int | None = 3, seed: int | None = 0) -> argparse.ArgumentParser:
    """An ArgumentParser for benchmark ``name`` described by the first paragraph of ``doc``, with the
    common options ``--out`` (see :func:`default_out`; ``-`` prints only), ``--seed`` (unless ``seed``
    is None) and ``--repeats`` (unless ``repeats`` is None). Each benchmark adds its own options."""
    p = argparse.ArgumentParser(prog=f"python -m fedlib.bench.{name}", description=doc.split("\n\n")[0])
    p.add_argument("--out", default=str(default_out(name)),
                   help="write the report to this file too (default %(default)s; '-' prints only)")
    if seed is not None:
        p.add_argument("--seed", type=int, default=seed)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help="timed runs per method (best / median)")
    return p


def require_positive(p: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """``p.error`` (exit 2, naming the option) for each option of ``names`` whose value is < 1."""
    for n in names:
        if getattr(args, n) < 1:
            p.error(f"--{n.replace('_', '-')} must be >= 1, got {getattr(args, n)}")


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """``(fn(), wall-clock seconds)``."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


@dataclass
class Timing:
    """The wall-clock seconds of every timed run of one method, and the output of the last one."""

    times: list[float] = field(default_factory=list)
    out: object = None

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def measure(methods: Mapping[str, Callable[[], object]], repeats: int = 3, warmup: bool = True) -> dict[str, Timing]:
    """Time every method of ``methods`` (label -> zero-argument callable) ``repeats`` times.

    One untimed warm-up call each first (``warmup``: tracing, allocator, BLAS threads), then
    ``repeats`` rounds, interleaved (a, b, c, a, b, c, ...) so that load from other processes hits
    all methods alike. Returns label -> :class:`Timing`.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup:
        for fn in methods.values():
            fn()
    out = {label: Timing() for label in methods}
    for _ in range(repeats):
        for label, fn in methods.items():
            out[label].out, t = timed(fn)
            out[label].times.append(t)
    return out


def row(label: str, value: str, width: int = 44) -> str:
    """One report line: two spaces, ``label`` left-aligned in ``width`` columns, ``value``."""
    return f"  {label:<{width}}{value}"


def read_rows(path, width: int = 44) -> dict[str, str]:
    """The rows of a written report (:func:`row`'s lines): label -> value text, for a chapter that
    cites a committed benchmark (its numbers then come from the file, not from typed text)."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("  ") and not line.startswith("   ") and len(line) > width + 2:
            rows[line[2:width + 2].rstrip()] = line[width + 2:].strip()
    return rows


def leading_number(text: str) -> float:
    """The number a report value starts with (``"0.7745  (ratio 0.923)"`` -> 0.7745)."""
    return float(text.split()[0].rstrip("x"))


def ratio_rows(seconds: Mapping[str, float], baseline: str, width: int = 44, note: str = "",
               fmt: str = ".1f") -> list[str]:
    """The ratio-to-baseline table: one :func:`row` ``time ratio LABEL / BASELINE   R.Rx`` per method
    of ``seconds`` (label -> seconds) other than ``baseline``, the ratio formatted with ``fmt``;
    ``note`` is appended to every line."""
    if baseline not in seconds:
        raise ValueError(f"baseline {baseline!r} is not one of the methods {list(seconds)}")
    base = seconds[baseline]
    return [row(f"time ratio {label} / {baseline}", f"{t / base:{fmt}}x{'  ' + note if note else ''}", width)
            for label, t in seconds.items() if label != baseline]


def check_row(label: str, value: float, tol: float, detail: str, width: int = 44) -> str:
    """:func:`row` of an agreement check: ``VALUE  (DETAIL; check < TOL: passed)`` (or ``FAILED``)."""
    return row(label, f"{value:.2e}  ({detail}; check < {tol:g}: {'passed' if value < tol else 'FAILED'})", width)


def machine(**extra: object) -> str:
    """``machine: ARCH, N CPUs, torch T threads, key value, ...`` (``extra`` appended in order)."""
    parts = [platform.machine(), f"{os.cpu_count()} CPUs", f"{torch.get_num_threads()} torch threads"]
    parts += [f"{k.replace('_', ' ')} {v}" for k, v in extra.items()]
    return "machine: " + ", ".join(parts)


def peak_memory_gib() -> float:
    """Peak resident memory of this process in GiB (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def write_report(report: str, out) -> None:
    """Print a benchmark report and, unless ``out`` is empty or ``"-"``, write it there (folders created)."""
    print(report)
    if out and str(out) != "-":
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(report + "\n")


def finish(lines: list[str], out, ok: bool = True, width: int = 44) -> int:
    """End a benchmark's ``main``: append the peak-memory row, :func:`write_report` the lines to
    ``out``, return the exit code (0 when every check passed, else 1)."""
    write_report("\n".join([*lines, row("peak resident memory", f"{peak_memory_gib():.2f} GiB", width)]), out)
    return 0 if ok else 1
