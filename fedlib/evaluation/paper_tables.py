"""Numbers printed in the papers, transcribed once, so the book can show them beside ours.

Every frame returned here holds **the paper's** numbers on the paper's datasets, never ours.
Source of each table: ``shared/papers/<paper>.md`` (transcribed from the seed texts).
"""
from __future__ import annotations

import pandas as pd

_AFL_METHODS = ["FedAvg", "FedProx", "MOON", "FedGen", "FedDyn", "FedNTD", "FedDisco", "AFL"]

# AFL v1, Table 2: top-1 accuracy (%), K = 100, mean over 3 runs (std omitted; AFL's is 0.00).
_AFL_TABLE2 = {
    ("CIFAR-10", "α=0.1"): [64.02, 64.07, 63.84, 64.14, 64.77, 64.64, 63.83, 80.75],
    ("CIFAR-10", "α=0.05"): [60.52, 60.39, 60.28, 60.65, 60.35, 61.16, 59.90, 80.75],
    ("CIFAR-10", "s=4"): [68.47, 68.46, 68.47, 68.24, 73.50, 70.24, 65.04, 80.75],
    ("CIFAR-10", "s=2"): [57.81, 57.61, 57.72, 57.02, 64.07, 58.77, 58.78, 80.75],
    ("CIFAR-100", "α=0.1"): [53.78, 53.77, 53.56, 53.47, 57.09, 53.58, 52.79, 58.56],
    ("CIFAR-100", "α=0.01"): [32.99, 33.37, 33.34, 33.09, 36.12, 32.59, 25.72, 58.56],
    ("CIFAR-100", "s=10"): [55.76, 55.80, 55.70, 60.93, 61.09, 54.69, 54.65, 58.56],
    ("CIFAR-100", "s=5"): [48.33, 48.29, 48.34, 48.12, 59.34, 47.00, 45.86, 58.56],
    ("Tiny-ImageNet", "α=0.1"): [43.54, 43.43, 43.50, 43.33, 46.10, 43.45, 43.48, 54.67],
    ("Tiny-ImageNet", "α=0.01"): [32.63, 32.26, 32.38, 32.33, 35.19, 31.86, 27.15, 54.67],
    ("Tiny-ImageNet", "s=10"): [39.06, 38.97, 38.79, 38.82, 41.36, 37.55, 38.86, 54.67],
    ("Tiny-ImageNet", "s=5"): [29.66, 29.17, 29.24, 29.37, 35.18, 29.01, 27.72, 54.67],
}


def afl_table2() -> pd.DataFrame:
    """AFL paper, Table 2 (%, K=100, ResNet-18 frozen; CIFAR-10/100, Tiny-ImageNet)."""
    frame = pd.DataFrame.from_dict(_AFL_TABLE2, orient="index", columns=_AFL_METHODS)
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["dataset (paper)", "setting"])
    return frame


def afl_table3() -> pd.DataFrame:
    """AFL paper, Table 3: CIFAR-100, K=100, accuracy (%) against heterogeneity."""
    return pd.DataFrame({"α=0.005": [24.74, 58.56], "α=0.01": [33.09, 58.56], "α=0.1": [53.86, 58.56],
                         "α=1": [57.72, 58.56], "IID": [57.89, 58.56]}, index=pd.Index(["FedAvg", "AFL"], name="method"))


def afl_table4() -> pd.DataFrame:
    """AFL paper, Table 4: RI ablation on CIFAR-100 (inferred), α=0.1; accuracy (%) w/o RI and w/ RI.

    'w/o RI' here means gamma > 0 never removed (joint ridge with λ = Kγ); '–' cells are NaN.
    """
    nan = float("nan")
    rows = {100: [58.56, nan, 58.54, 58.56, 58.51, 58.56, 58.15, 58.56, 55.77, 58.56],
            500: [1.11, nan, 58.52, 58.56, 58.30, 58.56, 56.72, 58.56, 51.77, 58.56],
            1000: [0.75, nan, 58.51, 58.56, 58.15, 58.56, 55.77, 58.56, 49.62, 58.56]}
    cols = pd.MultiIndex.from_product([[0.0, 0.1, 1.0, 10.0, 100.0], ["w/o RI", "w/ RI"]], names=["γ", "RI"])
    return pd.DataFrame.from_dict(rows, orient="index", columns=cols).rename_axis("K")


def afl_table1() -> pd.DataFrame:
    """AFL paper, Table 1: ΔW = Σ|W_joint − W_agg| on 512-d dummy data (mean of 5 runs)."""
    return pd.DataFrame({"ΔW w/o RI (paper)": [7.83e-14, 1.76e-12, 9.86e-1, 5.90, 5.93e4, 3.67e12],
                         "ΔW w/ RI (paper)": [4.94e-14, 1.74e-12, 5.09e-10, 8.45e-10, 7.57e-10, 7.81e-10]},
                        index=pd.Index([2, 10, 20, 50, 100, 200], name="K"))


