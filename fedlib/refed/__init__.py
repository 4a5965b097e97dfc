"""Re-Fed (Li et al. 2024), replay caches chosen by importance for federated incremental learning: the
paper's algorithm (:mod:`~fedlib.refed.algorithm`), its theory (:mod:`~fedlib.refed.theory`), what goes
beyond the paper (:mod:`~fedlib.refed.beyond`), the chapters' studies (:mod:`~fedlib.refed.studies`), the
paper's printed tables (:mod:`~fedlib.refed.tables`), the chapters' parameter specs
(:mod:`~fedlib.refed.specs`), self-checks (:mod:`~fedlib.refed.selfcheck`) and the benchmark
(``python -m fedlib.refed.bench``)."""
