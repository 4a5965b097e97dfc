"""Benchmarks of the shared machinery: scripts that print speed ratios against a baseline run in the same
process (``python -m fedlib.bench.extraction``, ``federated_batched``, ``flower``, ``book_time``). Each
paper's own benchmarks live in its folder (``python -m fedlib.afl.bench`` ...). Not tests: nothing here
asserts a time; the book shows their output (``book/benchmarks/NAME.txt``). The shared harness is
:mod:`fedlib.evaluation.benchmark`."""
