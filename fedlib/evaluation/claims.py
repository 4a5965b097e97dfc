"""The claims ledger: each chapter registers the papers' headline claims as it runs.

In a chapter::

    claims.register("afl-weight-invariance", "afl",
                    "AFL's aggregate equals centralized ridge for any partition and client count.",
                    holds=bool(worst <= tol), evidence=f"max relative error {worst:.1e} <= {tol:.0e}")

``holds`` is computed from the measurement in that cell; ``holds=None`` means the claim cannot be
checked offline (``evidence`` says why); a ``condition`` qualifies a claim that holds only under it;
``inconclusive=True`` says that our runs resolve neither outcome (a confidence interval that
contains both), which is not a refutation, and needs ``rules_out``: what the data do rule out (the
interval's bounds) and how many paired seeds would resolve the paper's effect
(:func:`fedlib.evaluation.stats.seeds_for_power`); ``not_comparable="reason"`` says that our
measurement and the paper's do not measure the same thing.

A *comparison of methods* names them (``methods``) and what ran (``ran``): a verdict may not cover
a method that did not run (``verified`` is refused; name it in the condition), and it names its
``budget`` and its ``convergence`` evidence (:func:`fedlib.evaluation.stats.plateau`); a verdict on a
budget that did not converge (``converged=False``) can only be ``inconclusive``. ``record`` names
the recorded run (:mod:`fedlib.evaluation.records`) the verdict rests on. The runner adds each
chapter's profile and overrides to its records when they are collected.
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
VERDICTS = ("verified", "holds only if", "refuted", "inconclusive", "not comparable", "not checkable offline")
METADATA_KEY = "fedlib-claim"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def verdict_of(holds: bool | None, condition: str | None, inconclusive: bool = False,
               not_comparable: str | None = None) -> str:
    """verified (holds, no condition), holds only if (holds under ``condition``), refuted,
    inconclusive (``inconclusive``: the runs resolve neither outcome), not comparable (our
    measurement and the paper's differ: ``not_comparable`` says how), or not checkable offline
    (``holds`` is None)."""
    if not_comparable:
        return "not comparable"
    if inconclusive:
        return "inconclusive"
    if holds is None:
        return "not checkable offline"
    if holds:
        return "holds only if" if condition else "verified"
    return "refuted"


def _text(name: str, value, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string" + (" or None" if optional else ""))
    return value.strip()


def _names(name: str, value) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name} must be a list of method names, got {value!r}")
    return list(value)


def make_record(claim_id: str, paper: str, statement: str, *, holds: bool | None, evidence: str,
                condition: str | None = None, inconclusive: bool = False, rules_out: str | None = None,
                not_comparable: str | None = None, methods=None, ran=None, budget: str | None = None,
                convergence: str | None = None, converged: bool | None = None, record: str | None = None,
                key: str | None = None) -> dict:
    """Validated claim record (a plain dict, JSON-serializable); the rules of the module docstring
    are enforced here, so a chapter cannot register a verdict its evidence does not support."""
    if not isinstance(claim_id, str) or not _ID.match(claim_id):
        raise ValueError(f"claim_id must be a lowercase slug like 'afl-weight-invariance', got {claim_id!r}")
    if paper not in PAPERS:
        raise ValueError(f"unknown paper {paper!r}; allowed: {', '.join(PAPERS)}")
    if holds is not None:
        # numpy bools are accepted (they come from comparisons); anything else is a typo
        if not isinstance(holds, (bool, np.bool_)):
            raise ValueError(f"holds must be a bool computed from the measurement, or None; got {holds!r}")
        holds = bool(holds)
    statement, evidence = _text("statement", statement, False), _text("evidence", evidence, False)
    condition, rules_out, not_comparable = (_text("condition", condition), _text("rules_out", rules_out),
                                            _text("not_comparable", not_comparable))
    budget, convergence, record = _text("budget", budget), _text("convergence", convergence), _text("record", record)
    key = _text("key", key)
    methods, ran = _names("methods", methods), _names("ran", ran)
    verdict = verdict_of(holds, condition, bool(inconclusive), not_comparable)
    if not_comparable and holds is not None:
        raise ValueError(f"{claim_id}: a claim that is not comparable has no holds (got {holds!r})")
    if verdict == "inconclusive" and rules_out is None:
        raise ValueError(f"{claim_id}: an inconclusive verdict must say what the data rule out (rules_out)")
    if methods is not None:
        if ran is None:
            raise ValueError(f"{claim_id}: a claim that names methods must say which ran (ran)")
        missing = [m for m in methods if m not in ran]
        if missing and verdict == "verified":
            raise ValueError(f"{claim_id}: the claim names {', '.join(missing)}, which did not run: "
                             f"it cannot be verified (name them in the condition)")
        if len(methods) >= 2 and (budget is None or convergence is None or converged is None):
            raise ValueError(f"{claim_id}: a comparison of methods names its budget, its convergence evidence "
                             f"and whether it converged")
    if converged is not None and not isinstance(converged, (bool, np.bool_)):
        raise ValueError(f"{claim_id}: converged must be a bool computed from the curves, got {converged!r}")
    if converged is False and verdict in ("verified", "holds only if", "refuted"):
        raise ValueError(f"{claim_id}: the comparison did not converge at its budget ({budget}): "
                         f"its verdict can only be inconclusive")
    rec = {"id": claim_id, "paper": paper, "statement": statement, "verdict": verdict, "condition": condition,
           "evidence": evidence}
    extra = {"rules_out": rules_out, "not_comparable": not_comparable, "methods": methods, "ran": ran,
             "budget": budget, "convergence": convergence,
             "converged": None if converged is None else bool(converged), "record": record, "key": key}
    return {**rec, **{k: v for k, v in extra.items() if v is not None}}


def _verdict_text(rec: dict) -> str:
    if rec["verdict"] == "holds only if":
        return f"holds only if {rec['condition']}"
    if rec["verdict"] == "not comparable":
        return f"not comparable: {rec['not_comparable']}"
    return rec["verdict"]


def _details(rec: dict) -> list[tuple[str, str]]:
    """(label, text) of the record's qualifiers shown under its evidence."""
    rows = [("What the data rule out", rec.get("rules_out")), ("Budget", rec.get("budget")),
            ("Convergence", rec.get("convergence")),
            ("Recorded run", rec.get("record") and f"book/records/{rec['record']}")]
    if rec.get("methods") and set(rec["methods"]) - set(rec.get("ran", [])):
        rows.append(("Not run", ", ".join(m for m in rec["methods"] if m not in rec["ran"])))
    return [(k, v) for k, v in rows if v]


def register(claim_id: str, paper: str, statement: str, *, holds: bool | None, evidence: str, **qualifiers) -> dict:
    """Record one claim of ``paper`` in the running chapter and show its verdict box
    (``qualifiers``: the keyword arguments of :func:`make_record`)."""
    rec = make_record(claim_id, paper, statement, holds=holds, evidence=evidence, **qualifiers)
    e = html.escape
    details = "".join(f"<p><em>{e(k)}:</em> {e(v)}</p>" for k, v in _details(rec))
    box = (f'<div class="fedlib-claim" id="claim-{rec["id"]}" style="border-left:4px solid #888;'
           f'padding:0.3em 0.8em;margin:0.5em 0">'
           f'<p><strong>Claim ({e(PAPERS[paper])}):</strong> {e(rec["statement"])}</p>'
           f'<p><strong>Our verdict: {e(_verdict_text(rec))}.</strong> {e(rec["evidence"])}</p>{details}</div>')
    plain = "\n".join([f"Claim [{rec['id']}] ({PAPERS[paper]}): {rec['statement']}",
                       f"Our verdict: {_verdict_text(rec)}. {rec['evidence']}",
                       *(f"{k}: {v}" for k, v in _details(rec))])
    try:
        from IPython.display import display
        display({"text/html": box, "text/plain": plain}, raw=True, metadata={METADATA_KEY: rec})
    except ImportError:  # pragma: no cover - IPython ships with the book extra
        print(plain)
    return rec


RUN_KEY = "fedlib-run"  # notebook metadata: {"profile": ..., "overrides": {...}} (written by the runner)


def claims_in_notebook(path: Path) -> list[dict]:
    """Claim records in one executed notebook (in cell order), each with its ``chapter`` and the
    run's ``profile`` and ``overrides`` added (from the notebook's metadata, or papermill's
    parameters for a notebook the runner did not write)."""
    nb = json.loads(Path(path).read_text())
    meta = nb.get("metadata", {})
    run = meta.get(RUN_KEY) or {"profile": meta.get("papermill", {}).get("parameters", {}).get("profile"),
                                "overrides": None}
    out = []
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            rec = output.get("metadata", {}).get(METADATA_KEY)
            if rec:
                out.append({**rec, "chapter": Path(path).stem, "profile": run.get("profile"),
                            "overrides": run.get("overrides")})
    return out


def run_label(rec: dict) -> str:
    """The profile a claim ran at and its overrides: ``quick`` or ``quick; rounds=200``."""
    profile = rec.get("profile") or "unknown profile"
    over = rec.get("overrides") or {}
    return "; ".join([profile, *(f"{k}={v}" for k, v in sorted(over.items()))])


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
    ``:heading-offset: 1``), folded (``fedlib.runner.folding``) so that the page opens on the counts."""
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
        lines += [f"# {title}", "", f":::{{folded}} The {len(recs)} claims of this paper, with their evidence", ":::", "",
                  "| claim (the paper's statement) | our verdict | evidence (measured) | ran at | where |",
                  "|---|---|---|---|---|"]
        for r in recs:
            link = f'<a href="{link_prefix}{r["chapter"]}.html#claim-{r["id"]}">{r["chapter"]}</a>'
            evidence = " ".join([r["evidence"], *(f"{k}: {v}." for k, v in _details(r))])
            lines.append(f"| {_cell(r['statement'])} | **{_cell(_verdict_text(r))}** | {_cell(evidence)} | "
                         f"{_cell(run_label(r))} | {link} |")
        lines.append("")
    return "\n".join(lines)


def key_number(rec: dict) -> str:
    """The record's headline number: ``key`` when the chapter gave one, else the evidence's first clause."""
    return rec.get("key") or rec["evidence"].split(";")[0].strip().rstrip(".")


def findings_markdown(records: list[dict], link_prefix: str = "executed/") -> str:
    """The book's findings, one row per claim: the claim, its paper, our verdict, the key number, the
    budget it rests on (or the profile it ran at), each cut to a line or two (the ledger has them
    whole), and a link to the cell that decided it."""
    if not records:
        return "No chapter has been executed yet, so there is no finding to show.\n"
    short = {"afl": "AFL", "stsa": "STSA", "fedtsne": "Fed-tSNE", "refed": "Re-Fed"}
    lines = ["| paper | claim | our verdict | key number | budget or profile | where |", "|---|---|---|---|---|---|"]
    for r in records:
        link = f'<a href="{link_prefix}{r["chapter"]}.html#claim-{r["id"]}">{r["chapter"]}</a>'
        where = r.get("budget") or run_label(r)
        lines.append(f"| {short[r['paper']]} | {_cell(_short(r['statement'], 140))} | **{_cell(r['verdict'])}** | "
                     f"{_cell(_short(key_number(r), 100))} | {_cell(_short(where, 90))} | {link} |")
    return "\n".join(lines) + "\n"


def _short(text: str, limit: int = 110) -> str:
    """``text`` cut at a word boundary to at most about ``limit`` characters."""
    text = " ".join(text.split()).rstrip(".")
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def chapter_findings_markdown(records: list[dict]) -> str:
    """A chapter's findings for its first screen: one line per claim it registers (our verdict, the
    paper's statement shortened, the key number, a link to the cell), computed from its executed run."""
    if not records:
        return ""
    lines = ["**What this chapter finds** (each line links to the check; all claims: {doc}`/book/claims`):", ""]
    for r in records:
        lines.append(f"- **{r['verdict']}**: {_cell(_short(r['statement']))} — {_cell(_short(key_number(r), 90))} "
                     f'<a href="#claim-{r["id"]}">→</a>')
    return "\n".join(lines) + "\n"
