"""Fed-tSNE, Fed-UMAP and Fed-SpeClust (Qiao et al. 2025): federated distribution learning (FedDL) and the
Nystrom estimate of all pairwise distances, then t-SNE / UMAP / spectral clustering on it.

* :mod:`~fedlib.fedtsne.algorithm`: the paper's algorithm (Eqs. 10-16, 21-22; FedDL's and the Nystrom
  step's clients and servers); :mod:`~fedlib.fedtsne.speed` its opt-in speed paths.
* :mod:`~fedlib.fedtsne.mmd` (kernel primitives, kernel-width rules), :mod:`~fedlib.fedtsne.dp` (the "+"
  variants' privacy: clipping, sensitivities, calibration), :mod:`~fedlib.fedtsne.nystrom` (the estimate's
  middle factor, its k nearest neighbours), :mod:`~fedlib.fedtsne.knn`.
* :mod:`~fedlib.fedtsne.feddl` (:func:`~fedlib.fedtsne.feddl.feddl` drives FedDL; the plateau rule),
  :mod:`~fedlib.fedtsne.pipelines` (Fed-tSNE, Fed-UMAP, Fed-SpeClust end to end).
* the chapters: :mod:`~fedlib.fedtsne.chapters` (data, splits, scorer), :mod:`~fedlib.fedtsne.checks` (the
  derivation chapter's checks), :mod:`~fedlib.fedtsne.studies` (the other chapters' experiments),
  :mod:`~fedlib.fedtsne.beyond` (beyond the paper), :mod:`~fedlib.fedtsne.tables` (the paper's printed
  tables), :mod:`~fedlib.fedtsne.specs` (parameters), the benchmarks ``python -m fedlib.fedtsne.bench_speed``
  and ``bench_scale``.
"""
