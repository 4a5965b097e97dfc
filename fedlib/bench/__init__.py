"""Benchmarks: scripts that print speed ratios against a baseline run in the same process.

``python -m fedlib.bench.afl_aggregation`` (see its docstring). Not tests: nothing here asserts
a time; the book shows their output.
"""
