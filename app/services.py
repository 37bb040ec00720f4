"""Start foreshock's services as child processes and stop every one of them, whatever happens.

:class:`ServiceGroup` runs each service (``foreshock sink``, ``foreshock detect``,
``foreshock dashboard``, a live ``foreshock lab run``…) in its own process group with the
group's environment (broker address, topics, spool folder), logs each to a file, and on
``stop()`` — also on an exception or Ctrl-C in a ``with`` block — sends SIGTERM to every group,
waits, then SIGKILLs what is left. Nothing it started outlives it, and no port stays held.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServiceGroup", "foreshock_command"]


def foreshock_command(*args: str) -> list[str]:
    """``foreshock ARGS`` with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "foreshock.app.cli", *args]


@dataclass
class ServiceGroup:
    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        process = subprocess.Popen(
            command,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.processes[name] = process
        return process

    def running(self, prefix: str = "") -> list[str]:
        return [n for n, p in self.processes.items() if n.startswith(prefix) and p.poll() is None]

    def failed(self) -> dict[str, int]:
        """Services that exited with an error (a finished lab run exits 0)."""
        return {
            n: p.returncode
            for n, p in self.processes.items()
            if p.poll() is not None and p.returncode not in (0, -signal.SIGTERM)
        }

    def stop(self, timeout: float = 15.0) -> None:
        for process in self.processes.values():
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.wait(5)

    def __enter__(self) -> ServiceGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal(process: subprocess.Popen, sig: int) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
