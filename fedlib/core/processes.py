"""Stopping cleanly: a command stops every process it started, and every process those started.

A :class:`Family` marks the processes a command starts with an environment variable of its own, which
their descendants inherit, so :meth:`Family.stop` finds them all among the machine's processes, also
those that left the command's process groups or were re-parented to init. :func:`stop_on_signals`
turns SIGTERM and SIGHUP into a :class:`Stopped` exception (SIGINT raises KeyboardInterrupt as
always), so every ``finally`` and context manager of the command runs (temporary files removed).
"""
from __future__ import annotations

import contextlib
import os
import signal
import uuid
from typing import Callable, Iterator

import psutil

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """The command received a stop signal (a BaseException, like KeyboardInterrupt: no ``except
    Exception`` swallows it)."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    def __reduce__(self):   # travels between processes (a chapter worker's result)
        return Stopped, (self.signum,)


def exit_code(err: BaseException) -> int:
    """The shell's exit status for a command ended by ``err`` (128 + the signal number)."""
    return 128 + (err.signum if isinstance(err, Stopped) else int(signal.SIGINT))


@contextlib.contextmanager
def stop_on_signals(first: Callable[[], None] | None = None) -> Iterator[None]:
    """Within the block (main thread only), SIGTERM and SIGHUP raise :class:`Stopped`; ``first()`` runs
    before the exception (e.g. to pass the signal on to the command's children). Later stop signals
    are ignored while the command cleans up. The previous handlers come back on exit."""
    def handler(signum, frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if first is not None:
            first()
        raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Family:
    """The processes started under one command: ``env()`` is the environment to start them with (it
    carries the family's mark), ``members()`` every live process that carries it (but multiprocessing's
    resource tracker, which ends with the process that started it, and which that process still uses)."""

    def __init__(self):
        self.var = f"FEDLIB_FAMILY_{uuid.uuid4().hex[:16]}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), self.var: "1"}

    def mark(self) -> None:
        """Mark every process this one starts from now on (through ``os.environ``)."""
        os.environ[self.var] = "1"

    def members(self) -> list[psutil.Process]:
        me = os.getpid()
        found = []
        for proc in psutil.process_iter():
            if proc.pid == me:
                continue
            try:
                if self.var in proc.environ() and "multiprocessing.resource_tracker" not in " ".join(proc.cmdline()):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return found

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to every member now (no waiting)."""
        for proc in self.members():
            with contextlib.suppress(psutil.Error, OSError):
                proc.send_signal(signum)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every member, SIGKILL to those still alive after ``grace`` seconds; returns once
        none is left (members started meanwhile included)."""
        for _ in range(3):
            procs = self.members()
            if not procs:
                return
            for proc in procs:
                with contextlib.suppress(psutil.Error, OSError):
                    proc.terminate()
            _, alive = psutil.wait_procs(procs, timeout=grace)
            for proc in alive:
                with contextlib.suppress(psutil.Error, OSError):
                    proc.kill()
            psutil.wait_procs(alive, timeout=5)
