"""The book's number style in tables (fedlib.evaluation.style)."""
import math

import numpy as np
import pandas as pd
import pytest

from fedlib.evaluation.style import MISSING, frame_html, number


@pytest.mark.parametrize("value, text", [
    (0.8485, "0.8485"), (0.848500, "0.8485"), (84.85, "84.85"), (51248.0, "51,248"), (8903.0, "8,903"),
    (12345.67, "12,346"), (1e-6, "1e-06"), (-0.01234567, "-0.01235"), (3, "3"), (None, MISSING),
    (math.nan, MISSING), (np.float32(0.5), "0.5"), (np.int64(70000), "70,000"), (True, "True"), ("x", "x"),
])
def test_one_number_style(value, text):
    assert number(value) == text


def test_frames_show_no_nan_or_none_and_one_style():
    df = pd.DataFrame({"acc": [0.848500, math.nan], "bytes": [51248.0, 8903.0], "name": ["a", None]})
    html = frame_html(df)
    cells = [c.split(">")[-1] for c in html.split("</td>")[:-1]]
    assert cells == ["0.8485", "51,248", "a", MISSING, "8,903", MISSING]
    assert 'class="dataframe"' in html


def test_figures_fit_the_column():
    from fedlib.evaluation.style import COLUMN_INCHES, fit_column

    from fedlib.evaluation.style import LEGEND_INCHES

    assert fit_column(6.0, 3.5) == (6.0, 3.5)                       # already fits: unchanged
    w, h = fit_column(16.0, 4.0)
    assert w == COLUMN_INCHES and h == pytest.approx(4.0 * 0.7)      # four panels: narrowed, height kept at 70 %
    assert fit_column(9.0, 4.0) == (COLUMN_INCHES, pytest.approx(4.0 * COLUMN_INCHES / 9.0))
    w, _ = fit_column(9.0, 4.0, legend=True)                         # room kept for a legend right of the axes
    assert w == pytest.approx(COLUMN_INCHES - LEGEND_INCHES)
    with pytest.raises(ValueError, match="positive"):
        fit_column(0.0, 3.0)


def test_missing_labels_read_a_dash_too():
    index = pd.MultiIndex.from_tuples([("Original", math.nan), ("noisy", 0.2)], names=["setting", "q"])
    html = frame_html(pd.DataFrame({"A_T": [34.97, 33.1]}, index=index))
    assert "NaN" not in html and "nan" not in html and f"<th>{MISSING}</th>" in html


def test_facets_fit_the_column():
    from fedlib.evaluation.style import COLUMN_INCHES, facet_size

    for columns, aspect, legend in [(1, 1.3, True), (2, 1.5, True), (3, 1.0, False), (5, 1.2, True)]:
        size = facet_size(columns, aspect, legend)
        width = columns * size["height"] * size["aspect"] + (1.6 if legend else 0.0)
        assert size["aspect"] == aspect and size["height"] <= 3.6 and width <= COLUMN_INCHES + 1e-9
    assert facet_size(1, 1.3, False)["height"] == 3.6                # one panel: capped, not stretched


def test_human_names_replace_identifiers():
    from fedlib.evaluation.style import human
    assert human("fashion_mnist") == "Fashion-MNIST" and human("efficientnet_lite0") == "EfficientNet-Lite0"
    assert human("fashion_mnist[train=10000,test=2000,seed=0]") == "Fashion-MNIST[train=10000,test=2000,seed=0]"
    assert human("feddisco") == "FedDisco" and human("something else") == "something else" and human(3) == "3"
    assert human("pretrained / fashion_mnist") == "pretrained / Fashion-MNIST"
    assert human("refed [exact Eq. 4]") == "Re-Fed [exact Eq. 4]" and human("fedavg_replay") == "FedAvg, random replay"


def test_a_confidence_level_every_cell_repeats_is_said_once_in_the_column_label():
    import pandas as pd

    from fedlib.evaluation.style import frame_html, said_once
    df = pd.DataFrame({"AFL − method (pp)": ["+1.00 [+0.50, +1.50] (95% CI, n=5)", "—", "-0.20 [-1.00, +0.60] (95% CI, n=5)"],
                       "mixed": ["+1 [0, 2] (95% CI, n=5)", "+1 [0, 2] (95% CI, n=4)", "x"]})
    out = said_once(df)
    assert list(out.columns) == ["AFL − method (pp) (95% CI, n=5)", "mixed"]
    assert out.iloc[:, 0].tolist() == ["+1.00 [+0.50, +1.50]", "—", "-0.20 [-1.00, +0.60]"]
    assert out["mixed"].tolist() == df["mixed"].tolist()          # two different suffixes: left as they are
    assert frame_html(df).count("95% CI, n=5") == 1 + 0 + 1      # the label, and the mixed column's first cell


