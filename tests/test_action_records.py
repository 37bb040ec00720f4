"""Every action is an event: the ``action`` record on the wire, in run files and the store, and
the detectors resolving the warning it names (``resolved_by: action``) — but not for a failed
action nor a dry run."""

from __future__ import annotations

import argparse
import json

import jsonschema
import pytest
from test_wire import SCHEMA

from foreshock.detectors.engine import RunDetector
from foreshock.detectors.replay import replay_run
from foreshock.detectors.streams import RunStreams
from foreshock.detectors.trackers import InProcessDetector
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.notify.payloads import summary
from foreshock.operate.detect_commands import default_config
from foreshock.operate.store_runs import store_recorded_runs
from foreshock.remediation.remedy import REMEDIES, Action, action_record
from foreshock.storage import queries, stream_queries
from foreshock.storage.acks import warning_states
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore
from foreshock.transport.run_files import load_run as load_run_file
from foreshock.transport.warning import WarningEvent
from foreshock.transport.wire import WireError, decode, encode

RUN = "fa-lowprec-s2"  # attention-numerics warns first, the run diverges later


def _run(name: str = RUN):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    run.start["run_id"] = name
    return run


def _action(warning_id: str = "w1", step: int = 470, **changes) -> dict:
    action = Action("hold-lr", warning_id, "optimizer", None, step, True, source="approved")
    action.request_id = "q-1"
    record = {**action_record("r1", 0, action), **changes}
    return record


def _wire(record: dict, seq: int = 3) -> dict:
    return {**record, "seq": seq, "attempt": 7}


# ---------------------------------------------------------------- the wire


def test_an_action_record_round_trips_and_the_schema_file_agrees():
    for record in (_action(), _action(error="no hold_lr", applied=False, source="policy")):
        message = _wire(record)
        assert decode(encode(message)) == message
        jsonschema.validate(message, SCHEMA)


