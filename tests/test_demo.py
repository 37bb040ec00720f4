"""`foreshock demo`, short: it brings everything up, stores the fleet, prints the lead table,
and stops every process it started — twice in a row, with no port left held."""

from __future__ import annotations

import signal
import socket
import subprocess

import pytest

from foreshock.app.services import foreshock_command
from foreshock.transport.broker import free_port


def _processes_mentioning(text: str) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if text in line and "ps -eo" not in line]


def _demo(store, port: int, replayed: int, speed: float, duration: float) -> list[str]:
    """``foreshock demo`` with replayed runs only (no training: fast, and no torch needed)."""
    return [
        *foreshock_command("demo", "--live", "0", "--replayed", str(replayed)),
        *("--speed", str(speed), "--duration", str(duration)),
        *("--port", str(port), "--store", str(store)),
    ]


@pytest.mark.slow
def test_demo_runs_twice_and_leaves_nothing_behind(tmp_path):
    port = free_port()
    for attempt in range(2):
        store = tmp_path / f"history-{attempt}"
        done = subprocess.run(
            _demo(store, port, replayed=6, speed=60, duration=150),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = done.stdout
        assert f"dashboard at http://127.0.0.1:{port}" in out.splitlines()[0]
        assert "Lead time per run" in out and "Per scenario" in out
        assert "runs 6/6" in out
        assert (store / "steps" / "_delta_log").is_dir()
        with socket.socket() as s:  # the dashboard's port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    assert _processes_mentioning(str(tmp_path)) == []  # no sink, worker or dashboard left


def _next_line(stream) -> str:
    """The demo's next line of its own output, past log lines (``2026-…Z LEVEL logger: …``)."""
    import re

    while re.match(r"\d{4}-\d\d-\d\dT", line := stream.readline()):
        pass
    return line


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_everything_the_demo_started(tmp_path, sig):
    store = tmp_path / "history"
    demo = subprocess.Popen(
        _demo(store, free_port(), replayed=4, speed=5, duration=300),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert "dashboard at" in _next_line(demo.stdout)
    assert _next_line(demo.stdout).startswith("[")  # running: a first progress line
    demo.send_signal(sig)
    out, _ = demo.communicate(timeout=60)
    assert "stopping everything" in out and "stopped everything" in out
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize("count", [40, 250])
def test_replayed_runs_have_distinct_run_ids_and_mix_scenarios(count):
    """A run id replayed twice would interleave two copies of one run in one stream."""
    from foreshock.app.demo import _replay_plan
    from foreshock.lab.recorded import shipped_runs

    plan = _replay_plan(count, "t")
    assert len({run_id for run_id, _ in plan}) == count
    names = {run.path.name for _, run in plan}
    assert len(names) == min(count, len(shipped_runs()))
    scenarios = {run.labels["scenario"] for _, run in plan}
    assert {"healthy", "fa-lowprec", "lr-high"} <= scenarios
