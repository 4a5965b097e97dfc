"""``python -m fedlib.flower {simulate,deploy,inprocess} PROTOCOL [key=value ...] [--out DIR]``.

Runs one of the four papers' protocols (afl, stsa, gradient, feddl, refed; options and defaults in
:data:`fedlib.flower.tasks.OPTIONS`) on Flower's simulation engine, on a SuperLink and SuperNodes
started on 127.0.0.1, or in-process (fedlib's simulator, for comparison); prints the report.
"""
import argparse
import json
import sys
import tempfile

from fedlib.flower.tasks import OPTIONS, PROTOCOLS, Task, parse_options


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.flower", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("simulate", "deploy", "inprocess"))
    parser.add_argument("protocol", choices=PROTOCOLS)
    parser.add_argument("options", nargs="*", help="key=value; keys: "
                        + "; ".join(f"{p}: {', '.join(o)}" for p, o in OPTIONS.items()))
    parser.add_argument("--out", default=None, help="folder for result.npz, report.json and logs (deploy)")
    args = parser.parse_args(argv)
    config = parse_options(args.protocol, " ".join(args.options))
    if args.engine == "inprocess":
        report = Task(config).run(progress=True).summary
    elif args.engine == "simulate":
        from fedlib.flower.engines import run_simulation_engine

        report = run_simulation_engine(config)[1]
    else:
        from fedlib.flower.engines import run_deployment

        out = args.out or tempfile.mkdtemp(prefix="fedlib-deploy-")
        report = run_deployment(config, out)[1]
        print(f"result and logs: {out}", file=sys.stderr)
    json.dump(report, sys.stdout, indent=1, default=float)
    print()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as err:   # bad options: one clear line, no traceback
        sys.exit(f"error: {err}")
