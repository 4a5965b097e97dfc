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


@pytest.mark.parametrize("kwargs, match", [
    (dict(claim_id="Bad Id"), "lowercase slug"),
    (dict(paper="fedavg"), "unknown paper 'fedavg'; allowed: afl"),
    (dict(holds="yes"), "holds must be a bool"),
    (dict(evidence=" "), "evidence must be a non-empty"),
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
