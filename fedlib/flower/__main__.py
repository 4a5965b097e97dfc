"""``python -m fedlib.flower {simulate,deploy,inprocess} PROTOCOL [key=value ...] [--out DIR] [--run-timeout S]``.

Runs one of the four papers' protocols (afl, stsa, gradient, feddl, refed; options and defaults in
:data:`fedlib.flower.tasks.OPTIONS`) on Flower's simulation engine, on a SuperLink and SuperNodes
started on 127.0.0.1, or in-process (fedlib's simulator, for comparison); prints the report.

Bad options and failed runs end in one line on stderr (exit code 1). SIGINT, SIGTERM and SIGHUP stop
every process the command started (and theirs), remove its temporary files (a deployment's result
folder too, unless ``--out`` named it) and print one line (exit code 128 + the signal's number).
"""
import argparse
import json
import shutil
import sys
import tempfile

from fedlib.core.processes import Family, Stopped, exit_code, stop_on_signals
from fedlib.flower.tasks import OPTIONS, PROTOCOLS, Task, parse_options


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.flower", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("simulate", "deploy", "inprocess"))
    parser.add_argument("protocol", choices=PROTOCOLS)
    parser.add_argument("options", nargs="*", help="key=value; keys: "
                        + "; ".join(f"{p}: {', '.join(o)}" for p, o in OPTIONS.items()))
    parser.add_argument("--out", default=None, help="folder for result.npz, report.json and logs (deploy)")
    parser.add_argument("--run-timeout", type=float, default=None,
                        help="seconds the whole deployment may take (default: no limit; each round is bounded "
                             "by the option timeout)")
    args = parser.parse_args(argv)
    config = parse_options(args.protocol, " ".join(args.options))
    family = Family()
    family.mark()          # every process started from here on (Ray's, Flower's) is found and stopped at the end
    made = None
    try:
        with stop_on_signals():
            if args.engine == "inprocess":
                report = Task(config).run(progress=True).summary
            elif args.engine == "simulate":
                from fedlib.flower.engines import run_simulation_engine

                report = run_simulation_engine(config)[1]
            else:
                from fedlib.flower.engines import run_deployment

                out = args.out or (made := tempfile.mkdtemp(prefix="fedlib-deploy-"))
                report = run_deployment(config, out, run_timeout=args.run_timeout)[1]
                print(f"result and logs: {out}", file=sys.stderr)
    except (Stopped, KeyboardInterrupt) as err:
        family.stop()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        print(f"{str(err) or 'stopped by SIGINT'}: every process of the run stopped, its temporary files removed",
              file=sys.stderr)
        return exit_code(err)
    finally:
        family.stop()
    json.dump(report, sys.stdout, indent=1, default=float)
    print()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as err:   # bad options, a failed run: one clear line, no traceback
        sys.exit(f"error: {err}")