AFL_TRAINING_SECONDS = {"CIFAR-100": 236.61, "Tiny-ImageNet": 349.50}  # Fig. 2 legend, AFL (GPU, 224 px)
AFL_BASELINE_SECONDS = {"CIFAR-100": (12000, 20000), "Tiny-ImageNet": (20000, 32000)}  # Fig. 2, 200 rounds


# ---------------------------------------------------------------------------------------------
# STSA / STSA-E paper ("Spatial-Temporal Statistics Aggregation" for federated class-incremental
# learning). Two versions: [000] = shared/seeds/000_e25577ccf93265ea.txt, [001] =
# shared/seeds/001_7af26fce2ee7bc1e.txt; Tables 1-6 are identical in both, Table 7 is in [000] only.
# Source: shared/papers/stsa.md section 5, every number checked against both seed texts.
# All numbers are percentages (accuracy / forgetting) unless stated. Method names drop the
# citations and "(Ours)"; "Joint" is printed "Joint (Upper-bound)"; [001] misspells PILoRA "PLoRA".
# ---------------------------------------------------------------------------------------------

_NAN = float("nan")
STSA_BETAS = [1.0, 0.5, 0.1]
STSA_METRICS = ["A_avg", "A_T", "F_T"]

# Table 1 (ResNet-18 trained from scratch, T=10, K=5): per row, beta=1 | 0.5 | 0.1, each A_avg, A_T, F_T.
_STSA_TABLE1 = {
    ("CIFAR100", "Joint"): [_NAN, 76.74, _NAN, _NAN, 76.74, _NAN, _NAN, 76.74, _NAN],
    ("CIFAR100", "Fed-EWC"): [29.23, 11.76, 73.52, 27.16, 11.56, 70.53, 21.21, 9.13, 60.79],
    ("CIFAR100", "Fed-LWF"): [44.89, 27.04, 44.60, 40.25, 24.23, 42.86, 32.28, 21.89, 38.29],
    ("CIFAR100", "MFCL"): [43.48, 26.46, 31.28, 44.00, 27.17, 27.27, 34.48, 21.96, 22.77],
    ("CIFAR100", "LANDER"): [55.01, 37.53, 28.31, 45.68, 33.09, 35.38, 42.41, 30.50, 26.42],
    ("CIFAR100", "STSA-E"): [50.29, 34.85, 9.69, 49.16, 34.57, 9.26, 44.86, 30.74, 9.92],
    ("CIFAR100", "STSA"): [50.71, 35.14, 9.81, 50.10, 34.97, 9.57, 46.19, 31.02, 9.73],
    ("Tiny-ImageNet", "Joint"): [_NAN, 49.44, _NAN, _NAN, 49.44, _NAN, _NAN, 49.44, _NAN],
    ("Tiny-ImageNet", "Fed-EWC"): [19.49, 7.68, 52.51, 19.07, 7.48, 52.04, 17.55, 6.08, 49.82],
    ("Tiny-ImageNet", "Fed-LWF"): [29.11, 17.02, 27.64, 26.91, 15.47, 28.06, 26.54, 15.16, 25.22],
    ("Tiny-ImageNet", "MFCL"): [32.58, 18.12, 24.53, 30.35, 16.43, 28.93, 28.21, 16.24, 36.33],
    ("Tiny-ImageNet", "LANDER"): [34.53, 18.21, 38.04, 30.75, 16.59, 26.77, 28.49, 16.29, 33.76],
    ("Tiny-ImageNet", "STSA-E"): [30.86, 19.94, 8.94, 30.91, 20.02, 7.66, 29.07, 18.11, 8.36],
    ("Tiny-ImageNet", "STSA"): [31.14, 20.03, 8.26, 30.77, 19.99, 6.56, 29.10, 18.18, 7.50],
}

# Table 2 (ViT-B/16 pretrained on ImageNet-21k + adapter, T=10, K=5): same layout as Table 1.
_STSA_TABLE2 = {
    ("CIFAR100", "Joint"): [_NAN, 92.45, _NAN, _NAN, 92.45, _NAN, _NAN, 92.45, _NAN],
    ("CIFAR100", "Fed-DualP"): [83.02, 75.07, 4.78, 78.12, 65.77, 3.97, 69.11, 56.31, 3.31],
    ("CIFAR100", "Fed-CODAP"): [82.20, 74.12, 6.34, 74.80, 64.02, 10.79, 67.75, 55.54, 14.04],
    ("CIFAR100", "Fed-CPrompt"): [81.43, 73.86, 8.29, 75.07, 65.87, 9.28, 69.67, 61.68, 10.03],
    ("CIFAR100", "PILoRA"): [83.59, 77.17, 8.59, 83.46, 76.81, 6.41, 82.85, 74.09, 7.67],
    ("CIFAR100", "STSA-E"): [93.71, 89.42, 3.93, 93.35, 89.37, 4.05, 93.14, 88.65, 4.06],
    ("CIFAR100", "STSA"): [94.05, 89.85, 4.12, 93.96, 89.72, 4.09, 93.63, 89.09, 4.35],
    ("ImageNet-R", "Joint"): [_NAN, 80.27, _NAN, _NAN, 80.27, _NAN, _NAN, 80.27, _NAN],
    ("ImageNet-R", "Fed-DualP"): [56.61, 48.58, 7.13, 53.37, 45.25, 9.80, 35.58, 27.92, 10.52],
    ("ImageNet-R", "Fed-CODAP"): [55.10, 51.13, 6.42, 48.49, 43.00, 6.06, 23.22, 15.15, 8.29],
    ("ImageNet-R", "Fed-CPrompt"): [51.09, 47.28, 9.49, 45.42, 39.12, 9.27, 23.67, 16.87, 9.52],
    ("ImageNet-R", "PILoRA"): [55.47, 51.92, 6.69, 53.43, 50.18, 7.09, 51.85, 47.85, 7.19],
    ("ImageNet-R", "STSA-E"): [72.89, 66.68, 6.45, 71.77, 66.08, 6.60, 71.67, 65.46, 6.37],
    ("ImageNet-R", "STSA"): [74.02, 67.25, 6.84, 73.59, 66.67, 7.14, 73.65, 66.78, 7.18],
}

