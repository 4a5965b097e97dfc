"""fedlib.evaluation.report: a paper's table beside ours, mean ± std cells, per-seed values of a setting,
listings of paired differences."""
import numpy as np
import pandas as pd
import pytest

from fedlib.evaluation import report
from fedlib.evaluation.stats import paired_difference


def _paper():
    cols = pd.MultiIndex.from_tuples([("Fed", "IID", "mean"), ("Fed", "IID", "std")])
    idx = pd.MultiIndex.from_tuples([("t-SNE", "NMI"), ("t-SNE", "SC")], names=["embedding", "metric"])
    return pd.DataFrame([[0.5, 0.01], [0.2, 0.02]], index=idx, columns=cols)


def test_pm_table_formats_each_key_and_marks_missing_ones():
    t = report.pm_table(_paper(), [("Fed", "IID"), ("untrained", "any")], names=["variant", "split"])
    assert t.loc[("t-SNE", "NMI"), ("Fed", "IID")] == "0.5000 ± 0.0100"
    assert t.loc[("t-SNE", "SC"), ("untrained", "any")] == "-"
    assert list(t.columns.names) == ["variant", "split"]
    flat = pd.DataFrame({(5, "mean"): [0.1], (5, "std"): [0.02], (10, "mean"): [0.3], (10, "std"): [0.01]})
    assert report.pm_table(flat, digits=3).iloc[0].tolist() == ["0.100 ± 0.020", "0.300 ± 0.010"]


def test_beside_interleaves_paper_and_ours_in_ours_order():
    paper = report.pm_table(_paper(), [("Fed", "IID")], names=["variant", "split"])
    ours = pd.DataFrame({("Fed", "IID"): ["0.6 ± 0.1", "0.3 ± 0.1", "0.9 ± 0.0"]},
                        index=pd.MultiIndex.from_tuples([("t-SNE", "SC"), ("t-SNE", "NMI"), ("UMAP", "NMI")],
                                                        names=["embedding", "metric"]))
    both = report.beside(paper, ours, ("paper", "ours"))
    assert list(both.index) == [("t-SNE", "SC", "paper"), ("t-SNE", "SC", "ours"), ("t-SNE", "NMI", "paper"),
                                ("t-SNE", "NMI", "ours"), ("UMAP", "NMI", "paper"), ("UMAP", "NMI", "ours")]
    assert both.index.names == ["embedding", "metric", "source"]
    assert both.iloc[0, 0] == "0.2000 ± 0.0200" and pd.isna(both.iloc[4, 0]) and both.iloc[5, 0] == "0.9 ± 0.0"
    with pytest.raises(ValueError, match="labels"):
        report.beside(paper, ours, ("x", "x"))


def test_mean_std_table_column_by_and_listing():
    runs = pd.DataFrame({"embedding": "t-SNE", "variant": ["Fed", "Fed", "central", "central"],
                         "split": ["IID", "IID", "pooled", "pooled"], "seed": [1, 0, 0, 1], "NMI": [0.4, 0.6, 0.7, 0.9]})
    t = report.mean_std_table(runs, ["NMI"], ["embedding"], ["variant", "split"], row_order=[("t-SNE", "NMI")],
                              column_order=[("central", "pooled"), ("Fed", "IID")])
    assert t.iloc[0].tolist() == ["0.8000 ± 0.1414", "0.5000 ± 0.1414"]
    assert report.column_by(runs, "NMI", variant="Fed", split="IID").tolist() == [0.6, 0.4]   # seed order
    assert report.column_by(runs, "NMI", variant="Fed", embedding=None).tolist() == [0.6, 0.4]
    with pytest.raises(ValueError, match="unknown column 'dataset'"):
        report.column_by(runs, "NMI", dataset="x")
    d = paired_difference(np.array([0.6, 0.4]), np.array([0.7, 0.9]))
    assert report.listing({("mnist", "t-SNE"): d}) == f"mnist t-SNE: {d.format(4)}"


def test_stacked_aligns_our_columns_to_the_papers_and_marks_missing_cells():
    import numpy as np
    import pandas as pd

    from fedlib.evaluation.report import stacked

    paper = pd.DataFrame({"FedAvg": [64.02, 57.81], "FedGen": [64.5, np.nan], "AFL": [80.75, 80.75]},
                         index=pd.Index(["α=0.1", "s=2"], name="setting"))
    ours = pd.DataFrame({"afl": [84.85, 84.85], "fedavg": ["83.02 ± 0.41", "84.50 ± 0.20"], "extra": [1.0, 2.0]},
                        index=pd.Index(["α=0.1", "s=2"], name="setting"))
    t = stacked(paper, ours, ("paper (CIFAR-10)", "ours (Fashion-MNIST)"))
    assert list(t.columns) == ["FedAvg", "FedGen", "AFL", "extra"]
    assert t.index.names == ["source", "setting"]
    assert t.loc[("paper (CIFAR-10)", "s=2")].tolist() == ["57.81", "—", "80.75", "—"]
    assert t.loc[("ours (Fashion-MNIST)", "α=0.1")].tolist() == ["83.02 ± 0.41", "—", "84.85", "1.00"]
    gammas = pd.DataFrame([[1.0, 2.0]], columns=pd.MultiIndex.from_product([[0.1], ["w/o", "w/"]], names=["γ", "RI"]))
    assert list(stacked(gammas, gammas, ("p", "o")).columns) == [("0.1", "w/o"), ("0.1", "w/")]
    with pytest.raises(ValueError, match="index level"):
        stacked(paper, ours.set_index(pd.MultiIndex.from_tuples([("a", 1), ("b", 2)])), ("p", "o"))
    with pytest.raises(ValueError, match="distinct"):
        stacked(paper, ours, ("x", "x"))
