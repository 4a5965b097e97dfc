"""A stopped command leaves nothing behind: SIGTERM, SIGINT and SIGHUP to ``python -m fedlib.flower deploy``
and to ``python -m fedlib.runner`` stop every process they started (also those in other process groups
or re-parented to init: the leftovers are looked for among ALL processes, by an environment mark the
test gives the command and every descendant inherits), remove their temporary files and print one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from fedlib.core.processes import Family, Stopped, stop_on_signals

REPO = Path(__file__).resolve().parents[2]


def marked(mark: str) -> list[psutil.Process]:
    """Every process on the machine whose environment carries ``FEDLIB_TEST_MARK=mark``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FEDLIB_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    mark, tmp = uuid.uuid4().hex, tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "FEDLIB_TEST_MARK": mark, "TMPDIR": str(tmp), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, mark, tmp


def wait_for(mark: str, proc: subprocess.Popen, words: str, timeout: float = 180.0) -> None:
    """Until a process of the run has ``words`` in its command line (the run is then mid-way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the command ended before the test could stop it: {proc.communicate()}"
        if any(words in " ".join(p.cmdline()) for p in marked(mark) if p.pid != proc.pid):
            return
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"no process with {words!r} within {timeout} s")


def stop_and_check(proc: subprocess.Popen, mark: str, tmp: Path, signum: int) -> str:
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith(f"stopped by {signal.Signals(signum).name}: every"), err
    assert not marked(mark), [p.cmdline() for p in marked(mark)]
    left = [p.name for p in tmp.iterdir() if p.name.startswith("fedlib-") or p.suffix == ".json"]
    assert not left, left
    runtime = tmp.parent / "runtime"
    assert not runtime.exists() or not any(runtime.iterdir())
    return last


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_deployment_leaves_no_process_and_no_file(tmp_path, signum):
    pytest.importorskip("flwr")
    proc, mark, tmp = start(["-m", "fedlib.flower", "deploy", "gradient", "rounds=500", "timeout=60"], tmp_path)
    wait_for(mark, proc, "flwr-serverapp")     # the SuperLink, its SuperExec and ServerApp, the SuperNodes: all up
    wait_for(mark, proc, "flwr-clientapp")     # and rounds running
    stop_and_check(proc, mark, tmp, signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_runner_leaves_no_kernel_no_scratch_and_no_connection_file(tmp_path, signum):
    out = tmp_path / "out.ipynb"
    proc, mark, tmp = start(["-m", "fedlib.runner", "refed_theory", "--profile", "smoke", "--output", str(out)],
                            tmp_path)
    wait_for(mark, proc, "ipykernel")
    stop_and_check(proc, mark, tmp, signum)
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_stop_signals_raise_stopped_and_the_family_is_found_by_its_mark():
    family = Family()
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
                              "start_new_session=True); time.sleep(60)"], env=family.env())
    try:
        deadline = time.monotonic() + 30
        while len(family.members()) < 2 and time.monotonic() < deadline:   # the child and its grandchild
            time.sleep(0.1)
        assert len(family.members()) == 2
        with pytest.raises(Stopped, match="stopped by SIGTERM"):
            with stop_on_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        family.stop(grace=5)
        assert not family.members()       # the grandchild too, in another session
    finally:
        child.kill()
        child.wait()
