"""The book's look, set by one call at the top of every chapter: ``book_style()``.

* Numbers in tables: one style (:func:`number`): whole numbers with thousands separators (51,248, not
  51248.00; values from 10,000 up rounded to whole numbers), other values to 4 significant digits (0.8485, not 0.848500; 1e-06, not 0.000001).
* Missing values in tables read "—", never ``nan`` or ``None`` (plain DataFrames and Stylers).
* Data sets, backbones and methods go by their names, not their identifiers (:func:`human`:
  "Fashion-MNIST", not ``fashion_mnist``).
* Figures: seaborn's whitegrid theme at 110 dpi; :func:`fit_column` sizes a figure for the page's
  column (at most :data:`COLUMN_INCHES` wide), so that the page shows it at 80 % of its size or more
  and its 10-point labels stay legible. A method keeps one colour and one place in the order in every
  figure of its paper (:func:`method_hue`, :func:`method_colour`).
"""
from __future__ import annotations

import math
import numbers
import re
import zlib
from html import escape

import pandas as pd
from pandas.io.formats.style import Styler

__all__ = ["COLUMN_INCHES", "LEGEND_INCHES", "MISSING", "NAMES", "human", "named", "number", "said_once", "frame_html", "captioned", "styler_html", "fit_column", "legend_below", "facet_size", "PAPER_METHODS", "METHOD_ALIASES", "method_colour", "method_hue", "book_style"]

# a figure's output box is 768 px wide in a 1400 px window: a figure up to 960 px (8.7 in at 110 dpi)
# is shown at 80 % of its size or more; 7.2 in leaves room for tick labels and titles past the axes
COLUMN_INCHES = 7.2
LEGEND_INCHES = 1.6   # a legend placed to the right of the axes
MISSING = "—"


# what a reader calls the data sets, backbones and methods that the parameters name by identifier
NAMES = {
    "fashion_mnist": "Fashion-MNIST", "mnist5k": "MNIST-5k", "mnist": "MNIST", "optdigits": "optdigits",
    "animal_mnist": "Animal-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "tiny_imagenet": "Tiny-ImageNet",
    "efficientnet_lite0": "EfficientNet-Lite0", "resnet18": "ResNet-18", "raw": "raw pixels",
    "fedavg": "FedAvg", "fedprox": "FedProx", "feddyn": "FedDyn", "fedntd": "FedNTD", "moon": "MOON",
    "feddisco": "FedDisco", "fedgen": "FedGen", "afl": "AFL",
    "stsa": "STSA", "stsa_e": "STSA-E", "finetune": "fine-tuning", "fedewc": "FedEWC", "fedlwf": "FedLwF",
    "refed": "Re-Fed", "refed_balanced": "Re-Fed, class-balanced", "refed_proxy": "Re-Fed, last-layer norms",
    "fedavg_replay": "FedAvg, random replay", "fedprox_replay": "FedProx, random replay",
    "grand": "GraNd at w", "refed_local": "Re-Fed, λ → 1", "el2n": "EL2N",
    "reservoir": "class-balancing reservoir", "refed_task_class": "Re-Fed, task and class shares",
    "refed_task": "Re-Fed, task shares", "refed_class": "Re-Fed, class shares",
    "one_solve": "one-solve", "pairwise": "pairwise (recursive)", "tsne": "t-SNE", "umap": "UMAP",
}


def human(identifier) -> str:
    """What a reader calls ``identifier`` (a data set, backbone or method: "fashion_mnist" ->
    "Fashion-MNIST"); a subset's name keeps its sizes; anything else is returned as text."""
    text = str(identifier)
    if " / " in text:   # a setting: "pretrained / fashion_mnist"
        return " / ".join(map(human, text.split(" / ")))
    base, sep, rest = text.partition("[")
    key = base.rstrip()   # "refed [exact Eq. 4]": the name before a bracketed note
    return NAMES.get(key, key) + base[len(key):] + sep + rest