# Table 3 (ViT-B/16, CIFAR100, beta=0.5): first-stage PEFT strategy; A_avg, A_T, F_T.
_STSA_TABLE3 = {
    ("LoRA", "PILoRA"): [83.46, 76.81, 6.41],
    ("LoRA", "STSA-E+PILoRA"): [89.45, 84.72, 5.54],
    ("LoRA", "STSA+PILoRA"): [90.51, 85.64, 5.82],
    ("Prompt", "Fed-CPrompt"): [75.07, 65.87, 9.28],
    ("Prompt", "STSA-E+Fed-CPrompt"): [90.07, 85.67, 5.26],
    ("Prompt", "STSA+Fed-CPrompt"): [89.86, 85.60, 6.32],
    ("Adapter", "STSA-E"): [93.35, 89.37, 4.05],
    ("Adapter", "STSA"): [93.96, 89.72, 4.09],
}

# Table 4 (CIFAR100, large first task: 50-class base task + 10 tasks of 5 classes); A_avg, A_T, F_T.
_STSA_TABLE4 = {
    ("ResNet18", "LANDER"): [59.69, 46.19, 13.61],
    ("ResNet18", "STSA-E"): [66.78, 59.36, 3.23],
    ("ResNet18", "STSA"): [67.08, 59.44, 2.69],
    ("ViT-B/16", "PILoRA"): [86.24, 81.44, 4.21],
    ("ViT-B/16", "STSA-E"): [93.04, 91.04, 2.14],
    ("ViT-B/16", "STSA"): [93.70, 91.57, 2.19],
}

# Table 5: per-client cost over the whole process after the first stage (one RTX 3090 for time).
STSA_TABLE5_SETTINGS = {  # setting string as printed -> the numbers in it, for our own accounting
    "ResNet18 on CIFAR100 with 10 tasks, M=5000, K_D=50": {"backbone": "ResNet18", "T": 10, "M": 5000, "K_D": 50},
    "ViT-B/16 on CIFAR100 with 10 tasks, M=1250, K_D=10": {"backbone": "ViT-B/16", "T": 10, "M": 1250, "K_D": 10},
}
_RN_SET, _VIT_SET = list(STSA_TABLE5_SETTINGS)
_STSA_TABLE5 = {
    (_RN_SET, "LANDER"): [79047.9, "> 10 h"],
    (_RN_SET, "STSA-E"): [95.4, "< 3 min"],
    (_RN_SET, "STSA"): [955.6, "< 3 min"],
    (_VIT_SET, "PILoRA"): [36.39, "> 20 h"],
    (_VIT_SET, "STSA-E"): [4.77, "< 10 min"],
    (_VIT_SET, "STSA"): [60.1, "< 10 min"],
}

# Table 7 ([000] App. E.2 only): A_T on CIFAR100, beta=0.5, with q * N(0, s^2) noise added to uploads.
# Key: (setting as printed, q, s); values: ResNet18 STSA, -E1, -E2, -E3 | ViT-B/16 STSA, -E1, -E2, -E3.
_STSA_TABLE7 = {
    ("Original", _NAN, _NAN): [34.97, 34.57, 34.57, 34.57, 89.72, 89.37, 89.37, 89.37],
    ("q=0.1, s=0.1", 0.1, 0.1): [35.00, 34.59, 34.45, 34.32, 89.72, 89.37, 89.25, 89.11],
    ("q=0.1, s=0.5", 0.1, 0.5): [34.98, 34.63, 34.45, 34.36, 89.72, 89.38, 89.25, 89.11],
    ("q=0.1, s=1", 0.1, 1.0): [34.96, 34.70, 34.45, 34.38, 89.71, 89.40, 89.25, 89.11],
    ("q=0.1, s=5", 0.1, 5.0): [34.47, 34.21, 34.37, 31.93, 89.68, 89.40, 89.17, 89.19],
    ("s=0.05, q=0.1", 0.1, 0.05): [34.98, 34.57, 34.45, 34.32, 89.72, 89.37, 89.25, 89.11],
    ("s=0.05, q=0.2", 0.2, 0.05): [35.00, 34.59, 34.45, 34.32, 89.72, 89.37, 89.25, 89.11],
    ("s=0.05, q=0.5", 0.5, 0.05): [35.01, 34.65, 34.45, 34.34, 89.72, 89.37, 89.25, 89.11],
}


