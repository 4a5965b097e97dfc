"""Flower's deployment engine on loopback: a real SuperLink and 3 SuperNodes as separate processes
(free ports, a private Flower home), `flwr run` of fedlib's app, everything stopped afterwards."""
from __future__ import annotations

import psutil
import pytest

pytest.importorskip("flwr")

from conftest import afl_ridge_reference  # noqa: E402

from fedlib.flower.engines import run_deployment  # noqa: E402
from fedlib.flower.tasks import Outcome, Task, parse_options  # noqa: E402


def flower_processes() -> list[str]:
    names = ("flower-superlink", "flower-supernode", "flwr-serverapp", "flwr-clientapp", "flwr run")
    mine = psutil.Process().children(recursive=True)
    return [" ".join(p.cmdline()) for p in mine if any(n in " ".join(p.cmdline()) for n in names)]


def test_deployment_afl_optdigits_equals_in_process(tmp_path):
    config = parse_options("afl", "dataset=optdigits num-clients=3 timeout=60")
    reference = Task(config).run()
    arrays, report = run_deployment(config, tmp_path, run_timeout=240)
    assert Outcome(arrays, {}).difference(reference.arrays) < 1e-10
    assert report["flower"]["answered"] == [0, 1, 2]
    assert report["flower"]["flower_bytes"]["array_up"] >= report["fedlib_bytes_up"] > 0
    assert not flower_processes()


def test_killed_supernode_does_not_hang_the_server(tmp_path):
    config = parse_options("afl", "num-clients=3 timeout=60")   # generous: a loaded CI machine starts nodes slowly
    arrays, report = run_deployment(config, tmp_path, faults={1: "slow"}, kill=1, run_timeout=240)
    flower = report["flower"]
    assert flower["answered"] == [0, 2]
    assert flower["missing"] == [1] or set(flower["rejected"]) == {"1"}
    want = afl_ridge_reference(Task(config), [0, 2])
    assert Outcome(arrays, {}).difference({"weights_regularized": want}) < 1e-10
    assert not flower_processes()


def test_deployment_keeps_client_state_across_rounds(tmp_path):
    """FedDyn's clients keep their own gradient correction between rounds: in a deployment the
    SuperNode's context carries it (each message runs in a fresh flwr-clientapp process)."""
    config = parse_options("gradient", "method=feddyn rounds=2 timeout=60")
    reference = Task(config).run()
    arrays, report = run_deployment(config, tmp_path, run_timeout=300)
    assert Outcome(arrays, {}).difference(reference.arrays) == 0.0
    assert report["participants"] == reference.summary["participants"]
    assert not flower_processes()
