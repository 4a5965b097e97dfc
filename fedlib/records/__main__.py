"""``python -m fedlib.records NAME [--profile quick] [name=value ...]``: run a recorded comparison and
write ``book/records/NAME.json``.

The parameters are the chapter's at ``--profile`` (checked by its typed specification), then the
record's own defaults (its converged budget), then the ``name=value`` overrides; ``--out`` writes
elsewhere (the tests use it). Every record: :data:`RECORDS`.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time

from fedlib.evaluation.records import write_record
from fedlib.records import afl, refed, stsa
from fedlib.runner.profiles import notebook_parameters, parse_overrides, resolve_parameters

RECORDS = {"afl_converged": afl, "refed_resolved": refed, "stsa_converged": stsa}


def parameters(name: str, profile: str, overrides: dict) -> dict:
    """The chapter's parameters of record ``name`` at ``profile`` with the record's defaults and ``overrides``."""
    module = RECORDS[name]
    chosen = {**module.DEFAULTS, **overrides}
    return {**notebook_parameters(module.CHAPTER), **resolve_parameters(module.CHAPTER, profile, chosen),
            "profile": profile}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.records", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(RECORDS))
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--out", default=None, help="folder of the record (default: book/records)")
    parser.add_argument("overrides", nargs="*", help="name=value (YAML values), after the record's defaults")
    args = parser.parse_intermixed_args(argv)
    try:
        params = parameters(args.name, args.profile, parse_overrides(args.overrides))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = RECORDS[args.name].run(params)
    command = " ".join(["python -m fedlib.records", args.name, "--profile", args.profile,
                        *map(shlex.quote, args.overrides)])
    path = write_record(args.name, command, params, results, time.perf_counter() - t0, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
