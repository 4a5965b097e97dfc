"""The claims ledger: each chapter registers the papers' headline claims as it runs.

In a chapter::

    claims.register("afl-weight-invariance", "afl",
                    "AFL's aggregate equals centralized ridge for any partition and client count.",
                    holds=bool(worst <= tol), evidence=f"max relative error {worst:.1e} <= {tol:.0e}")

``holds`` is computed from the measurement in that cell; ``holds=None`` means the claim cannot be
checked offline (``evidence`` says why); a ``condition`` qualifies a claim that holds only under it;
``inconclusive=True`` says that our runs resolve neither outcome (a confidence interval that
contains both), which is not a refutation.
The record is displayed as a verdict box (with an HTML anchor) and stored in the cell's output
metadata under ``fedlib-claim``. :func:`collect` reads the records back from the executed notebooks,
so the ledger page (:func:`ledger_markdown`, written by the book's Sphinx extension ``fedlib.runner.book``)
is built from what ran, never typed by hand.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np

PAPERS = {
    "afl": "Analytic Federated Learning (Zhuang et al., 2024)",
    "stsa": "STSA / STSA-E (Guan et al.)",
    "fedtsne": "Federated t-SNE / UMAP / spectral clustering (Qiao et al., 2025)",
    "refed": "Re-Fed (Li et al., 2024)",
}
VERDICTS = ("verified", "holds only if", "refuted", "inconclusive", "not checkable offline")
METADATA_KEY = "fedlib-claim"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def verdict_of(holds: bool | None, condition: str | None, inconclusive: bool = False) -> str:
    """verified (holds, no condition), holds only if (holds under ``condition``), refuted,
    inconclusive (``inconclusive``: the runs resolve neither outcome), or not checkable offline
    (``holds`` is None)."""
    if inconclusive:
        return "inconclusive"
    if holds is None:
        return "not checkable offline"
    if holds:
        return "holds only if" if condition else "verified"
    return "refuted"


def make_record(claim_id: str, paper: str, statement: str, *, holds: bool | None, evidence: str,
                condition: str | None = None, inconclusive: bool = False) -> dict:
    """Validated claim record (a plain dict, JSON-serializable)."""
    if not isinstance(claim_id, str) or not _ID.match(claim_id):
        raise ValueError(f"claim_id must be a lowercase slug like 'afl-weight-invariance', got {claim_id!r}")
    if paper not in PAPERS:
        raise ValueError(f"unknown paper {paper!r}; allowed: {', '.join(PAPERS)}")
    if holds is not None:
        # numpy bools are accepted (they come from comparisons); anything else is a typo
        if not isinstance(holds, (bool, np.bool_)):
            raise ValueError(f"holds must be a bool computed from the measurement, or None; got {holds!r}")
        holds = bool(holds)
    for name, text in (("statement", statement), ("evidence", evidence)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name} must be a non-empty string")
    if condition is not None and (not isinstance(condition, str) or not condition.strip()):
        raise ValueError("condition must be None or a non-empty string")
    return {"id": claim_id, "paper": paper, "statement": statement.strip(),
            "verdict": verdict_of(holds, condition, bool(inconclusive)), "condition": condition, "evidence": evidence.strip()}


def _verdict_text(rec: dict) -> str:
    return f"holds only if {rec['condition']}" if rec["verdict"] == "holds only if" else rec["verdict"]


def register(claim_id: str, paper: str, statement: str, *, holds: bool | None, evidence: str,
             condition: str | None = None, inconclusive: bool = False) -> dict:
    """Record one claim of ``paper`` in the running chapter and show its verdict box."""
    rec = make_record(claim_id, paper, statement, holds=holds, evidence=evidence, condition=condition,
                      inconclusive=inconclusive)
    e = html.escape
    box = (f'<div class="fedlib-claim" id="claim-{rec["id"]}" style="border-left:4px solid #888;'
           f'padding:0.3em 0.8em;margin:0.5em 0">'
           f'<p><strong>Claim ({e(PAPERS[paper])}):</strong> {e(rec["statement"])}</p>'
           f'<p><strong>Our verdict: {e(_verdict_text(rec))}.</strong> {e(rec["evidence"])}</p></div>')
    plain = (f"Claim [{rec['id']}] ({PAPERS[paper]}): {rec['statement']}\n"
             f"Our verdict: {_verdict_text(rec)}. {rec['evidence']}")
    try:
        from IPython.display import display
        display({"text/html": box, "text/plain": plain}, raw=True, metadata={METADATA_KEY: rec})
    except ImportError:  # pragma: no cover - IPython ships with the book extra
        print(plain)
    return rec


def claims_in_notebook(path: Path) -> list[dict]:
    """Claim records in one executed notebook (in cell order), each with its ``chapter`` added."""
    nb = json.loads(Path(path).read_text())
    out = []
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            rec = output.get("metadata", {}).get(METADATA_KEY)
            if rec:
                out.append({**rec, "chapter": Path(path).stem})
    return out


def collect(executed_dir: Path, chapters: list[str] | None = None) -> list[dict]:
    """All claim records of the executed notebooks in ``executed_dir`` (``chapters`` in that order, or
    every ``*.ipynb``). Raises ValueError on a claim id registered twice."""
    executed_dir = Path(executed_dir)
    paths = ([executed_dir / f"{c}.ipynb" for c in chapters] if chapters is not None
             else sorted(executed_dir.glob("*.ipynb")))
    records, seen = [], {}
    for path in paths:
        if not path.exists():
            continue
        for rec in claims_in_notebook(path):
            if rec["id"] in seen:
                raise ValueError(f"claim {rec['id']!r} registered twice ({seen[rec['id']]} and {rec['chapter']})")
            seen[rec["id"]] = rec["chapter"]
            records.append(rec)
    return records


def _cell(text: str) -> str:
    return html.escape(" ".join(str(text).split())).replace("|", "&#124;")


def ledger_markdown(records: list[dict], link_prefix: str = "executed/") -> str:
    """The ledger as MyST markdown: a verdict count, then one table per paper (statement, verdict,
    evidence, a link to the cell that checked it) under a level-1 heading (include it with
    ``:heading-offset: 1``)."""
    if not records:
        return "No chapter has been executed yet, so no claim is registered.\n"
    lines = ["| paper | " + " | ".join(VERDICTS) + " |", "|---" * (len(VERDICTS) + 1) + "|"]
    for key, title in PAPERS.items():
        recs = [r for r in records if r["paper"] == key]
        if recs:
            counts = [sum(r["verdict"] == v for r in recs) for v in VERDICTS]
            lines.append(f"| {_cell(title)} | " + " | ".join(map(str, counts)) + " |")
    lines.append("")
    for key, title in PAPERS.items():
        recs = [r for r in records if r["paper"] == key]
        if not recs:
            continue
        lines += [f"# {title}", "", "| claim (the paper's statement) | our verdict | evidence (measured) | where |",
                  "|---|---|---|---|"]
        for r in recs:
            link = f'<a href="{link_prefix}{r["chapter"]}.html#claim-{r["id"]}">{r["chapter"]}</a>'
            lines.append(f"| {_cell(r['statement'])} | **{_cell(_verdict_text(r))}** | {_cell(r['evidence'])} | {link} |")
        lines.append("")
    return "\n".join(lines)
