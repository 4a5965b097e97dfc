"""Analytic Federated Learning (Zhuang et al. 2024): the paper's algorithm (:mod:`~fedlib.afl.algorithm`),
its opt-in speed paths (:mod:`~fedlib.afl.speed`), what goes beyond the paper (:mod:`~fedlib.afl.beyond`),
the chapters' studies (:mod:`~fedlib.afl.studies`), the paper's printed tables (:mod:`~fedlib.afl.tables`),
the chapters' parameter specs (:mod:`~fedlib.afl.specs`), self-checks (:mod:`~fedlib.afl.selfcheck`) and the
benchmark (``python -m fedlib.afl.bench``)."""