def named(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """``frame`` with ``columns`` (default: "method") in the names a reader knows (:func:`human`): the
    data of a figure whose legend or ticks show them."""
    return frame.assign(**{c: frame[c].map(human) for c in columns or ("method",)})


def number(x) -> str:
    """One number as the book prints it in a table: "—" for a missing value, whole numbers with
    thousands separators, anything else to 4 significant digits (exponent form below 1e-4)."""
    if x is None or (isinstance(x, numbers.Real) and math.isnan(x)):
        return MISSING
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return str(x)
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if float(x).is_integer() or abs(x) >= 1e4:
        return f"{round(x):,}"
    return f"{x:.4g}" if abs(x) >= 1e-4 else f"{x:.2g}"


SAID_ONCE = re.compile(r"\s*(\(\d+(?:\.\d+)?\s?% CI, n=\d+\))$")


def said_once(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a suffix that every filled cell of a column repeats ("(95% CI, n=5)") said once, in
    the column's label, instead of in every cell."""
    out = df.copy()
    for j, col in enumerate(df.columns):
        cells = [v for v in df.iloc[:, j] if isinstance(v, str) and v != MISSING]
        found = {m.group(1) if m else None for m in (SAID_ONCE.search(v) for v in cells)}
        if cells and len(found) == 1 and None not in found:
            suffix = found.pop()
            out.iloc[:, j] = [SAID_ONCE.sub("", v) if isinstance(v, str) else v for v in df.iloc[:, j]]
            name = f"{col[-1] if isinstance(col, tuple) else col} {suffix}"
            out = out.rename(columns={col: (*col[:-1], name) if isinstance(col, tuple) else name})
    return out


def frame_html(df) -> str:
    """A DataFrame's HTML for the book: pandas' own table (class ``dataframe``, the display options'
    row and column limits) with its :func:`captioned` caption, :func:`number` on every float, "—" for
    every missing cell or label, what a reader calls each identifier among the labels
    (:func:`human`), and a confidence level that every cell of a column repeats said once
    (:func:`said_once`)."""
    def label(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return MISSING
        return human(v) if isinstance(v, str) else v

    caption = df.attrs.get("caption")
    df = said_once(df.rename(index=label, columns=label))
    html = df.to_html(na_rep=MISSING, float_format=number, max_rows=pd.get_option("display.max_rows"),
                      max_cols=pd.get_option("display.max_columns"), notebook=True)
    if caption:   # captioned(): the caption inside the table, where a reader looks for it
        html = re.sub(r"(<table[^>]*>)", lambda m: f"{m.group(1)}\n  <caption>{escape(caption)}</caption>", html, count=1)
    return html


def captioned(table, caption: str):
    """``table`` (a DataFrame or a Styler) with ``caption`` above it when the book shows it: a Styler's
    own caption, or for a DataFrame a copy that :func:`frame_html` renders with a ``<caption>``."""
    if isinstance(table, pd.DataFrame):
        out = table.copy()
        out.attrs["caption"] = str(caption)
        return out
    return table.set_caption(str(caption))


def styler_html(styler) -> str:
    """A Styler's HTML for the book: a float cell that pandas would write at its default precision
    (0.796667: the chapter did not format it) is written by :func:`number`, as in a plain DataFrame;
    every label passes through :func:`human` after whatever label formatting the chapter set
    (``format_index``, ``relabel_index``), and a float label keeps only its significant digits
    (β = 0.5, not 0.500000)."""
    precision = pd.get_option("styler.format.precision")

    def named(show):
        def label(v):
            out = show(v)
            if isinstance(v, float) and out == f"{v:.{precision}f}":   # pandas' default label precision
                return f"{v:g}"
            return human(out) if isinstance(out, str) else out
        return label

    def written(show):   # pandas' default float text (0.796667) -> number() (0.7967); a chapter's format stays
        def cell(v):
            out = show(v)
            default = isinstance(v, float) and out == f"{v:.{precision}f}"
            return number(v) if default else out
        return cell

    for key in [(r, c) for r in range(len(styler.data.index)) for c in range(len(styler.data.columns))]:
        styler._display_funcs[key] = written(styler._display_funcs[key])
    index, columns = styler.index, styler.columns
    for funcs, keys in ((styler._display_funcs_index, [(r, c) for r in range(len(index)) for c in range(index.nlevels)]),
                        (styler._display_funcs_columns, [(r, c) for r in range(columns.nlevels) for c in range(len(columns))])):
        for key in keys:
            funcs[key] = named(funcs[key])
    return styler.to_html()


def fit_column(width: float, height: float, min_scale: float = 0.7, legend: bool = False) -> tuple[float, float]:
    """A ``figsize`` (inches) for the column: a figure wider than :data:`COLUMN_INCHES` (less
    :data:`LEGEND_INCHES` with ``legend``: one placed right of the axes) is narrowed to it, and its
    height scaled by the same factor but never below ``min_scale`` of itself (panels side by side
    stay tall enough to read)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"figsize must be positive, got ({width}, {height})")
    scale = min(1.0, (COLUMN_INCHES - (LEGEND_INCHES if legend else 0.0)) / width)
    return width * scale, height * max(scale, min_scale)


def legend_below(fig, *axes, extra=(), ncol: int = 2, **kwargs):
    """One legend for all panels, below them: the handles and labels of ``axes`` (their own legends
    removed) and ``extra`` (handle, label) pairs, in that order. ``fig`` needs ``layout="constrained"``
    (the legend goes "outside lower center"); ``kwargs`` go to ``fig.legend`` (a title, say)."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for h, lab in extra:
        handles, labels = handles + [h], labels + [lab]
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False, **kwargs)


#: each paper's methods (the names a reader sees, :func:`human`) in the order its figures list them;
#: a method's place in its paper's list is its colour in every figure of that paper ("afl_routes": the
#: AFL chapters' ways of computing one head, which never share a figure with the federated methods)
PAPER_METHODS = {
    "afl": ["AFL", "FedAvg", "FedProx", "FedDyn", "MOON", "FedNTD", "FedDisco", "FedGen"],
    "afl_routes": ["TSQR", "one-solve (normal eq.)", "pairwise AA law (paper)", "TSQR (float32 clients)"],
    "stsa": ["STSA", "STSA-E", "STSA-E (per-class K)", "AFL (stage-wise)", "Joint (centralized ridge)",
             "fine-tuning", "FedEWC", "FedLwF"],
    "refed": ["Re-Fed", "FedAvg, random replay", "FedProx, random replay", "FedAvg", "fixed", "Re-Fed, class-balanced",
              "Re-Fed, last-layer norms", "GraNd at w", "EL2N", "herding", "class-balancing reservoir",
              "Re-Fed, task shares", "Re-Fed, task and class shares", "Re-Fed, λ → 1", "FedEWC", "FedLwF"],
    "fedtsne": ["t-SNE", "UMAP"],
}

#: labels that name a listed method another way (they share its colour and place)
METHOD_ALIASES = {"TSQR (float64 clients)": "TSQR", "AFL (one-solve server, the paper's upload)": "one-solve (normal eq.)",
                  "Re-Fed [last-layer proxy]": "Re-Fed, last-layer norms"}


def _palette() -> list:
    import seaborn as sns

    pairs = sns.color_palette("tab20", 20)
    return [*pairs[0::2], *pairs[1::2]]   # ten strong colours, then their light shades


def _method_key(label) -> str:
    """A legend label's method: its reader's name, without a bracketed note ("Re-Fed [exact Eq. 4]" -> "Re-Fed")."""
    label = METHOD_ALIASES.get(str(label), str(label))
    key = human(re.sub(r"\s*\[[^\]]*\]$", "", label))
    return METHOD_ALIASES.get(key, key)


def method_colour(label, paper: str):
    """The colour of method ``label`` in every figure of ``paper`` (a key of :data:`PAPER_METHODS`): its
    place in the paper's list; a method not listed gets a colour fixed by its name (not by the figure)."""
    methods = PAPER_METHODS[paper]
    colours = _palette()
    key = _method_key(label)
    if key in methods:
        return colours[methods.index(key) % len(colours)]
    spare = colours[len(methods):] or colours
    return spare[zlib.crc32(key.encode()) % len(spare)]


def method_hue(levels, paper: str) -> dict:
    """seaborn's ``hue_order`` and ``palette`` for a figure of ``paper`` whose hue is the methods ``levels``
    (a column or any iterable of labels): the paper's order (:data:`PAPER_METHODS`), methods it does
    not list after, in their first appearance; each label in :func:`method_colour`."""
    seen = list(dict.fromkeys(map(str, levels)))
    rank = {m: i for i, m in enumerate(PAPER_METHODS[paper])}
    order = sorted(seen, key=lambda lab: rank.get(_method_key(lab), len(rank) + seen.index(lab)))
    return {"hue_order": order, "palette": {lab: method_colour(lab, paper) for lab in order}}


def facet_size(columns: int, aspect: float = 1.3, legend: bool = True) -> dict:
    """``height`` and ``aspect`` for a seaborn figure-level plot (``relplot``, ``catplot``) with
    ``columns`` panels in a row that fits :data:`COLUMN_INCHES` (:data:`LEGEND_INCHES` kept for a
    legend at the right), each panel at most 3.6 in tall."""
    columns = max(1, int(columns))
    width = COLUMN_INCHES - (LEGEND_INCHES if legend else 0.0)
    return {"height": min(3.6, width / (columns * aspect)), "aspect": aspect}


def book_style() -> None:
    """Set the figure theme and register :func:`frame_html` as the HTML of every DataFrame shown in
    this kernel, :func:`styler_html` as that of every Styler (and "—" for their missing cells).
    Safe to call again."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    mpl.rcParams["figure.dpi"] = 110
    pd.set_option("styler.format.na_rep", MISSING)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the book extra
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)
        shell.display_formatter.formatters["text/html"].for_type(Styler, styler_html)
