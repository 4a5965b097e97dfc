"""Fed-tSNE / Fed-UMAP paper: the printed tables (mean ± std).

The paper's numbers on the paper's datasets, never ours.
"""
from __future__ import annotations

import pandas as pd

from fedlib.evaluation.printed import pm_frame

# Fed-tSNE / Fed-UMAP paper ("Federated t-SNE and UMAP for Distributed Data Visualization", Qiao,
# Ma, Fan; AAAI 2025, arXiv:2412.13495). Every row below was compared, number by number, with
# the paper's text (they agree). Cells are stored as printed, "mean±std", and split into two
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


def _fedtsne_embedding_table(table: dict) -> pd.DataFrame:
    rows = {(emb, metric): printed for emb, block in table.items()
            for metric, printed in zip(FEDTSNE_METRICS, block)}
    return pm_frame(rows, ["embedding", "metric"], FEDTSNE_SETTINGS, ["variant", "split"])


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
    return pm_frame(_FEDTSNE_TABLE3, ["method", "metric"], FEDTSNE_TABLE3_CLIENTS, ["clients"])


def fedtsne_table4() -> pd.DataFrame:
    """Fed-tSNE paper, Table 4: Fed-tSNE / Fed-tSNE+ on IID MNIST vs the number of clients k.

    The paper's numbers on the paper's dataset, 3 decimals as printed; data split at random among
    k clients. Same layout as :func:`fedtsne_table3`, k ∈ :data:`FEDTSNE_TABLE4_CLIENTS`.
    """
    return pm_frame(_FEDTSNE_TABLE4, ["method", "metric"], FEDTSNE_TABLE4_CLIENTS, ["clients"])


def fedtsne_table5() -> pd.DataFrame:
    """Fed-tSNE paper, Table 5: spectral clustering, NMI and ARI (mean ± std).

    The paper's numbers on the paper's datasets (MNIST subset, COIL-20, Mice-Protein; sizes,
    clients, γ not stated). Rows (dataset, metric ∈ [NMI, ARI]); columns (variant, split, stat) as
    in :func:`fedtsne_table1`: ("central", "pooled") = SpeClust, ("Fed" | "Fed+", "IID" |
    "non-IID") = Fed-SpeClust(+). The MNIST non-IID Fed ARI std 0.1123 is kept as printed
    (probably a typo for 0.0112).
    """
    return pm_frame(_FEDTSNE_TABLE5, ["dataset (paper)", "metric"], FEDTSNE_SETTINGS, ["variant", "split"])