@pytest.mark.parametrize(
    ("what", "change"),
    [
        ("step", {"step": -1}),
        ("step", {"step": None}),
        ("applied", {"applied": "yes"}),
        ("applied", {"applied": None}),
        ("dry_run", {"dry_run": 1}),
        ("warning_id", {"warning_id": None}),
        ("action: action", {"action": 5}),
        ("family", {"family": None}),
        ("module", {"module": 3}),
        ("error", {"error": ["x"]}),
        ("rolled_back_to", {"rolled_back_to": "450"}),
        ("detail", {"detail": [1]}),
        ("source", {"source": "someone"}),
        ("request_id", {"request_id": 12}),
        ("schema", {"schema": "foreshock.metrics/1"}),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_action_record_is_refused_naming_the_field(what, change):
    message = _wire(_action(**change))
    with pytest.raises(WireError, match=what):
        encode(message)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(message, SCHEMA)


def test_the_command_and_the_trainer_share_one_vocabulary_of_remedies():
    """Defined once, one module a remedy (it once was two lists kept equal by a test, then a
    list and a dispatch table): the command offers what the policy accepts."""
    from foreshock.operate.remedy_requests import add_act_arguments
    from foreshock.remediation import remedies

    parser = argparse.ArgumentParser()
    add_act_arguments(parser)
    (offered,) = [a.choices for a in parser._actions if a.dest == "action"]
    assert REMEDIES is remedies.REMEDIES and offered == list(REMEDIES)
    assert all(r.name == name and callable(r.apply) for name, r in REMEDIES.items())


# ---------------------------------------------------------------- the detectors


def _until_warned(detector, run) -> tuple[list, int]:
    """Feed records until the first warning opens; (events, index of the next record)."""
    events = detector.update({**run.start, "kind": "start"})
    for i, record in enumerate(run.records):
        if isinstance(detector, InProcessDetector):  # as a weight ring at every record marks
            detector.mark(record["step"])
        events += detector.update({**record, "kind": "metrics"})
        if any(e.event == "opened" for e in events):
            return events, i + 1
    raise AssertionError("the run never warned")


def test_an_applied_action_resolves_the_warning_it_names():
    run, detector = _run(), RunDetector(RUN, default_config())
    events, _ = _until_warned(detector, run)
    (warning,) = [e for e in events if e.event == "opened"]
    step = detector.last_step
    record = _action(warning.id, step, family=warning.family, module=warning.module)
    (cleared,) = detector.update(_wire(record))
    assert (cleared.event, cleared.id, cleared.cleared_step) == ("cleared", warning.id, step)
    evidence = cleared.evidence
    assert evidence["resolved_by"] == "action"
    assert evidence["action"] == {
        "what": "hold-lr",
        "step": step,
        "source": "approved",
        "request_id": "q-1",
        "approver": None,
        "rolled_back_to": None,
        "error": None,
    }
    said = summary(WarningEvent.from_message(cleared.to_message()))
    assert f"(the trainer acted: hold-lr at step {step}, approved by a person)" in said
    assert detector.update(_wire(record)) == []  # resolved once: a repeat names no open one


@pytest.mark.parametrize("in_process", [False, True], ids=["service", "in-process"])
def test_a_rollback_rebuilds_the_series_as_if_the_undone_steps_never_ran(in_process):
    """An applied action that rolled the weights back to step r: the detectors' series (and
    every other piece of state but what happened: the warnings, the peaks, the last step) are
    those of the run fed only the records before r, so the records after the action — a
    Trainer numbers them on — go on from the restored weights. The service rebuilds from its
    kept records; the trainer's own detectors keep no records, but the states before the
    last few marks (``keep_states``, set where the remedies may roll back; ``mark``, set
    where the weight ring takes a snapshot)."""
    rolled = RunDetector(RUN, default_config())
    if in_process:
        rolled = InProcessDetector(RUN, default_config())
        rolled.keep_states(8)
    run = _run()
    events, i = _until_warned(rolled, run)
    (warning,) = [e for e in events if e.event == "opened"]
    step, back = rolled.last_step, run.records[i - 5]["step"]
    record = _action(warning.id, step, family=warning.family, rolled_back_to=back)
    (cleared,) = rolled.update(_wire(record))
    assert cleared.evidence["action"]["rolled_back_to"] == back

    fresh = RunDetector(RUN, default_config())
    fresh.update({**run.start, "kind": "start"})
    for earlier in run.records:
        if earlier["step"] < back:
            fresh.update({**earlier, "kind": "metrics"})
    assert rolled.last_step == step and warning.id in {a.id for a in rolled.alerts}
    assert not rolled.open_alerts  # resolved by the action, not reopened by the rebuild

    def seen(detector: RunDetector, record: dict) -> list[tuple]:
        """What the detectors make of a record: the warnings its series open and clear (not
        their roles, nor the leads of earlier warnings: what happened before decides those)."""
        events = detector.update({**record, "kind": "metrics"})
        return [
            (e.event, e.family, e.module, e.step, round(e.statistic, 6))
            for e in events
            if e.event != "updated"
        ]

    shift = step + 1 - back  # the Trainer numbers on from the action
    again = [{**r, "step": r["step"] + shift} for r in run.records if r["step"] >= back]
    after_rollback, never_trained = (
        [seen(rolled, r) for r in again],
        [seen(fresh, r) for r in again],
    )
    assert after_rollback == never_trained and any(after_rollback)  # warnings, the same


@pytest.mark.parametrize(
    "change",
    [
        {"applied": False, "error": "RuntimeError('no hold_lr')"},
        {"applied": False, "dry_run": True},
        {"warning_id": "not-a-warning"},
    ],
    ids=["failed", "dry-run", "unknown-warning"],
)
def test_a_failed_or_dry_run_action_resolves_nothing(change):
    run, detector = _run(), RunDetector(RUN, default_config())
    events, _ = _until_warned(detector, run)
    (warning,) = [e for e in events if e.event == "opened"]
    record = {**_action(warning.id, detector.last_step), **change}
    assert detector.update(_wire(record)) == []
    assert warning.id in {a.id for a in detector.alerts if a.cleared_step is None}


def test_per_rank_the_action_reaches_the_rank_whose_warning_it_names():
    """Two ranks warn alike, each its own warning; rank 0's trainer acts on rank 1's."""
    run, streams = _run(), RunStreams(RUN, default_config())
    opened = []
    for record in run.records:
        for rank in (0, 1):
            message = {**record, "kind": "metrics", "rank": rank, "world_size": 2}
            events = streams.update({**message, "attempt": 10 + rank})
            opened += [e for e in events if e.event == "opened"]
        if opened:
            break
    assert {e.rank for e in opened} == {0, 1}
    theirs = next(e for e in opened if e.rank == 1)
    action = _wire({**_action(theirs.id, record["step"]), "rank": 0})
    (cleared,) = streams.update(action)
    assert cleared.id == theirs.id and cleared.evidence["resolved_by"] == "action"
    open_now = {a.id for a in streams.alerts if a.cleared_step is None}
    assert open_now == {e.id for e in opened} - {theirs.id}
    assert not streams.ended


def test_a_rebuild_after_a_resume_resolves_the_action_again():
    """A resumed attempt goes back past the action: the rebuilt state has the warning resolved
    (it is not opened again under the new attempt's id)."""
    run, detector = _run(), RunDetector(RUN, default_config())
    events, next_index = _until_warned(detector, run)
    (warning,) = [e for e in events if e.event == "opened"]
    acted_at = detector.last_step
    detector.update(_wire(_action(warning.id, acted_at)))
    for record in run.records[next_index : next_index + 5]:
        detector.update({**record, "kind": "metrics"})
    resume = run.records[next_index + 2]
    again = detector.update({**resume, "kind": "metrics", "attempt": 99})
    assert [e for e in again if e.event == "opened" and e.family == warning.family] == []


# ---------------------------------------------------------------- run files and the store


def _with_action(tmp_path, at: int | None = None):
    """The shipped run as a file with an approved action after its first warning."""
    run = _run()
    first = next(e for e in replay_run(run, default_config()).events if e.event == "opened")
    step = first.step if at is None else at
    action = _action(first.id, step, family=first.family, module=first.module)
    lines = [{**run.start, "kind": "start"}]
    lines += [{**r, "kind": "metrics"} for r in run.records if r["step"] <= step]
    lines.append({**action, "run_id": RUN})
    lines += [{**r, "kind": "metrics"} for r in run.records if r["step"] > step]
    lines.append({**run.end, "kind": "end"})
    path = tmp_path / f"{RUN}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, first, step


def test_a_run_file_keeps_its_actions_apart_and_the_replay_resolves_by_them(tmp_path):
    path, first, step = _with_action(tmp_path)
    run = load_run_file(path)
    assert len(run.records) == len(_run().records) and len(run.actions) == 1
    assert all("values" in r for r in run.records)
    events = replay_run(run, default_config()).events
    (cleared,) = [e for e in events if e.id == first.id and e.event == "cleared"]
    assert cleared.evidence["resolved_by"] == "action" and cleared.cleared_step == step


def test_the_store_keeps_actions_beside_start_and_end(tmp_path):
    path, first, step = _with_action(tmp_path)
    with DeltaStore(tmp_path / "h") as store:
        store_recorded_runs(store, [path], default_config())
    with open_history(tmp_path / "h") as history:
        (action,) = queries.run_actions(history, RUN)
        states = {r["id"]: r for r in warning_states(history)}
        (stream,) = stream_queries.stream_completeness(history)
        status = history.sql("SELECT status FROM runs").to_pylist()[0]["status"]
    assert (action["action"], action["step"], action["warning_id"]) == ("hold-lr", step, first.id)
    assert states[first.id]["state"] == "resolved"
    assert states[first.id]["resolved_by"] == "action"
    assert stream["stored"] == stream["top"] + 1 == stream["last_seq"] + 1  # no gap: counted
    assert status == _run().end["status"]


def test_the_batch_builder_takes_an_action_whole():
    builder = BatchBuilder()
    builder.add_lifecycle({**_wire(_action()), "kind": "action"}, 0.0)
    (row,) = builder.take()["run_events"].to_pylist()
    assert (row["kind"], row["seq"], row["status"]) == ("action", 3, None)
    assert json.loads(row["body"])["request_id"] == "q-1"


@pytest.mark.slow
def test_the_run_page_shows_what_was_done_beside_the_warning(tmp_path, monkeypatch):
    from test_dashboard import _html, _page

    path, _, step = _with_action(tmp_path)
    with DeltaStore(tmp_path / "h") as store:
        store_recorded_runs(store, [path], default_config())
    app = _page("run", tmp_path / "h", monkeypatch, run=RUN)
    line = f"<b>Action:</b> hold-lr at step {step}, approved by a person: applied"
    assert line in _html(app)
    assert "Actions" in [h.value for h in app.subheader]
    (table,) = app.dataframe
    row = table.value.iloc[0]
    assert (row["action"], row["step"], row["source"], row["outcome"]) == (
        "hold-lr",
        step,
        "approved",
        "applied",
    )
