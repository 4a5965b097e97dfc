"""The book's chapters: each chapter's execution time now against a recorded baseline run.

Reads papermill's record (``metadata.papermill.duration`` and the per-cell durations) of every
executed chapter in ``book/executed/`` and the baseline file (default
``book/benchmarks/book_time_baseline_quick.json``: the durations of the quick run before the
speed-up work, saved from that run's executed notebooks, which are build outputs and not in git),
and prints per chapter the seconds before and now, their ratio, and the slowest cell now.
Both sides are durations recorded when the chapters ran (each run's own load: see the record of the
whole run, ``book/benchmarks/book_run_PROFILE.txt``), not runs in this process: the whole book
cannot run twice inside one benchmark in reasonable time. ``--save-baseline FILE`` writes the
current durations as a new baseline.

    python -m fedlib.bench.book_time [--baseline FILE] [--save-baseline FILE] [--out FILE]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from fedlib import bench
from fedlib.runner.paths import BENCHMARK_DIR, EXECUTED_DIR
from fedlib.runner.profiles import cell_timings, notebook_names


def recorded(notebook: dict) -> tuple[float | None, str | None]:
    """(papermill's duration of the whole notebook, its profile) or (None, None)."""
    meta = notebook.get("metadata", {}).get("papermill", {})
    return meta.get("duration"), meta.get("parameters", {}).get("profile")


def current() -> dict[str, dict]:
    """``{chapter: {"seconds", "profile"}}`` of the executed chapters in the book."""
    out = {}
    for name in notebook_names():
        path = EXECUTED_DIR / f"{name}.ipynb"
        seconds, profile = recorded(json.loads(path.read_text())) if path.exists() else (None, None)
        if seconds is not None:
            out[name] = {"seconds": round(seconds, 1), "profile": profile}
    return out


def main(argv: list[str] | None = None) -> int:
    p = bench.parser(__doc__, "book_time", repeats=None, seed=None)
    p.add_argument("--baseline", type=Path, default=BENCHMARK_DIR / "book_time_baseline_quick.json",
                   help="JSON {what, chapters: {name: {seconds, profile}}} (default %(default)s)")
    p.add_argument("--save-baseline", type=Path, help="write the current durations there as a baseline and stop")
    args = p.parse_args(argv)
    now_all = current()
    if args.save_baseline:
        args.save_baseline.write_text(json.dumps({"what": "papermill durations of the executed chapters",
                                                  "chapters": now_all}, indent=1) + "\n")
        return 0
    if not args.baseline.is_file():
        p.error(f"--baseline {args.baseline} does not exist")
    base = json.loads(args.baseline.read_text())
    width = 22
    lines = [f"baseline: {base.get('what', args.baseline.name)}",
             "now: the executed chapters in the book (papermill's recorded durations)",
             f"  {'chapter':<{width}}{'before s':>9}{'now s':>8}{'now/before':>11}   slowest cell now"]
    before_sum = now_sum = 0.0
    for name in notebook_names():
        old, new = base.get("chapters", {}).get(name), now_all.get(name)
        if old is None or new is None or old["profile"] != new["profile"]:
            lines.append(f"  {name:<{width}}{'-':>9}{'-':>8}{'-':>11}   (not comparable: missing or another profile)")
            continue
        slow = cell_timings(EXECUTED_DIR / f"{name}.ipynb", top=1)
        cell = f"{slow[0][1]:.0f} s  {slow[0][2][:40]}" if slow else ""
        before, now = old["seconds"], new["seconds"]
        lines.append(f"  {name:<{width}}{before:9.0f}{now:8.0f}{now / before:10.2f}x   {cell}")
        before_sum, now_sum = before_sum + before, now_sum + now
    if before_sum:
        lines.append(f"  {'sum (comparable)':<{width}}{before_sum:9.0f}{now_sum:8.0f}{now_sum / before_sum:10.2f}x")
    bench.write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