def test_frame_html_names_identifiers_in_the_labels():
    df = pd.DataFrame({"A_T": [1.5, 2.5]}, index=pd.Index(["fedlwf", "pretrained / mnist5k"], name="method"))
    html = frame_html(df)
    assert "FedLwF" in html and "pretrained / MNIST-5k" in html and "fedlwf" not in html


def test_styler_html_names_identifiers_after_the_chapters_own_label_formatting():
    from fedlib.evaluation.style import styler_html

    df = pd.DataFrame([[1.0, 2.0]], index=pd.Index(["fedewc"], name="method"), columns=pd.Index([0.5, 1.0], name="beta"))
    html = styler_html(df.style.set_caption("A_T"))
    assert "FedEWC" in html and ">0.5<" in html and ">1<" in html and "0.500000" not in html
    relabelled = styler_html(df.style.relabel_index(["stsa_e"], axis="index"))
    assert "STSA-E" in relabelled and "FedEWC" not in relabelled


def test_a_captioned_table_carries_its_caption():
    from fedlib.evaluation.style import captioned

    df = pd.DataFrame({"A_T": [1.5]}, index=["refed"])
    html = frame_html(captioned(df, "Ours: A_T (%) < 100"))
    assert html.index("<caption>Ours: A_T (%) &lt; 100</caption>") < html.index("<tbody>") and "caption" not in df.attrs
    assert "<caption>" not in frame_html(df)
    assert "Paper, Table 3" in captioned(df.style, "Paper, Table 3").to_html()


def test_styler_html_writes_unformatted_cells_as_plain_frames_do():
    from fedlib.evaluation.style import styler_html

    df = pd.DataFrame({"mean": [0.79666666], "std": [1.5e-7], "n": [2]})
    html = styler_html(df.style.format({"std": "{:.2e}"}))
    assert "0.7967" in html and "1.50e-07" in html and ">2<" in html and "0.796667" not in html


def test_named_renames_a_figures_method_column_only():
    from fedlib.evaluation.style import named

    df = pd.DataFrame({"method": ["fedavg_replay", "refed"], "setting": ["pretrained / mnist5k"] * 2, "A_T": [1.0, 2.0]})
    assert named(df)["method"].tolist() == ["FedAvg, random replay", "Re-Fed"] and named(df)["setting"][0] == df["setting"][0]
    assert named(df, "setting")["setting"][0] == "pretrained / MNIST-5k" and df["method"][0] == "fedavg_replay"


def test_legend_below_gathers_the_panels_legends_into_one_under_the_figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from fedlib.evaluation.style import legend_below

    fig, axes = plt.subplots(1, 2, layout="constrained")
    axes[0].plot([0, 1], label="a")
    axes[0].legend()
    axes[1].plot([1, 0], label="b")
    leg = legend_below(fig, axes[0], axes[1], extra=[(Line2D([], []), "c")], title="t")
    assert [t.get_text() for t in leg.get_texts()] == ["a", "b", "c"] and leg.get_title().get_text() == "t"
    assert axes[0].get_legend() is None and axes[1].get_legend() is None and fig.legends == [leg]
    plt.close(fig)


def test_a_method_keeps_its_colour_and_place_in_every_figure_of_its_paper():
    from fedlib.evaluation.style import PAPER_METHODS, method_colour, method_hue
    for paper, methods in PAPER_METHODS.items():
        colours = [method_colour(m, paper) for m in methods]
        assert len(set(colours)) == len(methods), paper   # one colour per method within a paper
    one = method_hue(["FedProx, random replay", "Re-Fed [exact Eq. 4]", "herding", "my rule"], "refed")
    other = method_hue(["my rule", "FedAvg", "Re-Fed [exact Eq. 4]"], "refed")
    assert one["hue_order"] == ["Re-Fed [exact Eq. 4]", "FedProx, random replay", "herding", "my rule"]
    assert other["hue_order"] == ["Re-Fed [exact Eq. 4]", "FedAvg", "my rule"]
    for label in ("Re-Fed [exact Eq. 4]", "my rule"):   # the figure's other methods change nothing
        assert one["palette"][label] == other["palette"][label] == method_colour(label, "refed")
    assert method_colour("fedewc", "stsa") == method_colour("FedEWC", "stsa")   # identifiers read as names
    # a bracketed note names the same method, except where it names another one
    assert method_colour("Re-Fed, class-balanced [exact Eq. 4]", "refed") == method_colour("refed_balanced", "refed")
    assert method_colour("Re-Fed [last-layer proxy]", "refed") != method_colour("Re-Fed [exact Eq. 4]", "refed")
    assert method_colour("my rule", "refed") not in [method_colour(m, "refed") for m in PAPER_METHODS["refed"]]
