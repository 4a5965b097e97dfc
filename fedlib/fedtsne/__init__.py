"""Fed-tSNE, Fed-UMAP and Fed-SpeClust: federated distribution learning (FedDL) of landmarks, then a
Nystrom estimate of the global distance / kernel matrix (Qiao, Ma, Fan, AAAI 2025; seed 002;
notes: papers/fedtsne.md). Samples are ROWS here (the paper stores columns; notes Sec. 2.9).

Client p holds X_p (n_p, m), sum_p n_p = n. The server keeps n_y landmarks Y (n_y, m).

FedDL (Algorithm 1). Gaussian kernel k(x, y) = exp(-gamma ||x - y||^2). Local objective = the
unbiased (U-statistic) MMD^2 estimate (Eq. 10):

    f_p(Y) = (1^T K_XX 1 - n_p) / (n_p (n_p-1)) - 2 1^T K_XY 1 / (n_p n_y) + (1^T K_YY 1 - n_y) / (n_y (n_y-1))

and its gradient (Eq. 13, row-major):

    grad f_p(Y) = -4 gamma/(n_p n_y) [K_XY^T X_p - diag(1^T K_XY) Y] + 4 gamma/(n_y (n_y-1)) [K_YY Y - diag(1^T K_YY) Y]

Global objective F(Y) = sum_p w_p f_p(Y) (Eq. 8/11). ``mode="average"``: Q local steps
Y_p <- Y_p - eta grad f_p(Y_p) (Eq. 14), server Y = sum_p w_p Y_p (Eq. 15; the paper's w_p = 1/P).
``mode="gradient"``: Y <- Y - eta' sum_p w_p grad f_p(Y) (Eq. 16). With w_p = n_p/n (our default,
notes Sec. 8.2), sum_p w_p grad f_p = grad MMD_u(X_pooled, Y) exactly, whatever the split (notes
Sec. 2.2): gradient mode is then centralized gradient descent.

Protocol (:mod:`fedlib.core.protocol`). FedDL is :class:`FedDLClient` (set-up upload, then per round
the gradient / local landmarks of Eqs. 13-14 with the client's own noise from its own generator
:func:`client_rng`) and :class:`FedDLServer` (weights, gamma by THE kernel-width rule
:func:`kernel_width`, Y^0, the update of Eq. 15/16); the final upload of Algorithms 2-3 is
:class:`NystromClient` / :class:`NystromServer`. :func:`feddl` drives them with ``simulate`` and
reports the measured :class:`~fedlib.core.messages.Cost`.

Step size (the paper: "the reverse of the Lipschitz constant of the gradient if possible"). Bounding
the Hessian of g(u) = exp(-gamma ||u||^2) (eigenvalues in [-2 gamma, 4 gamma e^{-3/2}]) gives, for
any data and any Y (DERIVED here; sum_p w_p = 1),

    L <= (4 gamma / n_y) (n_y/(n_y-1) + 2 e^{-3/2}),       ``lr="auto"`` uses eta = 1/L.

Fed-tSNE / Fed-UMAP (Algorithm 2). Client p uploads D_p = squared distances to Y (n_p, n_y); the
server stacks B = [D_1; ...; D_P] (Eq. 21), W = D_YY (squared), and forms the Nystrom estimate
(Eqs. 19, 22)

    D2_hat = B W_k^+ B^T     (or B (W + lambda I)^{-1} B^T),

symmetrizes, clips at 0, zeroes the diagonal and takes the square root before t-SNE / UMAP. The
paper does not say whether D is squared; squared Euclidean distances have rank <= m + 2, so with
>= m + 2 landmarks in general position the estimate is EXACT (notes Sec. 8.3 and Sec. 3, "Nystrom
exactness"); plain distances never are. W is indefinite (a distance matrix), so W_k is the best
rank-k approximation by |eigenvalue|.

Fed-SpeClust (Algorithm 3). Client p uploads K_{X_p,Y} (n_p, n_y); K_hat = C W^+ C^T with
C = [K_{X_1,Y}; ...], W = K_YY; spectral clustering on clip_0(K_hat).

"+" variants (Sec. 5; notes Sec. 2.6, 3, 8.7). (epsilon, delta)-DP per client, replace-one adjacency,
client sizes public; noise calibrated and epsilon reported by :mod:`fedlib.core.privacy` (dp-accounting):

* ``noise="dp_data"`` (Theorem 4): rows clipped to a PUBLIC tau_X, then X_p <- X_p + N(0, s^2) once,
  before anything is uploaded, with s from the analytic Gaussian mechanism for Delta_2 = 2 tau_X (valid
  for every epsilon; the paper's Dwork & Roth constant, :func:`paper_noise_sd`, needs epsilon < 1).
* ``noise="dp_gradient"`` (Theorem 6's setting): every gradient a client computes gets N(0, (z Delta_p)^2),
  z calibrated once for T = S*Q compositions. Delta_p is the data-free bound
  :func:`kernel_gradient_sensitivity` = 4 sqrt(2 gamma/e) / (n_p sqrt(n_y)) (from
  sup_r r exp(-gamma r^2) = 1/sqrt(2 e gamma)), or Theorem 6's bound with enforced clipping and
  projection. gamma must be public and Y^0 data-free.
* ``noise="heuristic"`` (what the experiments did, Sec. 6.1): N(0, beta^2 sd(grad f_p)^2) with
  sd over all entries of that gradient, beta = 1 in the tables. Data-dependent; no epsilon.

Only data perturbation also covers the final D_p / K_p upload: from squared distances to known
landmarks the server recovers each sample (exactly with >= m + 1 landmarks in general position,
its projection onto the landmarks' affine span otherwise; :func:`reconstruct_from_sq_distances`,
notes Sec. 1 and 8.10).

Modules (one per part of the paper): :mod:`~fedlib.fedtsne.mmd` (Eqs. 9-13, the Lipschitz bound,
THE kernel-width rule), :mod:`~fedlib.fedtsne.dp` (Sec. 5, Theorems 4 and 6),
:mod:`~fedlib.fedtsne.feddl` (Algorithm 1 as a client program and a server on
:mod:`fedlib.core.protocol`, the plateau rule), :mod:`~fedlib.fedtsne.nystrom` (Eqs. 18-22, the
final upload and its assembly, the reconstruction attack, the estimate's kNN without the n x n matrix),
:mod:`~fedlib.fedtsne.knn` (exact blockwise kNN of a low-rank score matrix), :mod:`~fedlib.fedtsne.pipelines`
(Algorithms 2 and 3), :mod:`~fedlib.fedtsne.chapters` (data, splits, scorer of the chapters),
:mod:`~fedlib.fedtsne.checks` (the derivation chapter's numerical checks),
:mod:`~fedlib.fedtsne.studies` (the experiment loops and tables of the other chapters).
Every public name of those is importable from ``fedlib.fedtsne``; beyond the paper (issue 14),
:mod:`~fedlib.fedtsne.beyond` (the upload as projection + residual and the closed form of the
Nystrom estimate, estimators from the same upload, federated k-means landmarks, local placement) is
imported as a module.
"""
from __future__ import annotations

