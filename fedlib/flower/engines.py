"""The two ways to run a fedlib protocol on Flower.

* :func:`run_simulation_engine`: Flower's simulation engine (``flwr.simulation.run_simulation``, Ray
  backend): K virtual SuperNodes in this machine's processes, the ServerApp in this process.
* :func:`run_deployment`: Flower's deployment engine: a real ``flower-superlink`` and K
  ``flower-supernode`` processes on 127.0.0.1 (free ports picked at run time, insecure mode,
  a private Flower home so a user's ``~/.flwr`` is never touched), then ``flwr run`` of the app in
  ``fedlib/flower/app``; every process is stopped afterwards, also on error.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import numpy as np

from fedlib.core.processes import Family
from fedlib.core.validate import check_positive
from fedlib.flower.apps import make_client_app, make_server_app
from fedlib.flower.tasks import Outcome, Task, options_string

APP_DIR = Path(__file__).with_name("app")


@contextlib.contextmanager
def _signal_handlers_kept():
    """This process's SIGTERM, SIGINT and SIGHUP handlers as they were before the block (main thread
    only: elsewhere no handler can be set, nor changed by the block)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in kept.items():
            signal.signal(s, h)


def run_simulation_engine(config: dict[str, Any], faults: dict[int, str] | None = None,
                          num_cpus: int | None = None, verbose: bool = False) -> tuple[Outcome, dict]:
    """``config``'s protocol with ``config["num-clients"]`` virtual SuperNodes; returns (outcome, report).

    ``num_cpus``: CPUs Ray may use (default: all), one per virtual client at a time."""
    from flwr.simulation import run_simulation

    Task(config).check()
    holder: dict = {}
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")   # CPU-only virtual clients
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": num_cpus or os.cpu_count() or 1, "include_dashboard": False,
                             "logging_level": logging.INFO if verbose else logging.ERROR}}
    with _signal_handlers_kept():   # ray.init installs its own SIGTERM handler and leaves it behind
        run_simulation(make_server_app(config, holder=holder), make_client_app(faults), config["num-clients"],
                       backend_name="ray", backend_config=backend, verbose_logging=verbose)
    if "outcome" not in holder:
        raise RuntimeError("the Flower simulation ended without a result (see the log above)")
    return holder["outcome"], holder["report"]


# ------------------------------------------------------------------------------------------------
# deployment on loopback
# ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    """A Flower executable of this environment (next to this Python first)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install fedlib's flower extra (pip install -e '.[flower]')")
    return found


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on port {port}")
        with closing(socket.socket()) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


class Processes:
    """The deployment's processes: each in its own session (a Ctrl-C in the terminal reaches the command,
    which stops them in order), all of one :class:`~fedlib.core.processes.Family`, so :meth:`close` also
    stops what they started (a SuperLink's SuperExec and ServerApp, a SuperNode's ClientApps)."""

    def __init__(self, logs: Path, env: dict[str, str]):
        self.family = Family()
        self.logs, self.env, self.procs = logs, self.family.env(env), {}

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def close(self) -> None:
        self.family.stop()
        for proc in self.procs.values():   # reap the direct children
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def run_deployment(config: dict[str, Any], out_dir: str | Path, faults: dict[int, str] | None = None,
                   kill: int | None = None, start_timeout: float = 60.0,
                   run_timeout: float | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Start a SuperLink and ``num-clients`` SuperNodes on 127.0.0.1, run ``config``'s protocol with
    ``flwr run``, stop everything; returns (result arrays, report) written to ``out_dir``.

    ``faults`` {partition id: kind} goes to those nodes' configuration (:data:`fedlib.flower.apps.FAULTS`);
    ``kill``: the SuperNode (partition id) killed with SIGKILL once the server has mapped its
    clients (give it ``faults={kill: "slow"}`` so it dies mid-round). ``run_timeout``: seconds the whole
    run may take (None: no limit; every round is bounded by the run's ``timeout``). Logs: ``out_dir/logs``.
    However the call ends (an error, KeyboardInterrupt, :class:`~fedlib.core.processes.Stopped`),
    every process it started is stopped and its private Flower home removed."""
    Task(config).check()
    if run_timeout is not None:
        check_positive("run_timeout (seconds)", run_timeout)
    out = Path(out_dir).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    K = config["num-clients"]
    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fedlib-flwr-")))
        env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
        procs = Processes(logs, env)
        stack.callback(procs.close)
        link = _start_superlink(procs, home, start_timeout)
        for k in range(K):
            fault = (faults or {}).get(k, "")
            node_config = f"partition-id={k} num-partitions={K}" + (f' fault="{fault}"' if fault else "")
            procs.start(f"supernode-{k}", [_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link}",
                                           "--host", "127.0.0.1", "--port", str(free_port()),
                                           "--node-config", node_config])
        run_config = f'protocol="{config["protocol"]}" options="{options_string(config)}" out-dir="{out}"'
        cmd = [_bin("flwr"), "run", str(APP_DIR), "fedlib", "--stream", "--run-config", run_config]
        flwr = procs.start("flwr-run", cmd)
        if kill is not None:
            _wait_file(out / "nodes.json", flwr, run_timeout or 3 * config["timeout"] + start_timeout)
            procs.kill(f"supernode-{kill}")
        try:
            code = flwr.wait(run_timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"flwr run did not finish within {run_timeout:.0f} s (run_timeout; logs: {logs})") from None
        if (out / "failed.txt").exists():
            raise RuntimeError(f"the run failed on the server: {(out / 'failed.txt').read_text().strip()} "
                               f"(logs: {logs})")
        if code != 0 or not (out / "report.json").exists():
            tail = (logs / "flwr-run.log").read_text(errors="replace").strip().splitlines()[-1:] or ["(empty)"]
            raise RuntimeError(f"flwr run ended without a result (exit code {code}; its last line: {tail[0]}); "
                               f"logs in {logs}")
    with np.load(out / "result.npz") as z:
        arrays = dict(z)
    return arrays, json.loads((out / "report.json").read_text())


def _start_superlink(procs: Processes, home: Path, timeout: float) -> int:
    """``flower-superlink`` on a free loopback port (Fleet, Control and Runtime APIs share it), and a
    Flower config in the private ``home`` whose federation "fedlib" points ``flwr run`` at it."""
    port = free_port()
    proc = procs.start("superlink", [_bin("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
                                     "--disable-runtime-dependency-installation"])
    (home / "config.toml").write_text(f'[superlink]\ndefault = "fedlib"\n\n[superlink.fedlib]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    _wait_port(port, proc, "flower-superlink", timeout)
    return port


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run stopped before the server mapped its clients ({path} not written)")
        time.sleep(0.1)
