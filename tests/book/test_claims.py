"""The claims ledger: records, their verdicts, collection from executed notebooks, the page."""
import json

import nbformat
import pytest

from fedlib.runner import book

from fedlib.evaluation import claims


def test_verdict_follows_the_measurement():
    assert claims.verdict_of(True, None) == "verified"
    assert claims.verdict_of(True, "label skew only") == "holds only if"
    assert claims.verdict_of(False, None) == "refuted"
    assert claims.verdict_of(None, None) == "not checkable offline"
    assert claims.verdict_of(False, None, inconclusive=True) == "inconclusive"
    assert claims.verdict_of(None, None, not_comparable="backbone time left out") == "not comparable"


@pytest.mark.parametrize("kwargs, match", [
    (dict(claim_id="Bad Id"), "lowercase slug"),
    (dict(paper="fedavg"), "unknown paper 'fedavg'; allowed: afl"),
    (dict(holds="yes"), "holds must be a bool"),
    (dict(evidence=" "), "evidence must be a non-empty"),
    # an inconclusive verdict says what the data rule out
    (dict(holds=False, inconclusive=True), "must say what the data rule out"),
    # a verdict may not cover a method that did not run
    (dict(methods=["afl", "fedgen"], ran=["afl", "fedavg"], budget="b", convergence="c", converged=True),
     "names fedgen, which did not run"),
    (dict(methods=["afl", "fedavg"]), "must say which ran"),
    # a comparison names its budget and its convergence evidence
    (dict(methods=["afl", "fedavg"], ran=["afl", "fedavg"]), "names its budget, its convergence"),
    # no verdict rests on a budget that did not converge
    (dict(methods=["afl", "fedavg"], ran=["afl", "fedavg"], budget="20 rounds", convergence="moved 3 pp",
          converged=False), "did not converge at its budget"),
    (dict(holds=False, methods=["afl", "fedavg"], ran=["afl", "fedavg"], budget="20 rounds",
          convergence="moved 3 pp", converged=False), "did not converge at its budget"),
    (dict(not_comparable="different work"), "not comparable has no holds"),
    (dict(methods="afl"), "list of method names"),
])
def test_bad_records_are_refused(kwargs, match):
    args = dict(claim_id="afl-x", paper="afl", statement="s", holds=True, evidence="e") | kwargs
    with pytest.raises(ValueError, match=match):
        claims.make_record(args.pop("claim_id"), args.pop("paper"), args.pop("statement"), **args)


def _notebook_with_claims(path, records):
    cells = [nbformat.v4.new_code_cell("x")]
    cells[0].outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "c"},
                                               metadata={claims.METADATA_KEY: r}) for r in records]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)


def test_register_displays_and_collect_reads_back(tmp_path, capsys):
    import numpy as np
    rec = claims.register("afl-weight-invariance", "afl", "Equal to centralized ridge.",
                          holds=np.float64(1e-14) < 1e-10, evidence="max rel. error 1e-14")
    assert rec["verdict"] == "verified"
    assert "Our verdict: verified" in capsys.readouterr().out
    refuted = claims.make_record("stsa-lemma-3-5", "stsa", "Lemma 3.5 bound.", holds=False, evidence="MC 6996 vs 202.5")
    _notebook_with_claims(tmp_path / "ch1.ipynb", [rec])
    _notebook_with_claims(tmp_path / "ch2.ipynb", [refuted])
    got = claims.collect(tmp_path, ["ch2", "ch1", "missing"])
    assert [r["id"] for r in got] == ["stsa-lemma-3-5", "afl-weight-invariance"]
    assert got[1]["chapter"] == "ch1"
    page = claims.ledger_markdown(got)
    assert '<a href="executed/ch1.html#claim-afl-weight-invariance">ch1</a>' in page
    assert "| **refuted** |" in page and "# STSA" in page
    _notebook_with_claims(tmp_path / "ch3.ipynb", [rec])
    with pytest.raises(ValueError, match="registered twice"):
        claims.collect(tmp_path)


def test_notebook_errors_found(tmp_path):
    good = tmp_path / "good.ipynb"
    _notebook_with_claims(good, [])
    assert book.notebook_errors(good) == []
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1/0")])
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                                                  traceback=[])]
    nbformat.write(nb, tmp_path / "bad.ipynb")
    assert book.notebook_errors(tmp_path / "bad.ipynb") == ["ZeroDivisionError: division by zero"]
    flagged = json.loads(good.read_text())
    flagged["metadata"]["papermill"] = {"exception": True}
    (tmp_path / "flagged.ipynb").write_text(json.dumps(flagged))
    assert book.notebook_errors(tmp_path / "flagged.ipynb") == ["papermill marked the run as failed"]


def test_qualified_records_keep_their_evidence_and_show_it():
    """An unconverged comparison is recorded as inconclusive with what it rules out; a claim naming
    a method that did not run can hold only under a condition; both show their qualifiers."""
    rec = claims.make_record(
        "afl-beats", "afl", "AFL beats A and B.", holds=False, evidence="e", inconclusive=True, rules_out="CI [-1, +2] pp",
        methods=["afl", "a", "b"], ran=["afl", "a"], budget="20 rounds", convergence="moved 3 pp", converged=False)
    assert rec["verdict"] == "inconclusive" and rec["converged"] is False
    text = claims.ledger_markdown([{**rec, "chapter": "afl_benchmark", "profile": "quick", "overrides": {}}])
    for part in ("CI [-1, +2] pp", "Budget: 20 rounds", "Convergence: moved 3 pp", "Not run: b", "| quick |"):
        assert part in text, part
    held = claims.make_record("afl-beats", "afl", "AFL beats A and B.", holds=True, condition="for A (B not run)",
                              evidence="e", methods=["afl", "a", "b"], ran=["afl", "a"], budget="200 rounds",
                              convergence="moved 0.1 pp", converged=True, record="afl_converged")
    assert held["verdict"] == "holds only if" and held["record"] == "afl_converged"
    nc = claims.make_record("afl-speed", "afl", "50x faster.", holds=None, evidence="e", not_comparable="backbone")
    assert claims._verdict_text(nc) == "not comparable: backbone"


def test_findings_table_has_one_row_per_claim_with_its_key_number_and_budget():
    recs = [{**claims.make_record("afl-a", "afl", "Claim A.", holds=True, evidence="first 1.0; second",
                                  key="AFL 84.9 %"), "chapter": "afl_benchmark", "profile": "quick", "overrides": {}},
            {**claims.make_record("refed-b", "refed", "Claim B.", holds=False, evidence="diff -0.4; more"),
             "chapter": "refed_benchmark", "profile": "quick", "overrides": {"seeds": [0, 1]}}]
    text = claims.findings_markdown(recs)
    rows = [line for line in text.splitlines() if line.startswith("| AFL") or line.startswith("| Re-Fed")]
    assert len(rows) == 2
    assert "AFL 84.9 %" in rows[0] and "**verified**" in rows[0] and "| quick |" in rows[0]
    assert "diff -0.4" in rows[1] and "quick; seeds=[0, 1]" in rows[1] and "refed_benchmark.html#claim-refed-b" in rows[1]
