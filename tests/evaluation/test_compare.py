"""fedlib.evaluation.compare: state-dict identity and differences, relative error, the check ledger."""
import numpy as np
import pytest
import torch

from fedlib.core.linalg import relative_error
from fedlib.evaluation.compare import CheckLog, max_state_difference, refed_label, states_equal


def test_states_equal_and_max_difference():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([1.0, 2.5]), "b": torch.tensor([0.5])}
    assert states_equal(a, dict(a)) and not states_equal(a, b) and not states_equal(a, {"w": a["w"]})
    assert max_state_difference(a, b) == 0.5
    with pytest.raises(ValueError, match="differ in their keys"):
        max_state_difference(a, {"w": a["w"]})


def test_relative_error_is_the_max_norm_for_numpy_torch_and_a_zero_reference():
    assert relative_error(np.array([1.0, 3.0, 0.0]), np.array([1.0, 4.0, 1.0])) == 0.25   # Frobenius: 1/3
    assert relative_error(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 4.0])) == 0.25
    assert relative_error(np.zeros(2), np.zeros(2)) == 0.0


def test_check_log_records_prints_and_asserts(capsys):
    log = CheckLog()
    log.check("error", 1e-12, 1e-10)
    log.check("count", 3, 3, "==")
    assert "OK   error: 1e-12 (required <= 1e-10)" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="too big"):
        log.check("too big", 2.0, 1.0)
    frame = log.frame()
    assert list(frame["passed"]) == [True, True, False] and list(frame["required"]) == ["<= 1e-10", "== 3", "<= 1.0"]
    with pytest.raises(ValueError, match="op must be one of"):
        log.check("x", 1, 1, "~")


def test_refed_label():
    assert refed_label("refed") == "refed [exact Eq. 4]"
    assert refed_label("refed_proxy") == "refed [last-layer proxy]"
    assert refed_label("refed_balanced", "last_layer") == "refed_balanced [last-layer proxy]"
    assert refed_label("fedavg_replay", "last_layer") == "fedavg_replay"
