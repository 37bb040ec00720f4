"""The wire format of foreshock's metrics topic, version 1 (``schemas/wire-v1.json``).

One Kafka message per (run, monitoring step), keyed by run id so that a run's messages stay
ordered in one partition. The value is a UTF-8 JSON object: a monitoring record (see
:mod:`foreshock.transport.records`) or a run-lifecycle record, plus two wire fields:

* ``kind``: ``start`` | ``metrics`` | ``action`` | ``end``;
* ``seq``: the message's number in its stream, 0, 1, 2, … with no gaps — a stream is one
  producer's messages for one (run_id, rank, attempt), so a consumer sees a gap or a
  duplicate at once;
* ``attempt`` (optional, 0 when absent): which incarnation of the run sent it. A run resumed
  from a checkpoint keeps its ``run_id`` and gets a new attempt — by default its restart
  count (from the checkpoint or the scheduler) in the high bits and the producer's start
  time in microseconds below (:mod:`foreshock.transport.attempts`), so later attempts number
  higher whatever the clocks — and its seqs start again at 0 without colliding with the
  earlier attempt's. (An optional field with a default keeps
  every v1 message valid: no version bump was needed on the wire; the store's schema went
  to version 2.)

``start`` carries ``labels`` and the producer's version; ``end`` carries ``status`` and
``last_seq`` (its own seq: storage knows a run is complete when it holds 0..last_seq).

``action`` is what the trainer did about a warning (:func:`foreshock.remediation.remedy.
action_record`): ``step``, ``action`` (what), ``warning_id``, ``family``, ``applied``, and
optionally ``module``, ``dry_run``, ``rolled_back_to``, ``error``, ``detail``, ``source``
(``policy`` | ``approved``) and ``request_id`` (the ``foreshock warnings act`` request it
answers). It travels in the run's stream, numbered like the rest, so that the detectors read
it in order with the records around it: an applied action resolves the warning it names
(``resolved_by: action``), and the store keeps it beside the run's start and end. Why in the
stream and not on a topic of its own: a second topic would need its own ordering against the
records, and a reader of v1 that knows no ``action`` only has to skip one more kind. (Adding
a kind kept the version: every earlier message is still valid.)

**Run ids** match :data:`RUN_ID_PATTERN`, ``[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}``: a letter
or digit, then up to 199 letters, digits and ``. _ : @ + = -`` (ASCII only). No ``/``, ``\\``,
whitespace, control characters or quotes, and no leading ``.``, so a run id is safe wherever
it ends up — a file name, a URL, a log line, a Kafka key — and no consumer has to escape one.
(Every query takes it as a bound parameter anyway, never spliced into SQL.)

**What a consumer can rely on** once :func:`decode` accepted a message: every number in it is
finite (``NaN``/``Infinity`` literals and overflowing numbers like ``1e999`` are rejected);
``seq``, ``rank``, ``attempt``, ``step``, ``last_seq`` and ``divergence_step`` are ints in
``0..2**63-1`` (the
store's int64); every string is valid Unicode (no lone surrogate escapes); the message is at
most :data:`MAX_MESSAGE_BYTES`. Anything else raises :class:`WireError`, never another
exception: its text is the dead-letter reason.

Why JSON: every value is a float or null, a step's message is a few kB, and readability wins —
``kcat -C -t foreshock.metrics`` prints it, any language parses it, and no schema registry
has to run beside the broker (Avro or Protobuf would need one, or framing of our own). The
price in size is paid back by the producer's lz4 compression of batches.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = [
    "ACTION_SOURCES",
    "KINDS",
    "RUN_ID_PATTERN",
    "WIRE_VERSION",
    "WireError",
    "check_run_id",
    "decode",
    "encode",
    "stream_of",
    "validate",
]

WIRE_VERSION = 1
KINDS = ("start", "metrics", "end", "action")
_SCHEMAS = {
    "start": "foreshock.run/1",
    "end": "foreshock.run/1",
    "action": "foreshock.run/1",
    "metrics": "foreshock.metrics/1",
}
ACTION_SOURCES = ("policy", "approved")  # the automatic path; a person's request
MAX_MESSAGE_BYTES = 1_000_000  # Kafka's default message.max.bytes
MAX_INT = 2**63 - 1  # seq, step, rank: the store keeps them as int64
RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}"
_RUN_ID = re.compile(RUN_ID_PATTERN)


class WireError(ValueError):
    """A message that is not valid wire format v1; the text is the dead-letter reason."""


def encode(message: dict[str, Any]) -> bytes:
    """Validate and serialise one message (compact JSON, no NaN: non-finite values are null).

    >>> encode({"kind": "metrics", "schema": "foreshock.metrics/1", "run_id": "r1", "seq": 1,
    ...         "step": 25, "values": {"loss": 2.5}})
    b'{"kind":"metrics","schema":"foreshock.metrics/1","run_id":"r1","seq":1,"step":25,"values":{"loss":2.5}}'
    """
    validate(message)
    try:
        data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise WireError(f"not serialisable as JSON: {exc}") from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    _check_unicode(message, data)
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
    if not isinstance(data, bytes | bytearray | str):
        raise WireError(f"message value is a {type(data).__name__}, not bytes")
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        message = json.loads(data, parse_constant=_no_constant)
    except WireError:
        raise
    except RecursionError:
        raise WireError("not JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:  # also a UnicodeDecodeError, an int of 4,300+ digits
        raise WireError(f"not JSON: {exc}") from None
    validate(message)
    _check_unicode(message, data)
    return message


def _no_constant(name: str) -> Any:
    raise WireError(f"not JSON: {name} is not a number the wire allows (non-finite is null)")


def check_run_id(run_id: Any) -> str:
    """``run_id`` if it matches :data:`RUN_ID_PATTERN`, else :class:`WireError` (a ValueError).

    >>> check_run_id("lr-high-s1")
    'lr-high-s1'
    >>> check_run_id("../../etc/passwd")
    Traceback (most recent call last):
    ...
    foreshock.transport.wire.WireError: run_id must match [A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}: '../../etc/passwd'
    """  # noqa: E501
    if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
        raise WireError(f"run_id must match {RUN_ID_PATTERN}: {_short(run_id)}")
    return run_id


def validate(message: Any) -> None:
    """Check the fields every consumer relies on (the schema file documents all of them)."""
    if not isinstance(message, dict):
        raise WireError(f"message is a {type(message).__name__}, not a JSON object")
    kind = message.get("kind")
    if kind not in KINDS:
        raise WireError(f"kind must be one of {KINDS}, got {_short(kind)}")
    schema = message.get("schema")
    if schema != _SCHEMAS[kind]:
        raise WireError(f"{kind}: schema must be {_SCHEMAS[kind]!r}, got {_short(schema)}")
    check_run_id(message.get("run_id"))
    _check_int(message, "seq")
    for name in ("rank", "attempt"):
        if name in message:
            _check_int(message, name)
    if "world_size" in message:
        _check_int(message, "world_size", 1)
    time = message.get("time")
    if "time" in message and (isinstance(time, bool) or not isinstance(time, int | float)):
        raise WireError(f"time must be a number (Unix seconds), got {_short(time)}")
    if kind == "metrics":
        _check_int(message, "step")
        _check_values(message.get("values"))
        flags = message.get("flags", [])
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise WireError("metrics: flags must be an array of strings")
        if not isinstance(message.get("error", ""), str):
            raise WireError("metrics: error must be a string")
    elif kind == "action":
        _check_action(message)
    elif kind == "end":
        _check_int(message, "last_seq")
        if message["last_seq"] != message["seq"]:
            raise WireError("end: last_seq must equal the end message's own seq")
        if not isinstance(message.get("status"), str):
            raise WireError("end: status must be a string")
        if message.get("divergence_step") is not None:
            _check_int(message, "divergence_step")
    else:
        for name in ("labels", "monitor", "producer"):
            if not isinstance(message.get(name, {}), dict):
                raise WireError(f"start: {name} must be an object")
        if "producer" in message and not isinstance(message["producer"].get("foreshock"), str):
            raise WireError("start: producer.foreshock must be a string (the version)")
    _check_finite(message, skip="values" if kind == "metrics" else None)


def _check_action(message: dict[str, Any]) -> None:
    """An ``action`` record: what the detectors and ``warnings act --wait`` read of it has the
    type they expect (a clearing decided on a string "false" would be wrong silently)."""
    _check_int(message, "step")
    for name in ("action", "warning_id", "family"):
        if not isinstance(message.get(name), str):
            raise WireError(f"action: {name} must be a string, got {_short(message.get(name))}")
    for name, value in (
        ("applied", message.get("applied")),
        ("dry_run", message.get("dry_run", False)),
    ):
        if not isinstance(value, bool):
            raise WireError(f"action: {name} must be true or false, got {_short(value)}")
    for name in ("module", "error", "request_id"):
        if message.get(name) is not None and not isinstance(message[name], str):
            raise WireError(f"action: {name} must be a string or null, got {_short(message[name])}")
    if message.get("rolled_back_to") is not None:
        _check_int(message, "rolled_back_to")
    if not isinstance(message.get("detail", {}), dict):
        raise WireError("action: detail must be an object")
    source = message.get("source", "policy")
    if source not in ACTION_SOURCES:
        raise WireError(f"action: source must be one of {ACTION_SOURCES}, got {_short(source)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_int(message: dict[str, Any], field: str, low: int = 0) -> None:
    value = message.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_INT:
        raise WireError(f"{field} must be an integer in {low}..2**63-1, got {_short(value)}")


def _check_finite(message: dict[str, Any], skip: str | None) -> None:
    """No NaN or ±Inf anywhere, e.g. in ``labels`` (``skip``: a field checked already)."""
    stack = [v for k, v in message.items() if k != skip]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                raise WireError("a number is not finite (the wire has null for that)")
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _check_unicode(message: dict[str, Any], data: bytes | str) -> None:
    """Every string valid Unicode: a lone surrogate (``"\\ud800"``) can be neither stored nor
    re-encoded as UTF-8. Only a ``\\uD8..``-``\\uDF..`` escape can make one, so the walk
    runs only when the raw text holds one."""
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise WireError("a string holds a lone surrogate (not valid Unicode)") from None
    if b"\\ud" not in data and b"\\uD" not in data:
        return
    stack: list[Any] = [message]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise WireError("a string holds a lone surrogate (not valid Unicode)") from None


def _check_values(values: Any) -> None:
    if not isinstance(values, dict):
        raise WireError("metrics: values must be an object of series key -> number or null")
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, float) and math.isfinite(value):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _FLOAT_MAX:
            continue  # an int a float64 can hold
        raise WireError(f"metrics: value of {_short(key)} must be a finite number or null")


_FLOAT_MAX = int(1.7976931348623157e308)


def stream_of(message: dict[str, Any]) -> tuple[str, int, int]:
    """The stream a message's seq counts in: (run_id, rank, attempt)."""
    return message["run_id"], int(message.get("rank", 0)), int(message.get("attempt", 0))
