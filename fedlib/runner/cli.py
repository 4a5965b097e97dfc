"""``python -m fedlib.runner NAME|all --profile P [name=value ...]``: execute chapters for the book
(:func:`fedlib.runner.profiles.run_notebook`, one at a time or side by side with
:mod:`fedlib.runner.schedule`), print the slowest cells (``--timings``) or the memory estimate
(``--estimate``)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from fedlib.core.paths import BENCHMARK_DIR, EXECUTED_DIR, FAILED_DIR
from fedlib.core.processes import Family, Stopped, exit_code, stop_on_signals
from fedlib.runner import memory, schedule
from fedlib.runner.profiles import (cell_timings, chapter_after, last_duration, notebook_names, notebook_parameters,
                                    parse_overrides, resolve_parameters)
from fedlib.runner.schedule import minutes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.runner", description="Execute chapters for the book at a profile (smoke, quick, paper).")
    parser.add_argument("notebook", help="notebook name (notebooks/NAME.py) or 'all'")
    parser.add_argument("overrides", nargs="*", help="parameter overrides name=value (YAML values)")
    parser.add_argument("--profile", default="quick", help="smoke, quick or paper (default quick)")
    parser.add_argument("--output", type=Path, help="executed notebook path (one notebook only)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="chapters executed side by side (default 1; 2 on a 2-core machine at quick)")
    parser.add_argument("--timings", action="store_true",
                        help="print the slowest cells of each executed chapter in the book and stop")
    parser.add_argument("--estimate", action="store_true",
                        help="print each chapter's peak-memory estimate (fedlib.runner.memory) and stop")
    args = parser.parse_intermixed_args(argv)
    overrides = parse_overrides(args.overrides)
    if args.notebook == "all" and (overrides or args.output):
        raise ValueError("parameter overrides and --output apply to one notebook; name it instead of 'all'")
    names = notebook_names() if args.notebook == "all" else [args.notebook]
    if args.timings:
        for name in names:
            path = args.output or EXECUTED_DIR / f"{name}.ipynb"
            if not path.exists():
                print(f"{name}: not executed yet ({path})")
                continue
            rows = cell_timings(path)
            print(f"{name}: {sum(r[1] for r in rows):.0f} s in {len(rows)} code cells; slowest:")
            for i, seconds, head in rows[:5]:
                print(f"  cell {i:3d} {seconds:7.1f} s  {head}")
        return 0
    if args.estimate:
        for name in names:
            est = memory.estimate(name, {**notebook_parameters(name), **resolve_parameters(name, args.profile, overrides)})
            terms = "; ".join(f"{k}: {memory.gib(b)}" for k, b in {**est.host, **est.device}.items())
            print(f"[{args.profile}] {name}: host {memory.gib(est.host_bytes)}, GPU {memory.gib(est.device_bytes)}"
                  + (f" ({terms})" if terms else ""))
        return 0
    for name in names:  # validate every name and its memory before any long work
        params = resolve_parameters(name, args.profile, overrides)
        memory.check_fits(name, {**notebook_parameters(name), **params})
    kernel_before = schedule.reference_kernel_ms() if args.notebook == "all" else None
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    if args.jobs != 1:
        if args.output:
            raise ValueError("--output names one executed notebook; it cannot be used with --jobs")
        times = schedule.run_chapters(names, args.profile, args.jobs, chapter_after(),
                                      {n: last_duration(n, args.profile) for n in names}, overrides)
    else:
        times = {}
        for i, name in enumerate(names):
            print(f"[{args.profile}] chapter {i + 1}/{len(names)}: {name}; {_estimate(names[i:], args.profile)}",
                  file=sys.stderr, flush=True)
            _, seconds, cpu = schedule.timed_chapter(name, args.profile, overrides, output=args.output)
            times[name] = (seconds, cpu)
            out = args.output or EXECUTED_DIR / f"{name}.ipynb"
            print(f"[{args.profile}] {name}: {seconds:.0f} s -> {out} "
                  f"(elapsed {minutes(time.perf_counter() - start)})", flush=True)
    if args.notebook == "all":   # the record of a whole-book run, shown in the book (reproduce.md)
        wall = time.perf_counter() - start
        print(schedule.write_record(BENCHMARK_DIR / f"book_run_{args.profile}.txt", args.profile, args.jobs, times,
                                    wall, load_before, (kernel_before, schedule.reference_kernel_ms())),
              end="", flush=True)
    return 0


def _estimate(remaining: list[str], profile: str) -> str:
    """"about T left (from the last runs)" over the chapters still to run, one at a time."""
    return schedule.time_left(remaining, {n: last_duration(n, profile) for n in remaining})


def cli(argv: list[str] | None = None) -> None:
    """``python -m fedlib.runner``: bad input and failed cells end in a one-line error, no traceback.
    SIGINT, SIGTERM and SIGHUP stop every process the run started (workers, kernels and theirs),
    remove its scratch folders and print one line (exit code 128 + the signal's number)."""
    family = Family()
    family.mark()
    try:
        with stop_on_signals(first=family.signal):   # the chapters' workers clean up as this process does
            code = main(argv)
    except (Stopped, KeyboardInterrupt) as err:
        family.stop()
        print(f"{str(err) or 'stopped by SIGINT'}: every chapter run stopped, its scratch files removed; a chapter "
              f"that was running is left in the book as it was", file=sys.stderr)
        sys.exit(exit_code(err))
    except (ValueError, MemoryError) as err:  # bad input or a run that cannot fit: a clear message, no traceback
        sys.exit(f"error: {err}")
    except Exception as err:
        if type(err).__name__ != "PapermillExecutionError":
            raise
        sys.exit(f"error: a cell raised {err.ename}: {err.evalue}\n(the chapter in the book is unchanged; "
                 f"the failed run is in {FAILED_DIR})")
    finally:
        family.stop()
    sys.exit(code)

