"""STSA / STSA-E paper (both versions): the printed tables and the deltas quoted in the text.
The paper's numbers on the paper's datasets, never ours.
"""
from __future__ import annotations

import pandas as pd

from fedlib.evaluation.printed import multi_frame

# ---------------------------------------------------------------------------------------------
# STSA / STSA-E paper ("Spatial-Temporal Statistics Aggregation" for federated class-incremental
# learning). Two versions: [000] = the earlier version ("STSA: Federated Class-Incremental Learning
# via Spatial-Temporal Statistics Aggregation"), [001] = the revised version ("Enhancing Federated
# Class-Incremental Learning via Spatial-Temporal Statistics Aggregation"); Tables 1-6 are identical
# in both, Table 7 is in [000] only. Every number was checked against both versions' text.
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


def _stsa_beta_columns() -> pd.MultiIndex:
    return pd.MultiIndex.from_product([STSA_BETAS, STSA_METRICS], names=["beta", "metric"])


def stsa_table1() -> pd.DataFrame:
    """STSA paper, Table 1: ResNet-18 trained from scratch, T=10 tasks, K=5 clients (Dirichlet β).

    The paper's numbers on the paper's datasets (CIFAR100, Tiny-ImageNet), in %: A_avg and A_T
    (accuracy, higher is better), F_T (forgetting, lower is better). Rows (dataset, method);
    columns (beta ∈ [1, 0.5, 0.1]) × (metric ∈ [A_avg, A_T, F_T]). The '-' the paper prints for
    Joint (upper bound, centralised) A_avg and F_T are NaN. Identical in [000] and [001].
    """
    return multi_frame(_STSA_TABLE1, ["dataset (paper)", "method"], _stsa_beta_columns())


def stsa_table2() -> pd.DataFrame:
    """STSA paper, Table 2: ViT-B/16 (ImageNet-21k pretrained) + adapter, T=10, K=5 (Dirichlet β).

    The paper's numbers on the paper's datasets (CIFAR100, ImageNet-R), in %; same layout as
    :func:`stsa_table1`: rows (dataset, method), columns (beta) × (A_avg, A_T, F_T), Joint's '-'
    as NaN. Identical in [000] and [001].
    """
    return multi_frame(_STSA_TABLE2, ["dataset (paper)", "method"], _stsa_beta_columns())


def stsa_table3() -> pd.DataFrame:
    """STSA paper, Table 3: first-stage adaptation strategy (ViT-B/16, CIFAR100, β=0.5).

    The paper's numbers on the paper's dataset, in %. Rows (PEFT used in the first stage: LoRA,
    Prompt, Adapter; method), columns A_avg, A_T, F_T. "STSA+PILoRA" = PILoRA's first stage
    followed by STSA's statistics aggregation. [001] prints "PLoRA"; the name here is PILoRA.
    """
    return multi_frame(_STSA_TABLE3, ["PEFT", "method"], STSA_METRICS)


def stsa_table4() -> pd.DataFrame:
    """STSA paper, Table 4: large first task (CIFAR100: 50-class base task + 10 tasks × 5 classes).

    The paper's numbers on the paper's dataset, in %. Rows (backbone: ResNet18 from scratch or
    ViT-B/16 pretrained; method), columns A_avg, A_T, F_T. Identical in [000] and [001].
    """
    return multi_frame(_STSA_TABLE4, ["backbone", "method"], STSA_METRICS)


def stsa_table5() -> pd.DataFrame:
    """STSA paper, Table 5: per-client cost over the whole learning process after the first stage.

    The paper's numbers for CIFAR100, 10 tasks. Rows (setting as printed, method); the numbers in
    each setting string are in :data:`STSA_TABLE5_SETTINGS`. Columns: "communication (MB)"
    (float, as printed; our MiB accounting of (M + c_t)·M resp. (M + 1)·c_t·K_D float32 values
    reproduces the STSA rows) and "wall-clock" (string as printed, a bound such as "> 10 h";
    training + testing after stage 1 on one RTX 3090, not comparable with our hardware).
    """
    frame = multi_frame(_STSA_TABLE5, ["setting", "method"], ["communication (MB)", "wall-clock"])
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
    return multi_frame(_STSA_TABLE7, ["setting", "q", "s"], cols)


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