def _stsa_frame(data: dict, index_names: list[str], columns) -> pd.DataFrame:
    frame = pd.DataFrame.from_dict(data, orient="index", columns=columns)
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=index_names)
    return frame


def _stsa_beta_columns() -> pd.MultiIndex:
    return pd.MultiIndex.from_product([STSA_BETAS, STSA_METRICS], names=["beta", "metric"])


def stsa_table1() -> pd.DataFrame:
    """STSA paper, Table 1: ResNet-18 trained from scratch, T=10 tasks, K=5 clients (Dirichlet β).

    The paper's numbers on the paper's datasets (CIFAR100, Tiny-ImageNet), in %: A_avg and A_T
    (accuracy, higher is better), F_T (forgetting, lower is better). Rows (dataset, method);
    columns (beta ∈ [1, 0.5, 0.1]) × (metric ∈ [A_avg, A_T, F_T]). The '-' the paper prints for
    Joint (upper bound, centralised) A_avg and F_T are NaN. Identical in [000] and [001].
    """
    return _stsa_frame(_STSA_TABLE1, ["dataset (paper)", "method"], _stsa_beta_columns())


def stsa_table2() -> pd.DataFrame:
    """STSA paper, Table 2: ViT-B/16 (ImageNet-21k pretrained) + adapter, T=10, K=5 (Dirichlet β).

    The paper's numbers on the paper's datasets (CIFAR100, ImageNet-R), in %; same layout as
    :func:`stsa_table1`: rows (dataset, method), columns (beta) × (A_avg, A_T, F_T), Joint's '-'
    as NaN. Identical in [000] and [001].
    """
    return _stsa_frame(_STSA_TABLE2, ["dataset (paper)", "method"], _stsa_beta_columns())


def stsa_table3() -> pd.DataFrame:
    """STSA paper, Table 3: first-stage adaptation strategy (ViT-B/16, CIFAR100, β=0.5).

    The paper's numbers on the paper's dataset, in %. Rows (PEFT used in the first stage: LoRA,
    Prompt, Adapter; method), columns A_avg, A_T, F_T. "STSA+PILoRA" = PILoRA's first stage
    followed by STSA's statistics aggregation. [001] prints "PLoRA"; the name here is PILoRA.
    """
    return _stsa_frame(_STSA_TABLE3, ["PEFT", "method"], STSA_METRICS)


def stsa_table4() -> pd.DataFrame:
    """STSA paper, Table 4: large first task (CIFAR100: 50-class base task + 10 tasks × 5 classes).

    The paper's numbers on the paper's dataset, in %. Rows (backbone: ResNet18 from scratch or
    ViT-B/16 pretrained; method), columns A_avg, A_T, F_T. Identical in [000] and [001].
    """
    return _stsa_frame(_STSA_TABLE4, ["backbone", "method"], STSA_METRICS)


def stsa_table5() -> pd.DataFrame:
    """STSA paper, Table 5: per-client cost over the whole learning process after the first stage.

    The paper's numbers for CIFAR100, 10 tasks. Rows (setting as printed, method); the numbers in
    each setting string are in :data:`STSA_TABLE5_SETTINGS`. Columns: "communication (MB)"
    (float, as printed; our MiB accounting of (M + c_t)·M resp. (M + 1)·c_t·K_D float32 values
    reproduces the STSA rows) and "wall-clock" (string as printed, a bound such as "> 10 h";
    training + testing after stage 1 on one RTX 3090, not comparable with our hardware).
    """
    frame = _stsa_frame(_STSA_TABLE5, ["setting", "method"], ["communication (MB)", "wall-clock"])
    return frame.astype({"communication (MB)": float, "wall-clock": str})


def stsa_table7() -> pd.DataFrame:
    """STSA paper, Table 7 ([000] App. E.2 only): final accuracy A_T (%) with upload noise q·N(0, s²).

    The paper's numbers on the paper's dataset (CIFAR100, β=0.5). Rows: index levels
    (setting as printed, q, s) with q and s as floats (NaN for "Original"), so our own noise can
    be run at the same grid. Columns (backbone ∈ [ResNet18, ViT-B/16]) × (variant): STSA (noise on
    G and C), STSA-E1 (noise on feature statistics C only), STSA-E2 (on label frequencies n only),
    STSA-E3 (on both). [000] prints the backbone as "ViT/B-16" in this table.
    """
    cols = pd.MultiIndex.from_product([["ResNet18", "ViT-B/16"], ["STSA", "STSA-E1", "STSA-E2", "STSA-E3"]],
                                      names=["backbone", "variant"])
    return _stsa_frame(_STSA_TABLE7, ["setting", "q", "s"], cols)


