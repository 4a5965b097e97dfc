"""``python -m fedlib.records NAME [--profile quick] [name=value ...]``: run a recorded comparison and
write ``book/records/NAME.json``.

The parameters are the chapter's at ``--profile`` (checked by its typed specification), then the
record's own defaults (its converged budget), then the ``name=value`` overrides; ``--out`` writes
elsewhere (the tests use it). Every record: :data:`RECORDS`.

``--split``: the same run as one process per value of the record's ``SPLIT_BY`` parameter (a method,
say), side by side on the machine's cores, merged into one record
that names the parts' commands. ``--merge PART.json ...`` merges part records made by hand: every part
must have run the same parameters but for the record's ``SPLIT`` ones, its slice inside the whole, and
together they must cover the whole run (the record's ``covered``).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedlib.core.paths import RECORD_DIR
from fedlib.core.processes import Family, Stopped, exit_code, stop_on_signals
from fedlib.evaluation.records import FIELDS, union, write_record
from fedlib.evaluation.records import commit as records_commit   # the name commit is a local below
from fedlib.records import afl, refed, refed_pim, stsa
from fedlib.runner.profiles import notebook_parameters, parse_overrides, resolve_parameters

RECORDS = {"afl_converged": afl, "refed_pim": refed_pim, "refed_resolved": refed, "stsa_converged": stsa}


def parameters(name: str, profile: str, overrides: dict) -> dict:
    """The chapter's parameters of record ``name`` at ``profile`` with the record's defaults and ``overrides``,
    and the record's own parameters (its ``OWN``, checked by its ``check``): ValueError before any work."""
    module = RECORDS[name]
    own_defaults = getattr(module, "OWN", {})
    own = {**own_defaults, **{k: v for k, v in overrides.items() if k in own_defaults}}
    chosen = {**module.DEFAULTS, **{k: v for k, v in overrides.items() if k not in own_defaults}}
    params = {**notebook_parameters(module.CHAPTER), **resolve_parameters(module.CHAPTER, profile, chosen),
              **own, "profile": profile}
    if own:
        module.check(params)
    return params


def merge_parts(name: str, params: dict, parts: list[dict]) -> dict:
    """The results of the run of record ``name`` at ``params`` from ``parts`` (records that each ran a
    slice of it): ValueError if a part is another record, ran other parameters than ``params`` outside
    the record's ``SPLIT`` ones or a value outside the whole, or if the parts leave some of it out."""
    module = RECORDS[name]
    if not hasattr(module, "SPLIT"):
        raise ValueError(f"{name} is not run in parts")
    for part in parts:
        missing = [f for f in FIELDS if f not in part]
        if missing:
            raise ValueError(f"a part lacks {', '.join(missing)}")
        if part["name"] != name:
            raise ValueError(f"part {part['command']!r} is a run of {part['name']}, not {name}")
        p = part["parameters"]
        other = sorted(k for k in set(p) | set(params) if k not in module.SPLIT and p.get(k) != params.get(k))
        if other:
            raise ValueError(f"part {part['command']!r} ran other {', '.join(other)} than the whole run")
        outside = [k for k in module.SPLIT if not set(p[k]) <= set(params[k])]
        if outside:
            raise ValueError(f"part {part['command']!r} ran {', '.join(outside)} outside the whole run")
    results = parts[0]["results"]
    for part in parts[1:]:
        results = union(results, part["results"])
    module.covered(params, results)
    return results


def run_split(name: str, profile: str, overrides: list[str], params: dict, folder: Path) -> list[dict]:
    """Run record ``name`` as one process per value of its ``SPLIT_BY`` parameter, side by side; their
    records (parts), read back from a temporary folder under ``folder`` that is always removed, with
    every process stopped (a failed part -> RuntimeError)."""
    module = RECORDS[name]
    family = Family()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-parts-", dir=folder) as tmp:
        try:
            procs = [subprocess.Popen([sys.executable, "-m", "fedlib.records", name, "--profile", profile, *overrides,
                                       *(f"{k}={json.dumps(v)}" for k, v in module.part(params, value).items()),
                                       "--out", f"{tmp}/{i}"], env=family.env())
                     for i, value in enumerate(params[module.SPLIT_BY])]
            failed = [i for i, proc in enumerate(procs) if proc.wait() != 0]
        finally:
            family.stop()
        if failed:
            raise RuntimeError(f"part(s) {failed} of {name} failed (their output is above)")
        return [json.loads((Path(tmp) / str(i) / f"{name}.json").read_text()) for i in range(len(procs))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.records", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(RECORDS))
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--out", default=None, help="folder of the record (default: book/records)")
    parser.add_argument("--split", action="store_true", help="one process per value of the record's SPLIT_BY")
    parser.add_argument("--merge", nargs="+", metavar="PART", default=None,
                        help="part records (JSON) of this run made as several processes: merge them")
    parser.add_argument("overrides", nargs="*", help="name=value (YAML values), after the record's defaults")
    args = parser.parse_intermixed_args(argv)
    command = " ".join(["python -m fedlib.records", args.name, "--profile", args.profile,
                        *map(shlex.quote, args.overrides), *(["--split"] if args.split else [])])
    try:
        params = parameters(args.name, args.profile, parse_overrides(args.overrides))
        if args.split and not hasattr(RECORDS[args.name], "SPLIT_BY"):
            raise ValueError(f"{args.name} is not run in parts")
        if args.merge:
            parts = [json.loads(Path(path).read_text()) for path in args.merge]
            results = merge_parts(args.name, params, parts)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.split:
        try:
            with stop_on_signals():
                parts = run_split(args.name, args.profile, args.overrides, params,
                                  Path(args.out) if args.out else RECORD_DIR)
        except (Stopped, KeyboardInterrupt) as err:
            return exit_code(err)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        results = merge_parts(args.name, params, parts)
    if args.merge or args.split:   # the parts ran side by side: the run took as long as the longest
        first = parts[0]
        path = write_record(args.name, command, params, results, max(p["seconds"] for p in parts), args.out,
                            machine=first["machine"], date=first["date"], commit=first["commit"],
                            parts=[p["command"] for p in parts])
        print(f"wrote {path}")
        return 0
    t0, commit = time.perf_counter(), records_commit()   # the code that ran: the commit at the start
    results = RECORDS[args.name].run(params)
    path = write_record(args.name, command, params, results, time.perf_counter() - t0, args.out, commit=commit)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
