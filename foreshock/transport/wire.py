"""The wire format of foreshock's metrics topic, version 1 (``schemas/wire-v1.json``).

One Kafka message per (run, monitoring step), keyed by run id so that a run's messages stay
ordered in one partition. The value is a UTF-8 JSON object: a monitoring record (see
:mod:`foreshock.producers.records`) or a run-lifecycle record, plus two wire fields:

* ``kind``: ``start`` | ``metrics`` | ``end``;
* ``seq``: the message's number in its stream, 0, 1, 2, … with no gaps — a stream is one
  producer's messages for one (run_id, rank), so a consumer sees a gap or a duplicate at once.

``start`` carries ``labels`` and the producer's version; ``end`` carries ``status`` and
``last_seq`` (its own seq: storage knows a run is complete when it holds 0..last_seq).

Why JSON: every value is a float or null, a step's message is a few kB, and readability wins —
``kcat -C -t foreshock.metrics`` prints it, any language parses it, and no schema registry
has to run beside the broker (Avro or Protobuf would need one, or framing of our own). The
price in size is paid back by the producer's lz4 compression of batches.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["KINDS", "WIRE_VERSION", "WireError", "decode", "encode", "stream_of"]

WIRE_VERSION = 1
KINDS = ("start", "metrics", "end")
_SCHEMAS = {"start": "foreshock.run/1", "end": "foreshock.run/1", "metrics": "foreshock.metrics/1"}
MAX_MESSAGE_BYTES = 1_000_000  # Kafka's default message.max.bytes


class WireError(ValueError):
    """A message that is not valid wire format v1; the text is the dead-letter reason."""


def encode(message: dict[str, Any]) -> bytes:
    """Validate and serialise one message (compact JSON, no NaN: non-finite values are null).

    >>> encode({"kind": "metrics", "schema": "foreshock.metrics/1", "run_id": "r1", "seq": 1,
    ...         "step": 25, "values": {"loss": 2.5}})
    b'{"kind":"metrics","schema":"foreshock.metrics/1","run_id":"r1","seq":1,"step":25,"values":{"loss":2.5}}'
    """
    validate(message)
    data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return data


def decode(data: bytes | None) -> dict[str, Any]:
    """Parse and validate one message value; :class:`WireError` says what is wrong.

    >>> decode(b'{"kind":"end","schema":"foreshock.run/1","run_id":"r1","seq":9,'
    ...        b'"status":"finished","last_seq":9}')["last_seq"]
    9
    >>> decode(b'{"kind":"metrics"')
    Traceback (most recent call last):
    ...
    foreshock.transport.wire.WireError: not JSON: Expecting ',' delimiter: ...
    """
    if data is None:
        raise WireError("empty message (null value)")
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    validate(message)
    return message


def validate(message: Any) -> None:
    """Check the fields every consumer relies on (the schema file documents all of them)."""
    if not isinstance(message, dict):
        raise WireError(f"message is a {type(message).__name__}, not a JSON object")
    kind = message.get("kind")
    if kind not in KINDS:
        raise WireError(f"kind must be one of {KINDS}, got {kind!r}")
    schema = message.get("schema")
    if schema != _SCHEMAS[kind]:
        raise WireError(f"{kind}: schema must be {_SCHEMAS[kind]!r}, got {schema!r}")
    run_id = message.get("run_id")
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 200:
        raise WireError(f"run_id must be a non-empty string of at most 200 characters: {run_id!r}")
    _check_int(message, "seq")
    if "rank" in message:
        _check_int(message, "rank")
    if kind == "metrics":
        _check_int(message, "step")
        _check_values(message.get("values"))
    elif kind == "end":
        _check_int(message, "last_seq")
        if message["last_seq"] != message["seq"]:
            raise WireError("end: last_seq must equal the end message's own seq")
        if not isinstance(message.get("status"), str):
            raise WireError("end: status must be a string")


def _check_int(message: dict[str, Any], field: str) -> None:
    value = message.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WireError(f"{field} must be an integer >= 0, got {value!r}")


def _check_values(values: Any) -> None:
    if not isinstance(values, dict):
        raise WireError("metrics: values must be an object of series key -> number or null")
    for key, value in values.items():
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise WireError(f"metrics: value of {key!r} must be a finite number or null")


def stream_of(message: dict[str, Any]) -> tuple[str, int]:
    """The stream a message's seq counts in: (run_id, rank)."""
    return message["run_id"], int(message.get("rank", 0))
