"""The attention spectra solved off the training thread (producers/spectra_worker.py)."""

from __future__ import annotations

import threading

import pytest
import torch
from test_monitor import Run, make_model

from foreshock.producers import ListSink, Monitor, MonitorConfig
from foreshock.producers import measure as measure_module
from foreshock.producers.spectra_worker import SKIPPED_FLAG


def _trained(config: MonitorConfig, steps: int = 9) -> tuple[list[dict], list[int | None]]:
    """Records of a run monitored with ``config`` (its sink's, after close), and which step's
    record each ``Monitor.step`` call returned."""
    model = make_model()
    sink = ListSink()
    monitor = Monitor(model, sink, config=config)
    run = Run(model, monitor)
    returned = []
    for step in range(steps):
        record = run.step(step)
        returned.append(None if record is None else record["step"])
    monitor.close()
    return [r for r in sink.records if "values" in r], returned


def test_the_worker_writes_the_values_the_step_would_have_one_step_later():
    """Same model, same data: every record equal to the in-step one (float tolerance), the
    spectra present, in step order; each returned at the first call after its solve."""
    on, returned_on = _trained(MonitorConfig(every=2, spectra_worker=False))
    off, returned_off = _trained(MonitorConfig(every=2, spectra_worker=True))
    assert [r["step"] for r in off] == [r["step"] for r in on] == [0, 2, 4, 6, 8]
    for mine, theirs in zip(off, on, strict=True):
        assert mine["flags"] == theirs["flags"] == []
        assert mine["values"].keys() == theirs["values"].keys()
        for key, value in theirs["values"].items():
            assert mine["values"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert any(k.startswith("attn.d2.entropy_mean@") for k in off[-1]["values"])
    assert returned_on == [0, None, 2, None, 4, None, 6, None, 8]
    assert returned_off[0] == 0  # no snapshot yet: nothing to solve, written at once
    assert all(r is None or r < s or r == 0 for s, r in enumerate(returned_off))


def test_a_full_queue_skips_the_spectra_flagged_and_the_training_step_never_waits(monkeypatch):
    """A worker held on its first solve: with a queue of 1 the next monitoring step's spectra
    are skipped (flagged, every other value kept), the steps go on, and released, every
    record is written in step order."""
    gate = threading.Event()
    solve = measure_module.solve_attention

    def held(jobs, config):
        gate.wait(30)
        return solve(jobs, config)

    monkeypatch.setattr("foreshock.producers.deferred.solve_attention", held)
    model = make_model()
    sink = ListSink()
    monitor = Monitor(
        model, sink, config=MonitorConfig(every=2, spectra_worker=True, spectra_queue=1)
    )
    run = Run(model, monitor)
    for step in range(7):
        run.step(step)
    written = [r["step"] for r in sink.records if "values" in r]
    assert written == [0]  # 2 waits for its solve; 4 and 6 wait behind it
    assert monitor.spectra.skipped == 2
    gate.set()
    monitor.close()
    records = [r for r in sink.records if "values" in r]
    assert [r["step"] for r in records] == [0, 2, 4, 6]
    assert [SKIPPED_FLAG in r["flags"] for r in records] == [False, False, True, True]
    assert "attn.d2.entropy_mean@h.0.attn" in records[1]["values"]
    skipped = records[2]["values"]
    assert "loss" in skipped and "attn.d2.entropy_mean@h.0.attn" not in skipped


def test_a_failed_solve_flags_its_record_and_monitoring_goes_on(monkeypatch):
    def broken(jobs, config):
        raise torch.linalg.LinAlgError("the eigen-solver did not converge")

    monkeypatch.setattr("foreshock.producers.deferred.solve_attention", broken)
    records, _ = _trained(MonitorConfig(every=2, spectra_worker=True), steps=5)
    assert [r["step"] for r in records] == [0, 2, 4]
    assert all("monitor_error@attention" in r["flags"] for r in records[1:])
    assert all("loss" in r["values"] for r in records)


def test_the_routers_values_come_from_the_worker_and_a_failure_flags_that_router(monkeypatch):
    """The routing entropies and the router geometry are computed on the worker from the
    step's copies (equal to the in-step ones: the first test); a router whose geometry fails
    there is flagged alone, its routing entropies and every other value kept."""
    from foreshock.producers import deferred

    geometry = deferred.router_geometry_of

    def broken(name, weight):
        if name == "h.0.mlp.gate":
            raise RuntimeError("no geometry")
        return geometry(name, weight)

    monkeypatch.setattr(deferred, "router_geometry_of", broken)
    records, _ = _trained(MonitorConfig(every=2, spectra_worker=True), steps=5)
    assert all("monitor_error@h.0.mlp.gate" in r["flags"] for r in records)
    last = records[-1]["values"]
    assert "router.epsilon@h.0.mlp.gate" not in last
    assert "router.token_entropy_norm@h.0.mlp.gate" in last
    assert "router.epsilon@h.1.mlp.gate" in last and "attn.d2.entropy_mean@h.0.attn" in last
