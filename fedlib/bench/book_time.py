"""The book's chapters: each chapter's execution time now against a recorded baseline run.

Reads papermill's record (``metadata.papermill.duration`` and the per-cell durations) of every
executed chapter in ``book/executed/`` and the baseline file (default
``book/benchmarks/book_time_baseline_quick.json``: the durations of a reference quick run,
saved from that run's executed notebooks, which are build outputs and not in git),
and prints per chapter the seconds before and now, their ratio, and the slowest cell now.
Both sides are durations recorded when the chapters ran (each run's own load: see the record of the
whole run, ``book/benchmarks/book_run_PROFILE.txt``), not runs in this process: the whole book
cannot run twice inside one benchmark in reasonable time. ``--save-baseline FILE`` writes the
current durations as a new baseline.

``--alone CHAPTER ...`` runs the named chapters instead, one after the other, each alone on the
machine as a reader re-executes one (``python -m fedlib.runner CHAPTER --profile PROFILE``, on the
data already cached), and reports each one's end-to-end seconds (runner start to finish), CPU
seconds and papermill duration against the baseline, with the machine's speed before and after
(:func:`fedlib.runner.schedule.reference_kernel_ms`) and, at ``quick``, the goal of at most 180 s each.

    python -m fedlib.bench.book_time [--baseline FILE] [--save-baseline FILE] [--out FILE]
    python -m fedlib.bench.book_time --alone CHAPTER [CHAPTER ...] [--profile quick] [--out FILE]

The report goes to ``book/benchmarks/book_time.txt``, with ``--alone`` to
``book/benchmarks/chapters_alone_PROFILE.txt``, unless ``--out`` names another file.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedlib.core.paths import BENCHMARK_DIR, EXECUTED_DIR
from fedlib.evaluation import benchmark as bench
from fedlib.runner.profiles import cell_timings, load_profiles, notebook_names
from fedlib.runner.schedule import reference_kernel_ms


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


ALONE_GOAL_S = 180.0     # the goal: any single chapter re-executed in at most 3 minutes


def run_chapter(name: str, profile: str, out: Path) -> tuple[float, float]:
    """Execute chapter ``name`` at ``profile`` into ``out`` with the runner in a child process; returns
    (wall seconds, CPU seconds of the child processes)."""
    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedlib.runner", name, "--profile", profile, "--output", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, cpu() - c0


def alone_report(names: list[str], profile: str, base: dict) -> list[str]:
    """Run every chapter of ``names`` alone (:func:`run_chapter`) and report it against ``base``."""
    width, goal = 22, profile == "quick"      # the 3-minute goal is the quick profile's
    speed = reference_kernel_ms()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = Path(tmp) / f"{name}.ipynb"
            wall, cpu = run_chapter(name, profile, out)
            seconds, _ = recorded(json.loads(out.read_text()))
            old = base.get("chapters", {}).get(name)
            before = (f"{old['seconds']:9.0f}", f"{seconds / old['seconds']:10.2f}x") \
                if old and old["profile"] == profile else (f"{'-':>9}", f"{'-':>11}")
            verdict = f"   {'yes' if wall <= ALONE_GOAL_S else 'NO'}" if goal else ""
            rows.append(f"  {name:<{width}}{before[0]}{seconds:8.0f}{before[1]}{wall:14.0f}{cpu:8.0f}{verdict}")
    return [f"baseline: {base.get('what', 'baseline')}",
            f"now: each chapter alone (python -m fedlib.runner CHAPTER --profile {profile}, data cached), "
            "one after the other",
            f"machine speed (fedlib.runner.schedule.reference_kernel_ms, lower is faster): {speed:.3f} ms before, "
            f"{reference_kernel_ms():.3f} ms after",
            f"  {'chapter':<{width}}{'before s':>9}{'now s':>8}{'now/before':>11}{'end-to-end s':>14}"
            f"{'CPU s':>8}" + (f"   at most {ALONE_GOAL_S:.0f} s end to end" if goal else ""), *rows]


def main(argv: list[str] | None = None) -> int:
    p = bench.parser(__doc__, "book_time", repeats=None, seed=None)
    p.add_argument("--baseline", type=Path, default=BENCHMARK_DIR / "book_time_baseline_quick.json",
                   help="JSON {what, chapters: {name: {seconds, profile}}} (default %(default)s)")
    p.add_argument("--save-baseline", type=Path, help="write the current durations there as a baseline and stop")
    p.add_argument("--alone", nargs="+", metavar="CHAPTER",
                   help="run these chapters one at a time and report them (instead of the book's executed chapters)")
    p.add_argument("--profile", default="quick", help="the profile of --alone (default %(default)s)")
    p.set_defaults(out=None)     # the default depends on the mode: the book's record must not be overwritten
    args = p.parse_args(argv)
    if args.out is None:
        args.out = (BENCHMARK_DIR / f"chapters_alone_{args.profile}.txt" if args.alone
                    else bench.default_out("book_time"))
    if args.alone:
        unknown = sorted(set(args.alone) - set(notebook_names()))
        if unknown:
            p.error(f"--alone: unknown chapter(s) {unknown}; allowed: {', '.join(notebook_names())}")
        if args.profile not in load_profiles():
            p.error(f"--profile: unknown profile {args.profile!r}; allowed: {', '.join(load_profiles())}")
        if not args.baseline.is_file():
            p.error(f"--baseline {args.baseline} does not exist")
        lines = alone_report(args.alone, args.profile, json.loads(args.baseline.read_text()))
        bench.write_report("\n".join(lines), args.out)
        return 0
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
