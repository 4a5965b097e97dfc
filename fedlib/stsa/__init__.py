"""STSA / STSA-E (Guan et al.), federated class-incremental learning by spatial-temporal statistics
aggregation: the paper's algorithm (:mod:`~fedlib.stsa.algorithm`), its opt-in speed paths
(:mod:`~fedlib.stsa.speed`), what goes beyond the paper (:mod:`~fedlib.stsa.beyond`), the chapters' studies
(:mod:`~fedlib.stsa.studies`), the paper's printed tables (:mod:`~fedlib.stsa.tables`), the chapters'
parameter specs (:mod:`~fedlib.stsa.specs`), self-checks (:mod:`~fedlib.stsa.selfcheck`) and the benchmark
(``python -m fedlib.stsa.bench``)."""
