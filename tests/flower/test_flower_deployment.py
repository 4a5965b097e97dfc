"""Flower's deployment engine on loopback: a real SuperLink and 3 SuperNodes as separate processes
(free ports, a private Flower home), `flwr run` of fedlib's app, everything stopped afterwards."""
from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

pytest.importorskip("flwr")

from conftest import afl_ridge_reference  # noqa: E402

from fedlib.flower.engines import run_deployment  # noqa: E402
from fedlib.flower.tasks import Outcome, Task, parse_options  # noqa: E402


def flower_processes() -> list[str]:
    """Flower processes started from this test process: looked for among ALL processes of the machine (an
    orphan re-parented to init is no longer a descendant), by the marks of run_deployment's families."""
    names = ("flower-superlink", "flower-supernode", "flwr-serverapp", "flwr-clientapp", "flwr run", "superexec")
    found = []
    for p in psutil.process_iter():
        try:
            if any(k.startswith("FEDLIB_FAMILY_") for k in p.environ()) and p.pid != os.getpid() \
                    and any(n in " ".join(p.cmdline()) for n in names) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(p.cmdline()))
        except (psutil.Error, OSError):
            continue
    return found


def test_deployment_afl_optdigits_equals_in_process(tmp_path):
    config = parse_options("afl", "dataset=optdigits num-clients=3 timeout=60")
    reference = Task(config).run()
    arrays, report = run_deployment(config, tmp_path, run_timeout=240)
    assert Outcome(arrays, {}).difference(reference.arrays) < 1e-10
    assert report["flower"]["answered"] == [0, 1, 2]
    assert report["flower"]["flower_bytes"]["array_up"] >= report["fedlib_bytes_up"] > 0
    assert not flower_processes()


def test_killed_supernode_is_reported_with_flowers_reason(tmp_path):
    # a round long enough for the SuperLink to declare the node unavailable (2 missed heartbeats of 30 s)
    config = parse_options("afl", "num-clients=3 timeout=100")
    arrays, report = run_deployment(config, tmp_path, faults={1: "slow"}, kill=1, run_timeout=400)
    flower = report["flower"]
    assert flower["answered"] == [0, 2] and not flower["missing"]
    assert flower["rejected"]["1"].startswith("Flower error 5: Error: Node Unavailable"), flower
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


def test_a_failed_deployment_is_one_line_and_leaves_nothing(tmp_path):
    """A run the server stops (fewer valid uploads than min-clients) and a run over its time limit: one
    clear line each (no traceback), no Flower process left."""
    config = parse_options("afl", "num-clients=3 min-clients=3 timeout=60")
    with pytest.raises(RuntimeError, match=r"the run failed on the server: TooFewClients: step 1 round 1: 2 of 3 "
                                           r"clients sent a valid upload, fewer than the 3"):
        run_deployment(config, tmp_path / "a", faults={1: "nan"}, run_timeout=240)
    assert not flower_processes()
    out = subprocess.run([sys.executable, "-m", "fedlib.flower", "deploy", "afl", "--run-timeout", "2",
                          "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=180)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: flwr run did not finish within 2 s"), out.stderr
    assert not flower_processes()