_STSA_TABLES = {"stsa_table1": stsa_table1, "stsa_table2": stsa_table2, "stsa_table3": stsa_table3,
                "stsa_table4": stsa_table4, "stsa_table5": stsa_table5, "stsa_table7": stsa_table7}

_T2_BASELINES = ("Fed-DualP", "Fed-CODAP", "Fed-CPrompt", "PILoRA")
_OURS = ("STSA-E", "STSA")

# Quoted claims: a case's value = frame.loc[row, col] − max(frame.loc[(row[0], a), col] for a in against)
# ("margin"), that with the sign flipped ("gap"), or lower bound of against's time / upper bound of
# row's time ("speedup", Table 5 wall-clock strings). Recompute with stsa_claim_values().
_STSA_CLAIMS = [
    ("t1_cifar100_b0.5_A_avg_STSA-E",
     "STSA-E beats LANDER in A_avg on CIFAR100, β=0.5", "3.48%", 3.48, "=", "stsa_table1", "margin",
     [("CIFAR100", "STSA-E")], ["LANDER"], [(0.5, "A_avg")], "[000] §4.2, [001] §3.2"),
    ("t1_cifar100_b0.5_A_avg_STSA",
     "STSA beats LANDER in A_avg on CIFAR100, β=0.5", "4.42%", 4.42, "=", "stsa_table1", "margin",
     [("CIFAR100", "STSA")], ["LANDER"], [(0.5, "A_avg")], "[000] §4.2, [001] §3.2"),
    ("t1_tiny_b0.5_A_T_STSA-E",
     "STSA-E beats LANDER in A_T on Tiny-ImageNet, β=0.5", "3.43%", 3.43, "=", "stsa_table1", "margin",
     [("Tiny-ImageNet", "STSA-E")], ["LANDER"], [(0.5, "A_T")], "[000] §4.2, [001] §3.2"),
    ("t1_tiny_b0.5_A_T_STSA",
     "STSA beats LANDER in A_T on Tiny-ImageNet, β=0.5", "3.4%", 3.40, "=", "stsa_table1", "margin",
     [("Tiny-ImageNet", "STSA")], ["LANDER"], [(0.5, "A_T")], "[000] §4.2, [001] §3.2"),
    ("t2_over_10pct",
     "STSA and STSA-E beat the best baseline by over 10% in A_avg and A_T in all cases"
     " (Table 2)",
     "over 10%", 10.0, ">", "stsa_table2", "margin",
     [(d, m) for d in ("CIFAR100", "ImageNet-R") for m in _OURS], list(_T2_BASELINES),
     [(b, k) for b in STSA_BETAS for k in ("A_avg", "A_T")], "[000] §4.2, [001] §3.2"),
    ("t2_cifar100_3pct_below_joint",
     "On CIFAR100 our method is just 3% below the upper bound (Joint) in A_T (Table 2)",
     "3%", 3.0, "≈",
     "stsa_table2", "gap", [("CIFAR100", m) for m in _OURS], ["Joint"],
     [(b, "A_T") for b in STSA_BETAS], "[000] §4.2, [001] §3.2"),
    ("t4_nearly_10pct",
     "Large first task: top baselines beaten by nearly 10% in all cases (Table 4)",
     "nearly 10%", 10.0, "≈",
     "stsa_table4", "margin", [(b, m) for b in ("ResNet18", "ViT-B/16") for m in _OURS],
     ["LANDER", "PILoRA"],
     ["A_avg", "A_T"], "[000] §4.4, [001] §3.4"),
    ("t5_80x_lander",
     "STSA over 80 times faster than LANDER (Table 5)", "over 80 times", 80.0, ">",
     "stsa_table5", "speedup",
     [(_RN_SET, "STSA")], ["LANDER"], ["wall-clock"], "[000] §4.4, [001] §3.4"),
    ("t5_120x_pilora",
     "STSA 120 times faster than PILoRA (Table 5)", "120 times", 120.0, "≈",
     "stsa_table5", "speedup",
     [(_VIT_SET, "STSA")], ["PILoRA"], ["wall-clock"], "[000] §4.4, [001] §3.4"),
]


def stsa_claims() -> pd.DataFrame:
    """STSA paper: the deltas quoted in the text, with the recipe to recompute them from the tables.

    Quoted values only (never recomputed here). Index: a short claim id. Columns: claim, "quoted text" (as printed),
    "quoted value" (float), relation ("=", ">" for "over", "≈" for "nearly"/"just"), table (name
    of the function in this module), kind, rows (list of row keys of "ours"), against (method names,
    matched within the row's first index level; the best of them is used), columns (list of
    column keys), source. Each (row, column) pair is one case; :func:`stsa_claim_values` returns
    the recomputed value of every case: "margin" = row − max(against), "gap" = min(against) − row,
    "speedup" = lower time bound of against / upper time bound of row (Table 5 strings).
    """
    cols = ["claim id", "claim", "quoted text", "quoted value", "relation", "table", "kind", "rows", "against", "columns",
            "source"]
    return pd.DataFrame(_STSA_CLAIMS, columns=cols).set_index("claim id")


