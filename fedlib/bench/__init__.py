"""Benchmarks: scripts that print speed ratios against a baseline run in the same process.

``python -m fedlib.bench.afl_aggregation`` (see its docstring). Not tests: nothing here asserts
a time; the book shows their output.
"""


def write_report(report: str, out) -> None:
    """Print a benchmark report and, if ``out`` is a path, write it there (folders created)."""
    from pathlib import Path

    print(report)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(report + "\n")