from fedlib.fedtsne.mmd import (
    sq_distances, gaussian_kernel, mmd2_u, mmd2_u_grad, lipschitz_bound, client_median_sqdist, split_clients,
    WEIGHTS, GAMMA_RULES, kernel_width, median_kernel_width, expected_gaussian_kernel)
from fedlib.fedtsne.dp import (
    dp_noise_sd, paper_noise_sd, data_sensitivity, gradient_sensitivity, kernel_gradient_sensitivity, clip_rows,
    project_spectral, DP_SENSITIVITIES, end_to_end_epsilon, DP_MECHANISMS)
from fedlib.fedtsne.feddl import (
    FedDLResult, feddl, MODES, INITS, NOISES, client_rng, median_seed, FedDLClient, FedDLServer, plateau_share,
    plateau_round, FedDLTrace, feddl_until_plateau, plateau_rounds, plateau_run, public_landmarks)
from fedlib.fedtsne.nystrom import (
    client_sq_distances, client_kernel, landmark_pinv, nystrom, distances_from_squared, nystrom_distances,
    nystrom_kernel, reconstruct_from_sq_distances, INVERSES, NystromClient, NystromServer, NYSTROM_KINDS,
    nystrom_estimate, landmark_pinv_factors, nystrom_knn)
from fedlib.fedtsne.knn import BLOCK_BYTES, blockwise_knn, exact_sq_knn, knn_graph, block_rows
from fedlib.fedtsne.pipelines import (
    PipelineResult, EmbeddingResult, ClusteringResult, fed_tsne, fed_umap, fed_spectral_clustering, METHOD_NAMES,
    FED_NAMES, VARIANTS, central_embedding, embed, learn_landmarks, DENSE_MAX_POINTS, SPECTRAL_NEIGHBORS)
from fedlib.fedtsne.chapters import (
    SPLITS, load_points, label_skew_parts, client_split, EmbeddingScorer, check_fits, privacy_table)