def _stsa_minutes(text: str) -> float:
    """'> 10 h' -> 600.0, '< 3 min' -> 3.0 (the bound as printed, in minutes)."""
    number, unit = text.strip("<> ").split()
    return float(number) * {"h": 60.0, "min": 1.0}[unit]


def stsa_claim_values(claim: pd.Series) -> pd.Series:
    """Recompute one row of :func:`stsa_claims` from the transcribed tables: one value per case.

    Returns a Series indexed by (row, column); compare it with claim["quoted value"] under
    claim["relation"] (e.g. its min for "over 10% in all cases").
    """
    frame = _STSA_TABLES[claim["table"]]()
    values = {}
    for row in claim["rows"]:
        for col in claim["columns"]:
            others = [frame.loc[(row[0], a), col] for a in claim["against"] if (row[0], a) in frame.index]
            if not others:
                raise KeyError(f"no 'against' row for {row} in {claim['table']}")
            if claim["kind"] == "margin":
                value = frame.loc[row, col] - max(others)
            elif claim["kind"] == "gap":
                value = min(others) - frame.loc[row, col]
            elif claim["kind"] == "speedup":
                value = min(_stsa_minutes(o) for o in others) / _stsa_minutes(frame.loc[row, col])
            else:
                raise ValueError(claim["kind"])
            values[(row, col)] = float(value)
    return pd.Series(values, name=claim["claim"], dtype=float)


# ---------------------------------------------------------------------------------------------
# Fed-tSNE / Fed-UMAP paper ("Federated t-SNE and UMAP for Distributed Data Visualization", Qiao,
# Ma, Fan; AAAI 2025, arXiv:2412.13495) = shared/seeds/002_53e863fef0865499.txt.
# Source: shared/papers/fedtsne.md section 6; every row below was compared, number by number,
# with the seed text (they agree). Cells are stored as printed, "mean±std", and split into two
# float columns (stat = mean / std). Metrics are fractions, not %: CA = k-NN classification
# accuracy in the 2-D embedding, NPA = k-NN neighbour preservation, NMI / SC of k-means on the
# embedding, ARI of spectral clustering (recipes: fedlib.evaluation.embedding). Setting of Tables
# 1-4: 40,000 points, n_y = 500 landmarks; Tables 1-2: 10 clients, non-IID = one class per client,
# "+" = gradient noise N(0, sd²(∇f_p)) (β = 1). Number of runs behind mean ± std: not stated.
# ---------------------------------------------------------------------------------------------

FEDTSNE_METRICS = ["CA 1-NN", "CA 10-NN", "CA 50-NN", "NPA 1-NN", "NPA 10-NN", "NPA 50-NN", "NMI", "SC"]
# Column order of Tables 1, 2 and 5 (central, then IID: Fed, Fed+, then non-IID: Fed, Fed+).
FEDTSNE_SETTINGS = [("central", "pooled"), ("Fed", "IID"), ("Fed+", "IID"), ("Fed", "non-IID"),
                    ("Fed+", "non-IID")]

