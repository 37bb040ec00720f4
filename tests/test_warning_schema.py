"""One warning schema: the JSON Schema file beside the wire's and the Python module that owns
the event's fields and its validation say the same, and the engine's events (and a person's)
pass both."""

from __future__ import annotations

import json
from dataclasses import fields
from importlib.resources import files

import jsonschema
import pytest

from foreshock.detectors.alerts import action_event
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.storage.schema import TABLES
from foreshock.transport import warning
from foreshock.transport.warning import (
    EVENTS,
    FACTS,
    FIELDS,
    REQUIRED,
    SCHEMA,
    Direction,
    EventKind,
    Role,
    RunWarning,
    WarningEvent,
    check,
    decode_event,
)

FILE = json.loads(files("foreshock.transport").joinpath("warning-v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(FILE)
VALID = {
    "schema": SCHEMA,
    "id": "w1",
    "event": "opened",
    "run_id": "r1",
    "family": "router",
    "step": 5,
}


def _passes_schema(event: dict) -> bool:
    return not list(VALIDATOR.iter_errors(event))


def test_the_schema_file_is_valid_and_the_module_reads_it() -> None:
    jsonschema.Draft202012Validator.check_schema(FILE)
    assert warning.json_schema() == FILE


def test_the_file_and_the_module_name_the_same_fields() -> None:
    assert set(FILE["properties"]) == {"schema", "evidence", *FIELDS}
    assert FILE["required"] == ["schema", *REQUIRED]
    assert FILE["properties"]["event"]["enum"] == list(EVENTS)
    assert FILE["properties"]["schema"]["const"] == SCHEMA
    assert set(FACTS) == set(FIELDS) - {"event", "cleared_step"}
    # the store's warnings table holds each field (and evidence, as JSON); the engine's
    # warning is made of them
    assert set(FIELDS) <= set(TABLES["warnings"].names)
    assert {f.name for f in fields(RunWarning)} == {*FIELDS, "evidence"}


def test_the_closed_vocabularies_are_the_enums_the_file_names() -> None:
    properties = FILE["properties"]
    assert properties["event"]["enum"] == [kind.value for kind in EventKind]
    assert all(role.value in properties["role"]["description"] for role in Role)
    assert all(d.value in properties["direction"]["description"] for d in Direction)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [None, "text", 7, 1.5, True, [1], {"a": 1}])
def test_the_file_and_the_module_agree_on_each_field(field, value) -> None:
    """Each field given each kind of value: accepted by both, or refused by both."""
    event = {**VALID, field: value}
    assert (check(event) is None) == _passes_schema(event), (field, value, check(event))
    if check(event) is None:
        _assert_round_trip(event)


@pytest.mark.parametrize(
    "evidence",
    [
        None,
        {},
        {"action_id": "x", "by": "ana", "at": 10.0},
        {"action_id": "x", "by": "ana", "at": 10.0, "until": 20.0},
        {"action_id": "x", "by": 7, "at": 10.0},
        {"action_id": "x", "by": "ana", "at": "now"},
    ],
)
@pytest.mark.parametrize("kind", ["acknowledged", "silenced"])
def test_the_file_and_the_module_agree_on_a_persons_event(kind, evidence) -> None:
    event = {**VALID, "event": kind, "evidence": evidence}
    assert (check(event) is None) == _passes_schema(event), (kind, evidence, check(event))
    if check(event) is None:
        _assert_round_trip(event)


def test_the_engines_events_and_a_persons_pass_both() -> None:
    path = next(p for p in shipped_runs() if p.name.startswith("lr-high-s0."))
    events = [e.to_message() for e in replay_run(load_run(path), default_config()).events]
    assert {e["event"] for e in events} >= {"opened", "cleared"}
    opened = next(e for e in events if e["event"] == "opened")
    events += [
        action_event(opened, "acknowledged", "ana", note="on it", now=100.0),
        action_event(opened, "silenced", "bo", until=200.0, now=100.0),
    ]
    for event in events:
        event = json.loads(json.dumps(event))  # as it travels
        assert check(event) is None, event
        assert check(event, key_only=True) is None
        VALIDATOR.validate(event)
        _assert_round_trip(event)


def _assert_round_trip(message: dict) -> None:
    """A checked message is one ``WarningEvent`` and back: the same keys, values and order."""
    event = WarningEvent.from_message(message)
    assert event.to_message() == message and list(event.to_message()) == list(message)
    assert decode_event(json.dumps(message)) == event
    assert (event.id, event.event, event.run_id, event.step) == tuple(
        message[k] for k in ("id", "event", "run_id", "step")
    )
    assert set(event.extra) == set(message) - {*FIELDS, "evidence", "schema"} | (
        {"evidence"} if not isinstance(message.get("evidence"), dict | None) else set()
    )


def test_a_warning_event_keeps_what_it_does_not_know_and_builds_whole_messages() -> None:
    """A newer producer's field and a non-object ``evidence`` survive the round trip; an
    event built in code (not decoded) sends every field, like ``RunWarning.to_message``."""
    message = {**VALID, "evidence": [1, 2], "severity_hint": "high", "module": None}
    assert check(message) is None
    event = WarningEvent.from_message(message)
    assert event.evidence is None and event.extra["evidence"] == [1, 2]
    assert event.extra["severity_hint"] == "high" and event.has("module")
    assert not event.has("role") and event.role is None
    assert event.to_message() == message
    built = WarningEvent("w1", EventKind.OPENED, "r1", "router", 5, evidence={"x": 1})
    sent = built.to_message()
    assert list(sent) == ["schema", *FIELDS, "evidence"] and check(sent) is None
    assert WarningEvent.from_message(sent) == built
    with pytest.raises(KeyError):
        WarningEvent.from_message({"schema": SCHEMA, "id": "w1"})