from fedlib.fedtsne.checks import (
    rel_error, mmd_unbiasedness, gradient_fd_error, gradient_identity_table, split_runs, objective_curves,
    theorem1_denominator, nystrom_exactness_table, landmark_quality_sweep, theorem2_table, kernel_nystrom_error,
    theorem6_inputs, sensitivity_audit, calibration_table, theorem4_validity, reconstruction_table, upload_leak,
    exact_rank_kernels, nystrom_rank_table, kernel_spectra, rank_summary, rank_study_holds, affine_projection)
from fedlib.fedtsne.studies import (
    privacy_variants, public_feddl, privacy_runs, paired_vs_reference, recovery_epsilon, nominal_epsilon, beta_runs,
    beta_table, beta_trend, SPLIT_LABELS, speclust_data, speclust_runs, split_invariance, setting_cells, cells_table,
    paired_cells, change_table, kernel_landmark_sweep, convergence_study, step_study, step_table, step_summary,
    converging_step, plateau_study, plateau_summary, gain_after, benchmark_runs, paired_differences,
    paired_metric_table, client_sweep, landmark_sweep, paper_drop, check_splits,
    distance_verdicts, gamma_control, late_gain_evidence, metric_tables, data_sizes, select_differences, sweep_feddl,
    SweepPlan, run_sweeps, main_run_rows, trace_embeddings)

__all__ = ["sq_distances", "gaussian_kernel", "mmd2_u", "mmd2_u_grad", "lipschitz_bound", "client_median_sqdist",
           "dp_noise_sd", "paper_noise_sd", "data_sensitivity", "gradient_sensitivity",
           "kernel_gradient_sensitivity", "clip_rows", "project_spectral", "DP_SENSITIVITIES", "FedDLResult",
           "feddl", "split_clients", "end_to_end_epsilon", "client_sq_distances", "client_kernel",
           "landmark_pinv", "nystrom", "distances_from_squared", "nystrom_distances", "nystrom_kernel",
           "PipelineResult", "EmbeddingResult", "ClusteringResult", "fed_tsne", "fed_umap",
           "fed_spectral_clustering",
           "reconstruct_from_sq_distances", "MODES", "WEIGHTS", "INITS", "NOISES", "INVERSES", "GAMMA_RULES",
           "DP_MECHANISMS", "kernel_width", "median_kernel_width", "client_rng", "median_seed", "FedDLClient",
           "FedDLServer", "NystromClient", "NystromServer", "NYSTROM_KINDS", "SPLITS", "load_points",
           "label_skew_parts", "client_split", "plateau_share", "plateau_round", "FedDLTrace",
           "feddl_until_plateau", "plateau_rounds", "plateau_run", "EmbeddingScorer", "METHOD_NAMES", "FED_NAMES", "VARIANTS",
           "expected_gaussian_kernel", "nystrom_estimate", "embed", "learn_landmarks", "public_landmarks",
           "check_fits", "privacy_table", "rel_error", "mmd_unbiasedness", "gradient_fd_error",
           "gradient_identity_table", "split_runs", "objective_curves", "theorem1_denominator",
           "nystrom_exactness_table", "landmark_quality_sweep", "theorem2_table", "kernel_nystrom_error",
           "theorem6_inputs", "sensitivity_audit", "calibration_table", "theorem4_validity", "reconstruction_table",
           "upload_leak", "privacy_variants", "public_feddl", "privacy_runs", "paired_vs_reference",
           "recovery_epsilon", "nominal_epsilon", "beta_runs", "beta_table", "beta_trend", "exact_rank_kernels",
           "nystrom_rank_table", "kernel_spectra", "rank_summary", "rank_study_holds", "affine_projection",
           "SPLIT_LABELS", "speclust_data", "speclust_runs", "split_invariance", "setting_cells", "cells_table",
           "paired_cells", "change_table", "kernel_landmark_sweep",
           "convergence_study", "step_study", "step_table", "step_summary", "converging_step", "plateau_study",
           "plateau_summary", "gain_after", "benchmark_runs",
           "paired_differences", "paired_metric_table", "client_sweep", "landmark_sweep", "paper_drop", "check_splits",
           "distance_verdicts", "gamma_control", "late_gain_evidence", "metric_tables", "data_sizes",
           "select_differences", "landmark_pinv_factors", "nystrom_knn", "BLOCK_BYTES", "blockwise_knn",
           "exact_sq_knn", "knn_graph", "block_rows", "DENSE_MAX_POINTS", "SPECTRAL_NEIGHBORS", "sweep_feddl",
           "SweepPlan", "run_sweeps", "main_run_rows", "trace_embeddings"]