# Table 1 (MNIST) and Table 2 (Fashion-MNIST): embedding -> one printed row per FEDTSNE_METRICS entry.
_FEDTSNE_TABLE1 = {
    "t-SNE": [
        "0.9618±0.0015 0.9400±0.0017 0.9364±0.0020 0.9412±0.0021 0.9189±0.0030",
        "0.9656±0.0017 0.9477±0.0017 0.9443±0.0012 0.9483±0.0019 0.9307±0.0026",
        "0.9609±0.0015 0.9401±0.0022 0.9354±0.0022 0.9406±0.0020 0.9209±0.0035",
        "0.4176±0.0016 0.2728±0.0022 0.2543±0.0016 0.2729±0.0022 0.1928±0.0019",
        "0.3905±0.0005 0.3373±0.0007 0.3263±0.0005 0.3375±0.0013 0.2827±0.0010",
        "0.3441±0.0007 0.3301±0.0007 0.3258±0.0007 0.3305±0.0006 0.3030±0.0012",
        "0.7747±0.0243 0.7534±0.0202 0.7471±0.0073 0.7399±0.0109 0.7025±0.0149",
        "0.4226±0.0082 0.4407±0.0103 0.4478±0.0066 0.4321±0.0058 0.4441±0.0045",
    ],
    "UMAP": [
        "0.9322±0.0053 0.9066±0.0031 0.9007±0.0034 0.9064±0.0026 0.8730±0.0041",
        "0.9613±0.0048 0.9445±0.0018 0.9416±0.0023 0.9449±0.0022 0.9224±0.0036",
        "0.9602±0.0049 0.9432±0.0020 0.9400±0.0025 0.9441±0.0022 0.9219±0.0037",
        "0.0308±0.0009 0.0293±0.0007 0.0277±0.0008 0.0298±0.0011 0.0218±0.0009",
        "0.1227±0.0010 0.1133±0.0008 0.1088±0.0009 0.1131±0.0012 0.0914±0.0006",
        "0.2226±0.0015 0.2099±0.0011 0.2053±0.0011 0.2095±0.0013 0.1860±0.0013",
        "0.8285±0.0150 0.7844±0.0208 0.7812±0.0153 0.7919±0.0217 0.7368±0.0194",
        "0.6118±0.0207 0.5812±0.0261 0.5746±0.0229 0.5889±0.0248 0.5422±0.0173",
    ],
}
_FEDTSNE_TABLE2 = {
    "t-SNE": [
        "0.8112±0.0049 0.7473±0.0029 0.7198±0.0041 0.7453±0.0044 0.6669±0.0044",
        "0.8260±0.0039 0.7892±0.0030 0.7706±0.0034 0.7898±0.0039 0.7280±0.0048",
        "0.8064±0.0041 0.7754±0.0033 0.7631±0.0037 0.7760±0.0045 0.7280±0.0043",
        "0.3518±0.0018 0.1251±0.0021 0.0718±0.0013 0.1275±0.0017 0.0274±0.0006",
        "0.3635±0.0007 0.2551±0.0010 0.1954±0.0011 0.2571±0.0011 0.1090±0.0010",
        "0.3710±0.0003 0.3363±0.0006 0.3004±0.0006 0.3369±0.0008 0.2204±0.0017",
        "0.5787±0.0212 0.5780±0.0154 0.5733±0.0149 0.5778±0.0044 0.5162±0.0129",
        "0.4049±0.0101 0.4382±0.0070 0.4638±0.0147 0.4389±0.0085 0.4564±0.0111",
    ],
    "UMAP": [
        "0.7146±0.0029 0.6756±0.0036 0.6587±0.0055 0.6766±0.0043 0.6110±0.0037",
        "0.7734±0.0039 0.7413±0.0045 0.7287±0.0041 0.7437±0.0030 0.6875±0.0041",
        "0.7781±0.0039 0.7491±0.0052 0.7383±0.0039 0.7501±0.0040 0.7006±0.0033",
        "0.0356±0.0012 0.0218±0.0011 0.0156±0.0009 0.0223±0.0011 0.0071±0.0004",
        "0.1401±0.0013 0.1002±0.0015 0.0799±0.0012 0.1020±0.0010 0.0423±0.0007",
        "0.2518±0.0018 0.2152±0.0028 0.1907±0.0018 0.2167±0.0022 0.1226±0.0015",
        "0.6187±0.0127 0.5915±0.0112 0.5755±0.0090 0.5877±0.0181 0.5191±0.0132",
        "0.5304±0.0286 0.5448±0.0264 0.5476±0.0176 0.5338±0.0252 0.5322±0.0191",
    ],
}
# Tables 3 (non-IID, k = 5: two classes per client, k = 10: one) and 4 (IID): MNIST, Fed-tSNE only;
# (method, metric) -> one printed cell per number of clients k. The k = 10 columns are Table 1's
# runs rounded to 3 decimals.
FEDTSNE_TABLE3_CLIENTS = [5, 10]
_FEDTSNE_TABLE3 = {
    ("Fed-tSNE", "NMI"): "0.741±0.011 0.740±0.011",
    ("Fed-tSNE", "NPA 10-NN"): "0.336±0.001 0.338±0.001",
    ("Fed-tSNE+", "NMI"): "0.709±0.026 0.702±0.015",
    ("Fed-tSNE+", "NPA 10-NN"): "0.286±0.001 0.283±0.001",
}
FEDTSNE_TABLE4_CLIENTS = [5, 10, 20, 50, 100]
_FEDTSNE_TABLE4 = {
    ("Fed-tSNE", "NMI"): "0.747±0.016 0.753±0.020 0.745±0.009 0.747±0.014 0.749±0.015",
    ("Fed-tSNE", "NPA 10-NN"): "0.337±0.001 0.337±0.001 0.337±0.001 0.338±0.001 0.338±0.001",
    ("Fed-tSNE+", "NMI"): "0.740±0.013 0.747±0.007 0.742±0.019 0.741±0.018 0.741±0.012",
    ("Fed-tSNE+", "NPA 10-NN"): "0.323±0.001 0.326±0.001 0.329±0.001 0.332±0.001 0.333±0.001",
}
# Table 5: spectral clustering (SpeClust / Fed-SpeClust / Fed-SpeClust+), columns as FEDTSNE_SETTINGS.
# The MNIST non-IID Fed-SpeClust ARI std 0.1123 is printed so (ten times its neighbours; likely a
# typo for 0.0112) and is kept as printed.
_FEDTSNE_TABLE5 = {
    ("MNIST", "NMI"): "0.5415±0.0009 0.5240±0.0038 0.5220±0.0052 0.5235±0.0051 0.5025±0.0068",
    ("MNIST", "ARI"): "0.3837±0.0008 0.3815±0.0076 0.3807±0.0088 0.3806±0.1123 0.3829±0.0102",
    ("COIL-20", "NMI"): "0.8885±0.0016 0.8425±0.0218 0.8333±0.0173 0.8339±0.0216 0.8215±0.0163",
    ("COIL-20", "ARI"): "0.6066±0.0012 0.5113±0.0557 0.4793±0.0426 0.4895±0.0639 0.4551±0.0322",
    ("Mice-Protein", "NMI"): "0.3241±0.0063 0.3233±0.0121 0.3220±0.0143 0.3222±0.0190 0.3198±0.0100",
    ("Mice-Protein", "ARI"): "0.1837±0.0037 0.1827±0.0033 0.1802±0.0154 0.1809±0.0024 0.1783±0.0016",
}


