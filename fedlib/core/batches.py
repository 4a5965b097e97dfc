"""Batches of a long evaluation or extraction: :func:`eval_chunks`."""
from __future__ import annotations

from fedlib.core.validate import check_int

EVAL_CHUNK = 256


def eval_chunks(n: int, size: int = EVAL_CHUNK) -> list[tuple[int, int]]:
    """[(start, stop)] of the evaluation forwards of n samples: one chunk when n <= ``size``, else
    ceil(n / size) chunks of nearly equal sizes (each >= size / 2). A whole test set in one forward
    was measured about 2x slower on the CPU (the first convolution's output leaves the cache), and
    chunks of this size give the same logits as one forward (much smaller chunks, and a single-sample
    forward, can differ in round-off on some CPUs: never made here unless n is that small)."""
    n, size = check_int("n", n, 0), check_int("size", size, 1)
    if n <= size:
        return [(0, n)] if n else []
    k = -(-n // size)
    bounds = [i * n // k for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:]))
