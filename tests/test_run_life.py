"""A run's life as fleets live it, through the real broker and the live detector worker: a
crashed attempt's spool flushed late, a graceful preemption then a resume. The live warnings
must be those of the uninterrupted run, and nothing left open once it finished."""

from __future__ import annotations

import threading

import pytest
from _kafka import read_warnings

from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.worker import DetectorWorker
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.transport.attempts import attempt_number
from foreshock.transport.topics import ensure_topics

T0 = 1_800_000_000 * 10**6  # µs: the first attempt's start


def _run(name: str = "fa-lowprec-s1"):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    return run, list(run.records)


def _send(settings, run_id: str, attempt: int, messages: list[dict], name: str) -> KafkaSink:
    sink = KafkaSink(settings, name=name, confirm_group=None, attempt=attempt)
    for message in messages:
        sink.write({**message, "run_id": run_id})
    assert sink.wait_delivered(30)
    return sink


def _die(sink: KafkaSink) -> None:
    sink._sender.closing.set()  # what a SIGKILL leaves: no end message


def _live_warnings(settings, group: str) -> list[dict]:
    DetectorWorker(settings, default_config(), group_id=group).run(threading.Event(), idle_exit=4)
    return read_warnings(settings)


def _straight(run, run_id: str) -> set[tuple]:
    detector = RunDetector(run_id, default_config())
    for message in [{**run.start, "kind": "start"}, *run.records]:
        detector.update(message)
    return {(a.family, a.module, a.step) for a in detector.alerts}


def _opened(live: list[dict], run_id: str) -> set[tuple]:
    return {
        (w["family"], w["module"], w["step"])
        for w in live
        if w["run_id"] == run_id and w["event"] == "opened"
    }


def _left_open(live: list[dict], run_id: str) -> set[str]:
    mine = [w for w in live if w["run_id"] == run_id]
    return {w["id"] for w in mine if w["event"] == "opened"} - {
        w["id"] for w in mine if w["event"] == "cleared"
    }


def test_a_late_spool_of_an_older_attempt_is_never_followed(kafka_settings):
    """Mid-run, four messages of an older, crashed attempt (its start and steps 0–50, a
    spool flushed late from another host) reach the broker: the worker keeps following the
    live attempt, and its warnings are the uninterrupted run's, ids and all."""
    ensure_topics(kafka_settings)
    run, records = _run()
    run_id, half = "late-spool", len(records) // 2
    live = _send(kafka_settings, run_id, attempt_number(0, T0 + 10**8), [run.start], "live")
    for record in records[:half]:
        live.write({**record, "run_id": run_id})
    assert live.wait_delivered(30)
    _die(_send(kafka_settings, run_id, attempt_number(0, T0), [run.start, *records[:3]], "old"))
    for record in [*records[half:], run.end]:
        live.write({**record, "run_id": run_id})
    live.close()
    warnings = _live_warnings(kafka_settings, "det-late")
    assert _opened(warnings, run_id) == _straight(run, run_id) != set()
    assert not _left_open(warnings, run_id)


def test_a_graceful_preemption_then_a_resume_carries_on_warm(kafka_settings):
    """Attempt 1 is preempted gracefully (its end says so) two thirds in; attempt 2, resumed
    from its checkpoint (restart count 1) on a host whose clock is behind, re-does the last
    10 records and finishes: the worker did not forget the run at the preemption, the
    warnings are the uninterrupted run's, and nothing is left open."""
    ensure_topics(kafka_settings)
    run, records = _run()
    run_id, cut = "preempted", 2 * len(records) // 3
    first = _send(kafka_settings, run_id, attempt_number(0, T0), [run.start, *records[:cut]], "p1")
    first.write({"kind": "end", "run_id": run_id, "status": "preempted"})
    first.close()
    resumed = [run.start, *records[cut - 10 :], run.end]
    _send(kafka_settings, run_id, attempt_number(1, T0 - 60 * 10**6), resumed, "p2").close()
    warnings = _live_warnings(kafka_settings, "det-preempt")
    assert _opened(warnings, run_id) == _straight(run, run_id) != set()
    assert not _left_open(warnings, run_id)


def _resumed(run, monkeypatch, window: int, back_to: int) -> tuple[RunDetector, set[tuple]]:
    """A run that resumed from record ``back_to`` once it was two thirds in, its detectors
    keeping ``window`` records (a snapshot every fifth)."""
    monkeypatch.setattr(RunDetector, "MAX_REPLAY", window)
    monkeypatch.setattr(RunDetector, "SNAPSHOT_EVERY", 5)
    records, cut = run.records, 2 * len(run.records) // 3
    detector = RunDetector("r", default_config())
    for message in [{**run.start, "kind": "start"}, *records[:cut]]:
        detector.update(message)
    for record in records[back_to:]:
        detector.update({**record, "attempt": 1})
    return detector, {(a.family, a.module, a.step) for a in detector.alerts}


def test_a_resume_anywhere_in_the_kept_window_of_a_long_run_is_rebuilt_exactly(monkeypatch, caplog):
    """With 20 records kept of a longer run, a resume 12 records back holds what the
    uninterrupted run held (warm-ups, CUSUMs, warnings): the snapshot before it, then the kept
    records. It used to replay the 20 kept records from an empty state (the warm-up learned
    again mid-run). A resume further back than the window says so and starts from nothing."""
    run, _ = _run()
    straight = _straight(run, "r")
    cut = 2 * len(run.records) // 3
    assert cut > 20
    detector, opened = _resumed(run, monkeypatch, window=20, back_to=cut - 12)
    assert opened == straight
    peaks = _straight_peaks(run)
    assert detector.peaks == pytest.approx(peaks, rel=1e-9)
    assert "start from nothing" not in caplog.text
    # back before the window: from nothing (its warm-up is the resumed records), said aloud
    _resumed(run, monkeypatch, window=20, back_to=cut - 30)
    assert "before the 20 records kept to rebuild from" in caplog.text


def _straight_peaks(run) -> dict[str, float]:
    detector = RunDetector("r", default_config())
    for message in [{**run.start, "kind": "start"}, *run.records]:
        detector.update(message)
    return detector.peaks
