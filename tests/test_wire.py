"""Wire format v1: the code's validation and the shipped JSON Schema file agree."""

from __future__ import annotations

import json
from importlib.resources import files

import jsonschema
import pytest

from foreshock.transport.wire import WireError, decode, encode

SCHEMA = json.loads(files("foreshock.transport").joinpath("wire-v1.schema.json").read_text())

GOOD = [
    {
        "kind": "start",
        "schema": "foreshock.run/1",
        "run_id": "r",
        "seq": 0,
        "rank": 0,
        "labels": {"scenario": "healthy"},
        "producer": {"foreshock": "0.1.0"},
    },
    {
        "kind": "metrics",
        "schema": "foreshock.metrics/1",
        "run_id": "r",
        "seq": 1,
        "rank": 0,
        "step": 25,
        "values": {"loss": 2.5, "attn.d2.entropy@h.0.attn#h1": None},
        "flags": [],
    },
    {
        "kind": "end",
        "schema": "foreshock.run/1",
        "run_id": "r",
        "seq": 2,
        "last_seq": 2,
        "status": "finished",
    },
]

BAD = [
    ("kind", {"kind": "metric", "schema": "foreshock.metrics/1", "run_id": "r", "seq": 1}),
    ("schema", {**GOOD[1], "schema": "foreshock.metrics/2"}),
    ("run_id", {**GOOD[1], "run_id": ""}),
    ("seq", {**GOOD[1], "seq": -1}),
    ("seq", {**GOOD[1], "seq": "1"}),
    ("step", {k: v for k, v in GOOD[1].items() if k != "step"}),
    ("value", {**GOOD[1], "values": {"loss": "high"}}),
    ("values", {**GOOD[1], "values": [1.0]}),
    ("last_seq", {**GOOD[2], "last_seq": 5}),
    ("status", {k: v for k, v in GOOD[2].items() if k != "status"}),
]


@pytest.mark.parametrize("message", GOOD, ids=lambda m: m["kind"])
def test_good_messages_pass_code_and_schema(message):
    assert decode(encode(message)) == message
    jsonschema.validate(message, SCHEMA)


@pytest.mark.parametrize(("what", "message"), BAD, ids=[w for w, _ in BAD])
def test_bad_messages_fail_with_a_reason(what, message):
    with pytest.raises(WireError, match=what):
        encode(message)
    with pytest.raises(WireError):
        decode(json.dumps(message).encode())


@pytest.mark.parametrize("raw", [None, b"", b"\xff\xfe", b"[1, 2]", b'{"kind": "metrics"'])
def test_undecodable_bytes_are_wire_errors(raw):
    with pytest.raises(WireError):
        decode(raw)


def test_schema_rejects_what_the_code_rejects_for_shape():
    for what, message in BAD:
        if what in ("last_seq",):  # cross-field rule: enforced by code only
            continue
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(message, SCHEMA)


def test_nan_never_goes_on_the_wire():
    with pytest.raises(WireError):
        encode({**GOOD[1], "values": {"loss": float("nan")}})
