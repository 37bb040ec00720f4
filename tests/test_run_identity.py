"""Run identity: a run resumed from a checkpoint under its run id is one run with two attempts,
stored whole and detected as if uninterrupted; two jobs under one run id are reported, never
merged; malformed steps give clear errors, not crashes or nonsense lead times."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from foreshock.detectors.commands import default_config
from foreshock.detectors.engine import RunDetector
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.storage import queries
from foreshock.storage.attempts import AttemptTracker
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore


def _records(name: str = "fa-lowprec-s1"):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    return run, [{**r, "kind": "metrics"} for r in run.records]


def _feed(detector: RunDetector, messages) -> list:
    return [e for m in messages for e in detector.update(m)]


def test_a_resumed_run_is_detected_as_if_it_never_stopped():
    run, records = _records()
    start = {**run.start, "kind": "start"}
    straight = RunDetector("r", default_config())
    _feed(straight, [start, *records])
    cut = 2 * len(records) // 3  # killed here; the checkpoint was 10 records earlier
    resumed = RunDetector("r", default_config())
    _feed(resumed, [start, *({**m, "attempt": 1} for m in records[:cut]),
                    *({**m, "attempt": 2} for m in records[cut - 10 :])])  # fmt: skip
    assert resumed.resumes == [(2, records[cut - 10]["step"])]
    assert [(a.family, a.module, a.step) for a in resumed.alerts] == [
        (a.family, a.module, a.step) for a in straight.alerts]  # fmt: skip
    assert straight.alerts and resumed.divergence_step == straight.divergence_step


def test_records_of_a_superseded_attempt_are_ignored_not_merged():
    _, records = _records()
    detector = RunDetector("r", default_config())
    _feed(detector, [{**m, "attempt": 1} for m in records[:20]])
    _feed(detector, [{**m, "attempt": 2} for m in records[5:25]])
    _feed(detector, [{**m, "attempt": 1} for m in records[20:30]])  # the other job goes on
    assert detector.ignored == 10 and detector.last_step == records[24]["step"]


def test_two_attempts_are_two_streams_in_the_store_and_overlap_is_flagged(tmp_path):
    b = BatchBuilder()
    for attempt, steps, t0 in ((1, range(0, 20), 100.0), (2, range(10, 30), 200.0),
                               (3, range(0, 5), 205.0)):  # fmt: skip
        b.add_lifecycle({"run_id": "r", "kind": "start", "seq": 0, "attempt": attempt,
                         "time": t0}, 0.0)  # fmt: skip
        for seq, step in enumerate(steps, start=1):
            b.add_metrics({"run_id": "r", "attempt": attempt, "seq": seq, "step": step,
                           "time": t0 + seq, "values": {"loss": float(step)}}, 0.0)  # fmt: skip
    DeltaStore(tmp_path / "s").write(b.take())
    with open_history(tmp_path / "s") as history:
        attempts = queries.run_attempts(history, "r")
        assert queries.duplicate_records(history) == []
        _, records, _ = queries.run_records(history, "r")
    assert [(a["attempt"], a["number"], a["first_step"], a["last_step"], a["overlaps"])
            for a in attempts] == [(1, 1, 0, 19, False), (2, 2, 10, 29, True),
                                   (3, 3, 0, 4, True)]  # fmt: skip
    assert len(records) == 20 + 20 + 5  # each attempt's steps, once each


def test_the_sink_reports_a_collision_once_per_pair():
    tracker = AttemptTracker()
    reasons = [tracker.observe({"run_id": "r", "attempt": a, "time": t})
               for a, t in ((1, 1.0), (2, 1.5), (1, 2.0), (2, 2.5), (1, 3.0))]  # fmt: skip
    assert [r is not None for r in reasons] == [False, False, True, False, False]
    assert "two jobs under one run id" in reasons[2]


@pytest.mark.parametrize("step", ['"12"', "null", "-1", "true", "9223372036854775808"])
def test_replay_of_a_malformed_step_is_a_clear_error(tmp_path, step):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as file:
        file.write(json.dumps({"kind": "start", "run_id": "bad", "labels": {}}) + "\n")
        file.write(f'{{"kind": "metrics", "step": {step}, "values": {{"loss": 1.0}}}}\n')
    done = subprocess.run([sys.executable, "-m", "foreshock.cli", "detect", "--replay",
                           str(path)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "step must be an integer" in done.stderr and "Traceback" not in done.stderr


def test_a_warning_after_the_divergence_has_no_lead_time():
    _, records = _records()
    detector = RunDetector("r", default_config())
    _feed(detector, records)
    assert detector.divergence_step is not None
    late = {**records[-1], "step": 10**12}  # a producer's wrong step, far past divergence
    _feed(detector, [late])
    assert all(a.lead_time is None or a.lead_time >= 0 for a in detector.alerts)
