"""Flower's simulation engine (run_simulation, Ray backend, virtual SuperNodes): every protocol gives
the in-process result; malformed uploads are rejected with a logged reason."""
from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from conftest import afl_ridge_reference  # noqa: E402

from fedlib.flower.engines import run_simulation_engine  # noqa: E402
from fedlib.flower.tasks import Task, parse_options  # noqa: E402


@pytest.mark.parametrize("name,options,tol", [
    ("afl", "num-clients=4", 1e-10), ("stsa", "method=STSA-E", 1e-10),
    ("gradient", "method=fedavg participation=0.67", 0.0), ("feddl", "", 1e-10), ("refed", "", 0.0)])
def test_simulation_engine_equals_in_process(name, options, tol):
    config = parse_options(name, options)
    reference = Task(config).run()
    outcome, report = run_simulation_engine(config, num_cpus=2)
    assert outcome.difference(reference.arrays) <= tol
    if name == "gradient":   # the same client sampling, round by round
        assert outcome.summary["participants"] == reference.summary["participants"]
    assert report["flower"]["answered"] == list(range(config["num-clients"]))
    assert report["fedlib_bytes_up"] == reference.summary["fedlib_bytes_up"]
    assert report["flower"]["flower_bytes"]["array_up"] >= report["fedlib_bytes_up"]


def test_simulation_rejects_malformed_statistics(caplog):
    import signal

    config = parse_options("afl", "num-clients=4")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with caplog.at_level("WARNING", logger="fedlib.flower"):
        outcome, report = run_simulation_engine(config, faults={1: "nan", 2: "shape"}, num_cpus=2)
    # Ray's SIGTERM handler does not stay behind (it hung later forked pools of this process)
    assert {s: signal.getsignal(s) for s in before} == before
    flower = report["flower"]
    assert flower["answered"] == [0, 3] and set(flower["rejected"]) == {"1", "2"}
    assert "non-finite" in flower["rejected"]["1"] and "shape" in flower["rejected"]["2"]
    assert "client 1 left out of step 1 round 1: malformed upload: refused" in caplog.text
    assert "client 2 left out of step 1 round 1: malformed upload: refused" in caplog.text
    want = afl_ridge_reference(Task(config), [0, 3])
    assert outcome.difference({"weights_regularized": want}) < 1e-10