def _fedtsne_cells(printed: str) -> list[float]:
    """'0.9618±0.0015 0.9400±0.0017' -> [0.9618, 0.0015, 0.9400, 0.0017] (mean, std per cell)."""
    values = []
    for cell in printed.split():
        mean, std = cell.split("±")
        values += [float(mean), float(std)]
    return values


def _fedtsne_frame(rows: dict, index_names: list[str], column_keys: list, column_names: list[str]) -> pd.DataFrame:
    data = {key: _fedtsne_cells(printed) for key, printed in rows.items()}
    cols = pd.MultiIndex.from_tuples([(*(c if isinstance(c, tuple) else (c,)), stat)
                                      for c in column_keys for stat in ("mean", "std")],
                                     names=[*column_names, "stat"])
    frame = pd.DataFrame.from_dict(data, orient="index", columns=cols)
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=index_names)
    return frame


def _fedtsne_embedding_table(table: dict) -> pd.DataFrame:
    rows = {(emb, metric): printed for emb, block in table.items()
            for metric, printed in zip(FEDTSNE_METRICS, block)}
    return _fedtsne_frame(rows, ["embedding", "metric"], FEDTSNE_SETTINGS, ["variant", "split"])


def fedtsne_table1() -> pd.DataFrame:
    """Fed-tSNE paper, Table 1: dimensionality reduction on MNIST (mean ± std, fractions).

    The paper's numbers on the paper's dataset (MNIST, 40,000 points, n_y = 500, 10 clients,
    non-IID = one class per client, "+" = gradient noise with β = 1). Rows (embedding ∈ [t-SNE,
    UMAP], metric ∈ :data:`FEDTSNE_METRICS`); columns (variant, split, stat): ("central", "pooled")
    = plain t-SNE / UMAP on all data, ("Fed" | "Fed+", "IID" | "non-IID") = Fed-tSNE(+) /
    Fed-UMAP(+); stat ∈ [mean, std]. E.g. ``t.loc[("t-SNE", "NMI"), ("Fed", "IID", "mean")]``.
    """
    return _fedtsne_embedding_table(_FEDTSNE_TABLE1)


def fedtsne_table2() -> pd.DataFrame:
    """Fed-tSNE paper, Table 2: dimensionality reduction on Fashion-MNIST (mean ± std, fractions).

    The paper's numbers on the paper's dataset (Fashion-MNIST, same setting as Table 1); same
    layout as :func:`fedtsne_table1`.
    """
    return _fedtsne_embedding_table(_FEDTSNE_TABLE2)


def fedtsne_table3() -> pd.DataFrame:
    """Fed-tSNE paper, Table 3: Fed-tSNE / Fed-tSNE+ on non-IID MNIST vs the number of clients k.

    The paper's numbers on the paper's dataset, 3 decimals as printed. k = 5: two distinct classes
    per client; k = 10: one class per client. Rows (method ∈ [Fed-tSNE, Fed-tSNE+], metric ∈
    [NMI, NPA 10-NN]); columns (clients k ∈ :data:`FEDTSNE_TABLE3_CLIENTS`, stat ∈ [mean, std]).
    """
    return _fedtsne_frame(_FEDTSNE_TABLE3, ["method", "metric"], FEDTSNE_TABLE3_CLIENTS, ["clients"])


def fedtsne_table4() -> pd.DataFrame:
    """Fed-tSNE paper, Table 4: Fed-tSNE / Fed-tSNE+ on IID MNIST vs the number of clients k.

    The paper's numbers on the paper's dataset, 3 decimals as printed; data split at random among
    k clients. Same layout as :func:`fedtsne_table3`, k ∈ :data:`FEDTSNE_TABLE4_CLIENTS`.
    """
    return _fedtsne_frame(_FEDTSNE_TABLE4, ["method", "metric"], FEDTSNE_TABLE4_CLIENTS, ["clients"])


def fedtsne_table5() -> pd.DataFrame:
    """Fed-tSNE paper, Table 5: spectral clustering, NMI and ARI (mean ± std).

    The paper's numbers on the paper's datasets (MNIST subset, COIL-20, Mice-Protein; sizes,
    clients, γ not stated). Rows (dataset, metric ∈ [NMI, ARI]); columns (variant, split, stat) as
    in :func:`fedtsne_table1`: ("central", "pooled") = SpeClust, ("Fed" | "Fed+", "IID" |
    "non-IID") = Fed-SpeClust(+). The MNIST non-IID Fed ARI std 0.1123 is kept as printed
    (probably a typo for 0.0112).
    """
    return _fedtsne_frame(_FEDTSNE_TABLE5, ["dataset (paper)", "metric"], FEDTSNE_SETTINGS, ["variant", "split"])
