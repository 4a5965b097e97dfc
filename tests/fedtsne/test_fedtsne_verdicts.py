"""The verdict rules of the Fed-tSNE claims (fedlib.fedtsne.verdicts), on intervals made by hand on both
sides of every bound."""
import pytest

from fedlib.evaluation import claims
from fedlib.evaluation.stats import PairedDifference
from fedlib.fedtsne import verdicts as vd


def ci(low: float, high: float, sd: float = 0.02, n: int = 5) -> PairedDifference:
    return PairedDifference((low + high) / 2, sd, n, low, high, 0.95)


M = 0.04


@pytest.mark.parametrize("low, high, outcome", [
    (-0.039, 0.01, "within"),        # just above -m
    (-0.041, 0.01, "unresolved"),    # the lower bound crosses -m, the upper does not
    (-0.08, -0.041, "beyond"),       # wholly below -m
    (-0.08, -0.039, "unresolved"),   # the upper bound just inside
    (0.01, 0.2, "within"),           # better than the reference: non-inferior
])
def test_lower_margin_each_side_of_the_bound(low, high, outcome):
    check = vd.margin_check({"a": ci(low, high)}, M, "lower")
    assert {"within": check.within, "beyond": check.beyond, "unresolved": check.unresolved}[outcome] == ("a",)
    assert check.holds is {"within": True, "beyond": False, "unresolved": None}[outcome]
    assert check.inconclusive is (outcome == "unresolved")


@pytest.mark.parametrize("low, high, outcome", [
    (-0.039, 0.039, "within"),
    (-0.039, 0.041, "unresolved"),   # the upper bound outside +m
    (-0.041, 0.039, "unresolved"),   # the lower bound outside -m
    (0.041, 0.09, "beyond"),         # wholly above +m
    (-0.09, -0.041, "beyond"),       # wholly below -m
    (0.001, 0.039, "within"),        # excludes 0 but lies inside the margin: still nearly the same
    (0.001, 0.05, "unresolved"),     # excludes 0 and reaches past the margin: not shown to exceed it
])
def test_two_sided_margin_each_side_of_the_bounds(low, high, outcome):
    check = vd.margin_check({"a": ci(low, high)}, M, "two")
    assert check.holds is {"within": True, "beyond": False, "unresolved": None}[outcome]


def test_one_beyond_refutes_and_one_unresolved_keeps_it_open():
    diffs = {("x", "IID"): ci(-0.01, 0.01), ("x", "non-IID"): ci(-0.05, 0.0), ("y", "IID"): ci(-0.02, 0.0)}
    check = vd.margin_check(diffs, M, "lower")
    assert check.holds is None and check.unresolved == (("x", "non-IID"),)
    assert check.rules_out(diffs).startswith("x non-IID: the 95 % CI rules out a true difference below -0.0500")
    assert "paired seeds would detect the paper's -0.0400" in check.rules_out(diffs)
    refuted = vd.margin_check({**diffs, "z": ci(-0.09, -0.05)}, M, "lower")
    assert refuted.holds is False and refuted.rules_out(diffs) is None and refuted.beyond == ("z",)
    assert "-0.0400" in check.criterion("drop")


def test_margin_check_refuses_bad_input():
    with pytest.raises(ValueError):
        vd.margin_check({}, M)
    with pytest.raises(ValueError):
        vd.margin_check({"a": ci(0, 1)}, 0.0)
    with pytest.raises(ValueError):
        vd.margin_check({"a": ci(0, 1)}, M, "upper")
    with pytest.raises(ValueError):
        vd.margin_check({"a": (0, 1)}, M)


def test_verdict_fields_register_a_valid_record_for_every_outcome():
    """Inconclusive (with rules_out), unconverged (inconclusive whatever the intervals), a method that did
    not run (holds only if), verified and refuted: each is accepted by claims.make_record."""
    inside, open_, out = {"a": ci(-0.01, 0.01)}, {"a": ci(-0.05, 0.01)}, {"a": ci(-0.09, -0.05)}
    common = dict(methods=["Fed-tSNE", "Fed-UMAP"], budget="5 seeds", convergence="plateau rule")

    def record(diffs, converged=True, ran=("Fed-tSNE", "Fed-UMAP")):
        fields = vd.verdict_fields(vd.margin_check(diffs, M), diffs, converged=converged,
                                   missing=[m for m in common["methods"] if m not in ran])
        return claims.make_record("x-claim", "fedtsne", "s", evidence="e", ran=list(ran), converged=converged,
                                  **common, **fields)

    assert record(inside)["verdict"] == "verified"
    assert record(out)["verdict"] == "refuted"
    rec = record(open_)
    assert rec["verdict"] == "inconclusive" and "rules out" in rec["rules_out"]
    rec = record(inside, converged=False)
    assert rec["verdict"] == "inconclusive" and rec["rules_out"].startswith("the comparison did not converge")
    rec = record(out, converged=False)
    assert rec["verdict"] == "inconclusive"
    rec = record(inside, ran=("Fed-tSNE",))
    assert rec["verdict"] == "holds only if" and "Fed-UMAP did not run" in rec["condition"]
    assert record(out, ran=("Fed-tSNE",))["verdict"] == "refuted"


def test_level_check_finds_where_the_claim_starts_to_hold():
    by_eps = {1.0: {"t": ci(-0.9, -0.7)}, 100.0: {"t": ci(-0.2, -0.05)}, 1000.0: {"t": ci(-0.05, 0.0)},
              10000.0: {"t": ci(-0.02, 0.02)}}
    out = vd.level_check(by_eps, M)
    assert out.holds_from == 10000.0 and out.fails_at == (1.0, 100.0) and out.unresolved_at == (1000.0,)
    # a level within the margin below one that is not does not count: the claim must hold from it on
    out = vd.level_check({**by_eps, 1.0: {"t": ci(-0.01, 0.01)}}, M)
    assert out.holds_from == 10000.0 and out.fails_at == (100.0,)
    assert vd.level_check({1.0: {"t": ci(-0.9, -0.7)}}, M).holds_from is None
    assert vd.level_check({1.0: {"t": ci(-0.01, 0.0)}, 2.0: {"t": ci(0.0, 0.01)}}, M).holds_from == 1.0
    with pytest.raises(ValueError):
        vd.level_check({}, M)
