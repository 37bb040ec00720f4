"""Fuzzing every consumer's decoding: a message is accepted or rejected with a reason.

Whatever arrives on a topic — malformed bytes, wrong JSON types, NaN, numbers beyond int64 or
float, unknown schema versions, hostile run ids — each decoder either accepts it or raises its
own error (whose text becomes the dead-letter reason); never another exception, never a hang.
What is accepted is sane: it round-trips through ``encode``, its numbers are finite, and the
store and the detectors can take it. The last test does the same through the real broker and
the real storage sink.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.detectors.config import DEFAULT_RULES, DetectorConfig
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.ordering import SeqOrderer
from foreshock.notify.ledger import Ledger
from foreshock.notify.notifier import decode_warning
from foreshock.notify.payloads import alertmanager_alert, slack_payload, webhook_payload
from foreshock.storage import queries, stream_queries
from foreshock.storage.attempts import AttemptTracker
from foreshock.storage.reader import open_history
from foreshock.storage.retention import export_run
from foreshock.storage.rows import BatchBuilder, RecordError
from foreshock.storage.sink import StorageSink
from foreshock.storage.sink_decoders import decode_dead_letter
from foreshock.storage.sink_decoders import decode_warning as sink_decode_warning
from foreshock.storage.sink_stats import SinkStats
from foreshock.storage.store import DeltaStore, store_exists
from foreshock.storage.stored_state import StoredState
from foreshock.transport.envelope import Consumed, SkippedMessageError
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.wire import (
    MAX_INT,
    MAX_MESSAGE_BYTES,
    RUN_ID_PATTERN,
    WireError,
    decode,
    encode,
    validate,
)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_BATCH = settings(FUZZ, max_examples=80)  # each example builds Arrow tables or runs a run
SLOW = 2.0  # seconds: any one decode taking longer counts as a hang
SCHEMA = json.loads(files("foreshock.transport").joinpath("wire-v1.schema.json").read_text())
KEY = re.compile(r"[A-Za-z0-9_.]+(?:@[^#@]*)?(?:#h[0-9]+)?")  # the schema's, matched whole

HOSTILE_RUN_IDS = [
    "'; DROP TABLE steps; --",
    "r1' OR '1'='1",
    'r1"; DELETE FROM runs; --',
    "../../etc/passwd",
    "..",
    ".",
    "/",
    "/tmp/x",
    "a/b",
    "a\\b",
    "C:\\x",
    "r1\x00",
    "\x00",
    "r1\n",
    "r\nx",
    "r 1",
    "",
    " ",
    "-rf",
    ".hidden",
    "%2e%2e%2f",
    "r1;",
    "a" * 201,
    "ünïcode",
    "\ud800",
    "r1\r",
    "r1\t",
    "$(reboot)",
    "`id`",
    "<script>",
    "r1?x=1",
    "r1#x",
    "*",
    "r%",
]

# ---------------------------------------------------------------- strategies

run_ids = st.from_regex(RUN_ID_PATTERN, fullmatch=True)
any_run_ids = st.one_of(run_ids, st.sampled_from(HOSTILE_RUN_IDS), st.text(max_size=40))
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
    st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 2**63, 2**64, 10**400, -(2**63)]),
)
json_values = st.recursive(
    json_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
bad_ints = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.booleans(),
    st.none(),
    st.floats(),
    st.text(max_size=4),
    st.just(1.0),
    st.just([1]),
)
modules = st.sampled_from([None, "h.0.attn", "blocks.1.moe", "transformer.h.0.attn", ""])
metrics = st.sampled_from([r.metric for r in DEFAULT_RULES] + ["attn.d2.entropy", "x.y"])
series_keys = st.builds(
    lambda metric, module, head: (
        metric + ("" if module is None else "@" + module) + ("" if head is None else f"#h{head}")
    ),
    metrics,
    modules,
    st.one_of(st.none(), st.integers(0, 15)),
)
finite = st.floats(allow_nan=False, allow_infinity=False)
good_numbers = st.one_of(
    st.none(),
    finite,
    st.integers(-(2**70), 2**70),
    st.sampled_from([1e300, -1e300, 1.7976931348623157e308, -1.7976931348623157e308, 0.0]),
)


@st.composite
def valid_messages(draw, kind: str | None = None, run_id: str | None = None) -> dict[str, Any]:
    """A message the wire accepts (metrics, start, end or action)."""
    kind = kind or draw(st.sampled_from(["metrics", "metrics", "start", "end", "action"]))
    seq = draw(st.integers(0, MAX_INT))
    message: dict[str, Any] = {"kind": kind, "run_id": run_id or draw(run_ids), "seq": seq}
    if draw(st.booleans()):
        message["rank"] = draw(st.integers(0, 64))
    if draw(st.booleans()):
        message["time"] = draw(st.floats(0, 2e9))
    if kind == "metrics":
        message["schema"] = "foreshock.metrics/1"
        message["step"] = draw(st.integers(0, MAX_INT))
        message["values"] = draw(st.dictionaries(series_keys, good_numbers, max_size=6))
        if draw(st.booleans()):
            message["flags"] = draw(st.lists(st.text(max_size=8), max_size=3))
    elif kind == "action":
        message.update(
            schema="foreshock.run/1",
            step=draw(st.integers(0, MAX_INT)),
            action=draw(st.sampled_from(["hold-lr", "stop", "None"])),
            warning_id=draw(st.text(max_size=12)),
            family=draw(st.sampled_from(["router", "optimizer", ""])),
            applied=draw(st.booleans()),
        )
        for name, values in (
            ("module", st.one_of(st.none(), st.text(max_size=8))),
            ("dry_run", st.booleans()),
            ("rolled_back_to", st.one_of(st.none(), st.integers(0, MAX_INT))),
            ("error", st.one_of(st.none(), st.text(max_size=8))),
            ("source", st.sampled_from(["policy", "approved"])),
            ("request_id", st.one_of(st.none(), st.text(max_size=8))),
        ):
            if draw(st.booleans()):
                message[name] = draw(values)
    elif kind == "start":
        message["schema"] = "foreshock.run/1"
        message["labels"] = draw(
            st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)
        )
        message["producer"] = {"foreshock": "0.1.0"}
    else:
        message.update(
            schema="foreshock.run/1",
            last_seq=seq,
            status=draw(st.sampled_from(["finished", "diverged", "closed"])),
        )
        if draw(st.booleans()):
            message["divergence_step"] = draw(st.one_of(st.none(), st.integers(0, MAX_INT)))
    return message


FIELDS = [
    "kind",
    "schema",
    "run_id",
    "seq",
    "rank",
    "step",
    "values",
    "time",
    "flags",
    "labels",
    "status",
    "last_seq",
    "divergence_step",
    "world_size",
    "error",
    "producer",
    "action",
    "warning_id",
    "family",
    "applied",
    "dry_run",
    "rolled_back_to",
    "source",
    "request_id",
    "detail",
]
SCHEMAS = [
    "foreshock.metrics/2",
    "foreshock.run/2",
    "foreshock.metrics/1",
    "foreshock.run/1",
    "foreshock.warning/1",
    "foreshock.metrics/1.1",
    "",
    None,
    1,
]


@st.composite
def mutated_messages(draw) -> dict[str, Any]:
    """A valid message with one to three fields deleted or replaced by something hostile."""
    message = draw(valid_messages())
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(FIELDS))
        how = draw(st.sampled_from(["delete", "int", "run_id", "schema", "value", "any"]))
        if how == "delete":
            message.pop(name, None)
        elif how == "int":
            message[name] = draw(bad_ints)
        elif how == "run_id":
            message["run_id"] = draw(any_run_ids)
        elif how == "schema":
            message["schema"] = draw(st.sampled_from(SCHEMAS))
        elif how == "value" and isinstance(message.get("values"), dict):
            message["values"][draw(st.text(max_size=8))] = draw(json_values)
        else:
            message[name] = draw(json_values)
    return message


def _dumps(value: Any) -> bytes:
    """JSON as a careless producer writes it: NaN and Infinity literals allowed."""
    return json.dumps(value, allow_nan=True).encode()


NASTY = [
    b"",
    b"null",
    b"[]",
    b"1",
    b'"x"',
    b"NaN",
    b"-Infinity",
    b"{}",
    b"\xef\xbb\xbf{}",
    b"\xff\xfe",
    b"\xc3\x28",
    b"[" * 100_000,
    b"{" * 3000,
    b'{"kind": "metrics"' + b", " * 10,
    b'{"seq": ' + b"9" * 5000 + b"}",
    b'{"values": {"loss": 1e999}}',
    b'{"kind": "end", "seq": -0}',
    b'{"kind":"metrics","schema":"foreshock.metrics/1","run_id":"r1","seq":0,"step":0,'
    b'"values":{"loss":' + b"9" * 400 + b"}}",
    b'{"kind":"metrics","schema":"foreshock.metrics/1","run_id":"r1","seq":0,"step":0,'
    b'"values":{"loss":NaN}}',
    b'{"kind":"metrics","schema":"foreshock.metrics/1","run_id":"r1","seq":0,"step":0,'
    b'"values":{"loss":1},"time":-Infinity}',
    b'{"kind":"metrics","schema":"foreshock.metrics/1","run_id":"r\\ud800","seq":0,"step":0,'
    b'"values":{}}',
    b'{"kind":"start","schema":"foreshock.run/1","run_id":"r1","seq":0,"labels":[1]}',
    b'{"kind":"end","schema":"foreshock.run/1","run_id":"r1","seq":1,"last_seq":1,'
    b'"status":"x","divergence_step":"soon"}',
    b" " * (MAX_MESSAGE_BYTES + 1),
    b'{"a": "' + b"x" * MAX_MESSAGE_BYTES + b'"}',
]


@pytest.mark.parametrize("data", NASTY, ids=lambda d: ascii(d[:24]))
def test_wire_decode_rejects_nasty_bytes(data):
    assert _decode_or_reason(data) is None


def _raw_bytes() -> st.SearchStrategy[bytes]:
    """Bytes: random, non-UTF-8, truncated or spliced valid messages, deep nesting, huge."""
    spliced = st.builds(
        lambda m, cut, junk: encode(m)[:cut] + junk + encode(m)[cut:],
        valid_messages(),
        st.integers(0, 200),
        st.binary(max_size=4),
    )
    return st.one_of(
        st.binary(max_size=200),
        st.builds(lambda m, cut: encode(m)[:cut], valid_messages(), st.integers(0, 200)),
        spliced,
        st.builds(lambda m: encode(m) + b"\xff", valid_messages()),
        st.builds(lambda m: encode(m).replace(b'"r', b'"\\ud800r', 1), valid_messages()),
        st.sampled_from(NASTY),
        st.builds(_dumps, mutated_messages()),
        st.builds(_dumps, json_values),
    )


# ---------------------------------------------------------------- the properties


def _finite_tree(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_tree(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_tree(v) for v in value)
    return True


def _decode_or_reason(data: Any) -> dict[str, Any] | None:
    """Decode; a rejection must be a WireError with a reason, an acceptance must be sane."""
    tick = time.perf_counter()
    try:
        message = decode(data)
    except WireError as exc:
        assert str(exc).strip(), "a rejection without a reason"
        return None
    finally:
        assert time.perf_counter() - tick < SLOW, "decode hung"
    assert decode(encode(message)) == message  # round trips
    assert re.fullmatch(RUN_ID_PATTERN, message["run_id"])
    assert _finite_tree(message)
    for value in message["values"].values() if message["kind"] == "metrics" else ():
        assert value is None or (not isinstance(value, bool) and math.isfinite(float(value)))
    ints = {"metrics": ("step",), "end": ("last_seq",), "start": (), "action": ("step",)}
    for name in ("seq", "rank", *ints[message["kind"]]):
        if name in message:
            assert 0 <= message[name] <= MAX_INT and not isinstance(message[name], bool)
    return message


@FUZZ
@given(_raw_bytes())
def test_wire_decode_accepts_or_rejects_with_a_reason(data):
    _decode_or_reason(data)


@FUZZ
@given(valid_messages())
def test_wire_accepts_and_round_trips_valid_messages(message):
    assert decode(encode(message)) == message


@settings(FUZZ, max_examples=120)
@given(mutated_messages())
def test_wire_validate_agrees_with_the_schema_file(message):
    """What the code accepts, the shipped JSON Schema accepts (the code is never laxer)."""
    data = _dumps(message)
    accepted = _decode_or_reason(data)
    keys = accepted["values"] if accepted and accepted["kind"] == "metrics" else {}
    if accepted is not None and all(KEY.fullmatch(k) for k in keys):
        jsonschema.validate(accepted, SCHEMA)  # (series keys: the sink checks those)
    try:
        jsonschema.validate(message, SCHEMA)
    except jsonschema.ValidationError:
        return
    values = message.get("values")
    # the schema accepts: the code too, but for its documented extra rules (end.last_seq ==
    # seq; finite numbers; whole JSON integers, not 1.0; no trailing newline in a run id,
    # which Python's re.search lets through the schema's `$`; valid Unicode)
    extra = (
        (message.get("kind") == "end" and message.get("last_seq") != message.get("seq"))
        or not _finite_tree(message)
        or str(message.get("run_id")).endswith("\n")
        or any(
            isinstance(message.get(f), float)
            for f in (
                "seq",
                "rank",
                "step",
                "last_seq",
                "world_size",
                "divergence_step",
                "rolled_back_to",
            )
        )
        or any(
            isinstance(v, int) and not isinstance(v, bool) and abs(v) > int(sys.float_info.max)
            for v in (values.values() if isinstance(values, dict) else ())
        )
    )
    if not extra:
        assert accepted is not None, f"the schema accepts what the code rejects: {message!r}"


def _metrics(**fields: Any) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "schema": "foreshock.metrics/1",
        "run_id": "r1",
        "seq": 0,
        "step": 0,
        "values": {"loss": 1.0},
        **fields,
    }


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS, ids=ascii)
def test_wire_rejects_hostile_run_ids(run_id):
    with pytest.raises(WireError, match="run_id"):
        validate(_metrics(run_id=run_id))
    with pytest.raises(WireError):
        decode(json.dumps(_metrics(run_id=run_id)).encode())


@pytest.mark.parametrize(
    "change",
    [
        {"values": {"loss": 10**400}},
        {"values": {"loss": int("9" * 4000)}},
        {"seq": 2**63},
        {"step": 2**64},
        {"seq": True},
        {"step": 25.0},
        {"rank": -1},
        {"world_size": 0},
        {"schema": "foreshock.metrics/2"},
        {"schema": "foreshock.run/1"},
        {"time": float("nan")},
        {"time": "yesterday"},
        {"flags": [float("nan")]},
        {"flags": [1, 2]},
        {"error": 5},
        {"values": {"loss": float("inf")}},
        {"values": {"loss": True}},
        {"kind": "end"},
    ],
    ids=lambda c: ascii(c)[:40],
)
def test_wire_rejects_each_hostile_field(change):
    with pytest.raises(WireError):
        decode(json.dumps(_metrics(**change), allow_nan=True).encode())


def test_wire_rejects_lone_surrogates_nan_literals_deep_nesting_and_oversize():
    start = {"kind": "start", "schema": "foreshock.run/1", "run_id": "r1", "seq": 0}
    ok = encode({**start, "labels": {"note": "é ✓ 🚀"}})
    assert decode(ok)["labels"]["note"] == "é ✓ 🚀"  # escaped non-ASCII is fine
    nan = encode({**start, "labels": {"x": 1.5}}).replace(b"1.5", b"NaN")
    for data, reason in [
        (ok.replace(b"\\u00e9", b"\\ud800"), "surrogate"),
        (nan, "NaN"),
        (b"[" * 50_000 + b"]" * 50_000, "nested"),
        (b" " * (MAX_MESSAGE_BYTES + 1), "exceeds"),
    ]:
        with pytest.raises(WireError, match=reason):
            decode(data)
    with pytest.raises(WireError, match="surrogate"):
        encode({**start, "labels": {"x": "\udc80"}})
    with pytest.raises(WireError, match="not finite"):
        encode({**start, "labels": {"x": float("inf")}})


# ---------------------------------------------------------------- storage rows and the sink


class FakeRaw:
    """A consumed Kafka message, as the decoders see one."""

    def __init__(
        self, value: Any, headers: list | None = None, topic: str = "t", offset: int = 0
    ) -> None:
        self._value, self._headers, self._topic, self._offset = value, headers, topic, offset

    def value(self) -> Any:
        return self._value

    def key(self) -> bytes:
        return b"k"

    def headers(self) -> list | None:
        return self._headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_764_513_600_000)


def _bare_sink() -> StorageSink:
    """The sink's step 2 (``add``) without Kafka or a store: what it needs of ``__init__``."""
    sink = object.__new__(StorageSink)
    sink.settings = KafkaSettings(spool_dir="unused")
    sink.builder = BatchBuilder()
    sink.stored = StoredState()
    sink.attempts = AttemptTracker()
    sink.stats = SinkStats()
    return sink


def _valid_warning(draw_id: int, run_id: str = "r1") -> dict[str, Any]:
    return {
        "schema": "foreshock.warning/1",
        "id": f"w{draw_id}",
        "event": "opened",
        "run_id": run_id,
        "family": "router",
        "module": "blocks.0.moe",
        "series": "router.epsilon@blocks.0.moe",
        "direction": "up",
        "step": 100 + draw_id,
        "role": "cause",
        "statistic": 7.5,
        "threshold": 5.0,
        "false_alarm_rate": 0.1,
        "config_version": "v",
        "evidence": {"recent": [[1, 2.0, 3.0]]},
        "divergence_step": None,
        "lead_time": None,
        "cleared_step": None,
    }


WARNING_KEYS = [
    "id",
    "event",
    "run_id",
    "family",
    "step",
    "module",
    "role",
    "statistic",
    "false_alarm_rate",
    "divergence_step",
    "cleared_step",
    "lead_time",
    "evidence",
    "schema",
]
warning_like = st.one_of(
    st.builds(
        lambda w, name, value: {**w, name: value},
        st.builds(_valid_warning, st.integers(0, 10**6), run_ids),
        st.sampled_from(WARNING_KEYS),
        json_values,
    ),
    st.dictionaries(
        st.sampled_from(["schema", "id", "event", "run_id", "family", "step"]), json_values
    ),
)


@FUZZ_BATCH
@given(
    st.lists(
        st.one_of(mutated_messages(), st.dictionaries(st.sampled_from(FIELDS), json_values)),
        min_size=1,
        max_size=6,
    ),
    st.lists(valid_messages(), min_size=1, max_size=6),
)
def test_batch_keeps_valid_records_beside_bad_ones(bad, good):
    """Arbitrary dicts as metrics / lifecycle records: a RecordError with a reason, or
    stored; the batch is always writable and holds every valid record next to them."""
    builder, steps, events, values = BatchBuilder(), set(), set(), 0
    for message in (
        [m for pair in zip(good, bad, strict=False) for m in pair]
        + good[len(bad) :]
        + bad[len(good) :]
    ):
        metrics = message.get("kind", "metrics") == "metrics"
        add = builder.add_metrics if metrics else builder.add_lifecycle
        try:
            add(message, 1.0)
        except RecordError as exc:
            assert str(exc).strip()
            assert message not in good, f"a valid record refused: {exc}"
            continue
        key = (message["run_id"], message.get("rank", 0), message["seq"])
        (steps if metrics else events).add(key)
        values += len(message.get("values") or {}) if metrics else 0
    tables = builder.take()  # Arrow accepts every row that was let in
    stored_steps = {(r["run_id"], r["rank"], r["seq"]) for r in tables["steps"].to_pylist()}
    stored_events = {(r["run_id"], r["rank"], r["seq"]) for r in tables["run_events"].to_pylist()}
    assert stored_steps == steps and stored_events == events
    assert tables["metric_values"].num_rows == values
    for m in good:
        key = (m["run_id"], m.get("rank", 0), m["seq"])
        assert key in (stored_steps if m["kind"] == "metrics" else stored_events)
    assert all(v is None or math.isfinite(v) for v in tables["metric_values"]["value"].to_pylist())


@FUZZ_BATCH
@given(
    st.lists(
        st.one_of(
            st.builds(_dumps, warning_like), st.binary(max_size=50), st.builds(_dumps, json_values)
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 5),
)
def test_sink_warning_decoding_keeps_valid_events_beside_bad_ones(raws, n_valid):
    """Warnings topic: WireError (to the dead letters), a dead-letter row via RecordError, or
    stored — and the valid events of the same batch are stored."""
    sink = _bare_sink()
    valid = [_valid_warning(i) for i in range(n_valid)]
    for offset, raw in enumerate([_dumps(w) for w in valid] + raws):
        try:
            message = sink_decode_warning(FakeRaw(raw))
        except WireError as exc:
            assert str(exc).strip()
            continue
        sink.add(Consumed(message, sink.settings.warnings_topic, 0, offset), 1.0)
    tables = sink.builder.take()
    stored = {r["id"] for r in tables["warnings"].to_pylist()}
    assert {w["id"] for w in valid} <= stored
    assert all(r["reason"] for r in tables["dead_letters"].to_pylist())


@FUZZ_BATCH
@given(
    st.lists(mutated_messages(), min_size=1, max_size=6),
    st.lists(valid_messages(kind="metrics"), min_size=1, max_size=4),
)
def test_sink_add_stores_valid_and_dead_letters_the_rest(bad, good):
    """The sink's own path: wire decode, then ``add`` — a reasoned dead letter for each bad
    message (from the consumer or from the sink), every valid one stored."""
    sink, dead = _bare_sink(), 0
    for offset, message in enumerate(good + bad):
        try:
            decoded = decode(_dumps(message))
        except WireError:
            dead += 1  # the consumer dead-letters it; stored from the dead-letter topic
            continue
        sink.add(Consumed(decoded, "foreshock.metrics", 0, offset), 1.0)
    tables = sink.builder.take()
    stored = {(r["run_id"], r["rank"], r["seq"]) for r in tables["steps"].to_pylist()}
    assert {(m["run_id"], m.get("rank", 0), m["seq"]) for m in good} <= stored
    assert all(r["reason"] for r in tables["dead_letters"].to_pylist())
    kept = sum(tables[t].num_rows for t in ("steps", "run_events", "dead_letters"))
    assert dead + kept == len(good) + len(bad)  # each message: stored, or a dead letter


@FUZZ
@given(
    st.one_of(st.none(), st.binary(max_size=100)),
    st.one_of(
        st.none(),
        st.lists(
            st.tuples(
                st.sampled_from(["reason", "topic", "partition", "offset", "x"]),
                st.one_of(
                    st.none(),
                    st.binary(max_size=30),
                    st.sampled_from([b"99999999999999999999999", b"-1", b"\xff\xfe", b"7"]),
                ),
            ),
            max_size=6,
        ),
    ),
)
def test_dead_letter_topic_decoding_never_fails(value, headers):
    sink = _bare_sink()
    message = decode_dead_letter(FakeRaw(value, headers))
    sink.add(Consumed(message, sink.settings.deadletter_topic, 0, 1), 1.0)
    rows = sink.builder.take()["dead_letters"].to_pylist()
    assert len(rows) == 1 and rows[0]["reason"] and rows[0]["raw"] == value


# ---------------------------------------------------------------- the notifier


@FUZZ
@given(
    st.one_of(
        st.builds(_dumps, warning_like),
        st.binary(max_size=80),
        st.none(),
        st.builds(_dumps, json_values),
    )
)
def test_notifier_decoding_handles_or_rejects_with_a_reason(raw):
    try:
        event = decode_warning(FakeRaw(raw))
    except SkippedMessageError as exc:  # skipped, counted as invalid, with a reason
        assert str(exc).strip()
        return
    assert event.to_message() == json.loads(raw)  # typed, and nothing of it lost
    Ledger().admit(event, at=1.0, partition=0)
    for payload in (
        webhook_payload(event, "http://d"),
        slack_payload(event, "http://d"),
        alertmanager_alert(event, "http://d", 1.0, 2.0),
    ):
        json.dumps(payload, default=str)


# ---------------------------------------------------------------- the detectors

KEYS = [
    "loss",
    "grad_norm",
    "attn.d2.entropy_mean@h.0.attn",
    "router.epsilon@blocks.0.moe",
    "router.token_entropy_norm@blocks.0.moe",
    "attn.dwq.entropy@h.1.attn",
]
HAIR_TRIGGER = {r.metric: 1.0 for r in DEFAULT_RULES}  # thresholds: warnings open readily
TREND = DetectorConfig(warmup_start=0, warmup_records=3, confirm=1, thresholds=HAIR_TRIGGER)
LEVEL = DetectorConfig(
    baseline="level", warmup_start=0, warmup_records=3, confirm=1, thresholds=HAIR_TRIGGER
)
HUGE = [1e300, -1e300, 1.7976931348623157e308, -1.7976931348623157e308, 1e-300, 10**300, 2**63]
wild = st.one_of(st.none(), st.floats(-10, 10), st.sampled_from([*HUGE, 0.0]))


def _records(run_id: str, steps: list[int], values: list[dict[str, Any]]) -> list[dict]:
    pairs = enumerate(zip(steps, values, strict=True))
    return [
        {
            "kind": "metrics",
            "schema": "foreshock.metrics/1",
            "run_id": run_id,
            "seq": seq,
            "step": step,
            "values": v,
        }
        for seq, (step, v) in pairs
    ]


@st.composite
def detector_streams(draw) -> list[dict[str, Any]]:
    """Valid-wire metrics (and end) messages of one run: steps repeated, out of order,
    going backwards; values null, ordinary or huge; delivered shuffled and duplicated."""
    n = draw(st.integers(1, 40))
    steps = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    values = [
        {k: draw(wild) for k in draw(st.lists(st.sampled_from(KEYS), max_size=6))} for _ in steps
    ]
    messages = _records("fz", steps, values)
    if draw(st.booleans()):
        divergence = draw(st.one_of(st.none(), st.integers(0, 400)))
        end = {"kind": "end", "schema": "foreshock.run/1", "run_id": "fz", "seq": n}
        messages.append({**end, "last_seq": n, "status": "diverged", "divergence_step": divergence})
    for m in messages:
        validate(m)
    return draw(st.permutations(messages + draw(st.lists(st.sampled_from(messages), max_size=5))))


@FUZZ_BATCH
@given(detector_streams(), st.sampled_from([TREND, LEVEL]), st.integers(1, 10))
def test_detector_never_raises_nor_emits_non_finite_numbers(messages, config, max_held):
    orderer, detector, released, events = SeqOrderer(max_held), RunDetector("fz", config), [], []
    for message in messages:
        for ready in orderer.push(dict(message)):
            released.append(ready["seq"])
            events += detector.update(ready)
    assert released == sorted(set(released))  # in seq order, each once
    _assert_finite_events(events, detector)


def _assert_finite_events(events: list, detector: RunDetector) -> None:
    for event in events:
        body = event.to_message()
        json.dumps(body, allow_nan=False)  # no NaN or ±Inf anywhere, evidence included
        assert math.isfinite(body["statistic"]) and math.isfinite(body["threshold"])
    assert all(math.isfinite(p) for p in detector.peaks.values())


@pytest.mark.parametrize("config", [TREND, LEVEL], ids=["trend", "level"])
def test_detector_warns_on_huge_values_with_finite_statistics(config):
    """Warm up on ordinary values, then values near the float limit, both signs: warnings
    open (and clear), every number in them finite."""
    tail = [1e300, -1.7976931348623157e308, 1.7976931348623157e308, 1e308, -1e300] * 3
    series = [1.0, 1.1, 0.9, 1.0, *tail, 1.0, 1.0]
    keys = ["router.epsilon@m", "attn.d2.entropy_mean@a", "grad_norm", "loss"]
    records = _records(
        "huge", list(range(0, 10 * len(series), 10)), [dict.fromkeys(keys, x) for x in series]
    )
    detector, events = RunDetector("huge", config), []
    for record in records:
        validate(record)
        events += detector.update(record)
    assert {e.event for e in events} >= {"opened"}
    _assert_finite_events(events, detector)


@FUZZ
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 1), st.integers(0, 30)), max_size=80
    ),
    st.integers(1, 50),
)
def test_seq_orderer_releases_each_seq_once_in_order(pushes, max_held):
    orderer, out = SeqOrderer(max_held=max_held), {}
    for run_id, rank, seq in pushes:
        for m in orderer.push({"run_id": run_id, "rank": rank, "seq": seq}):
            out.setdefault((m["run_id"], m["rank"]), []).append(m["seq"])
    for seqs in out.values():
        assert seqs == sorted(set(seqs))
    if max_held >= 31:  # nothing skipped: every stream's 0.. prefix that arrived came out
        for stream in {(r, k) for r, k, _ in pushes}:
            arrived = {s for r, k, s in pushes if (r, k) == stream}
            prefix = next(i for i in range(32) if i not in arrived)
            assert out.get(stream, [])[:prefix] == list(range(prefix))


# ---------------------------------------------------------------- queries and export


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "history"
    builder = BatchBuilder()
    builder.add_lifecycle(
        {"kind": "start", "run_id": "r1", "seq": 0, "labels": {"project": "p"}}, 1.0
    )
    for seq in range(1, 4):
        builder.add_metrics(
            {
                "run_id": "r1",
                "seq": seq,
                "step": seq * 10,
                "values": {"loss": 2.0, "router.epsilon@m": 0.5},
            },
            1.0,
        )
    builder.add_warning(_valid_warning(1), 1.0)
    with DeltaStore(root) as store:
        store.write(builder.take())
    return root


def _no_rows_for(history, run_id: str) -> None:
    assert queries.fleet(history, run_id=run_id) == []
    assert queries.summary(history, run_id) is None
    assert queries.run_series_index(history, run_id) == []
    assert queries.series_many(history, run_id, ["loss", run_id]) == {"loss": [], run_id: []}
    assert queries.series_across_runs(history, [run_id], run_id) == []
    assert queries.run_warnings(history, run_id) == []
    assert queries.run_records(history, run_id) == (None, [], None)
    assert stream_queries.stream_seqs(history, run_id, 0) == []
    assert queries.run_rows(history, "steps", run_id).num_rows == 0


# (a lone surrogate is not valid text: DuckDB refuses to bind it — with an error, not rows;
# no run id can hold one: the wire refuses it, and the dashboard's URLs decode as UTF-8)
QUERYABLE = [r for r in HOSTILE_RUN_IDS if "\ud800" not in r]


@pytest.fixture(scope="module")
def small_history(small_store):
    with open_history(small_store) as history:
        yield history


def test_queries_take_hostile_run_ids_as_parameters(small_history):
    for run_id in QUERYABLE:
        _no_rows_for(small_history, run_id)
    assert queries.run_count(small_history) == 1  # nothing was dropped or deleted
    assert [r["run_id"] for r in queries.fleet(small_history)] == ["r1"]


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=30).filter(lambda r: r != "r1"))
def test_queries_take_any_text_as_a_run_id(small_history, run_id):
    _no_rows_for(small_history, run_id)


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS, ids=ascii)
def test_export_refuses_path_like_run_ids_and_writes_nothing(small_store, tmp_path, run_id):
    target = tmp_path / "deep" / "out"
    with pytest.raises(ValueError, match="not a valid run id"):
        export_run(small_store, run_id, target)
    assert list(tmp_path.iterdir()) == []


def test_export_writes_only_table_files_in_its_target(small_store, tmp_path):
    counts = export_run(small_store, "r1", tmp_path / "out")
    assert counts["steps"] == 3
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["out"] + [f"{t}.parquet" for t in counts]
    )


# ---------------------------------------------------------------- through the real broker


def _bad_messages(seed: int = 0) -> list[tuple[str, bytes]]:
    """~30 bad messages, drawn deterministically: (which topic, value)."""
    rng = random.Random(seed)
    base = {
        "kind": "metrics",
        "schema": "foreshock.metrics/1",
        "run_id": "bad-run",
        "seq": 0,
        "step": 0,
        "values": {"loss": 1.0},
    }
    text = json.dumps(base).encode()
    hostile_fields = [
        {"seq": -1},
        {"seq": True},
        {"seq": 2**63},
        {"step": 2.5},
        {"rank": "0"},
        {"schema": "foreshock.metrics/2"},
        {"run_id": rng.choice(HOSTILE_RUN_IDS[:12])},
        {"run_id": "../../etc/passwd"},
        {"values": {"loss": "high"}},
        {"values": [1.0]},
        {"time": "now"},
        {"kind": "metric"},
        {"values": {"loss": 10**400}},
    ]
    bad: list[tuple[str, bytes]] = [
        ("metrics", json.dumps({**base, **h}).encode()) for h in hostile_fields
    ]
    bad += [("metrics", text[: rng.randrange(1, len(text) - 1)]) for _ in range(4)]
    bad += [
        ("metrics", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
        for _ in range(4)
    ]
    bad += [
        ("metrics", b'{"kind":"metrics","values":{"loss":NaN}}'),
        ("metrics", b"\xff\xfe"),
        ("metrics", b"[" * 5000),
        ("metrics", b""),
        ("metrics", text.replace(b'"loss"', b'"loss\\ud800"')),
    ]
    # valid wire, but not storable: the sink's own dead letters (bad series keys)
    bad += [
        ("metrics", encode({**base, "seq": i, "run_id": "keys-run", "values": {key: 1.0}}))
        for i, key in enumerate(["not a key!", "loss\n", "x@m#h99999999999999999999"])
    ]
    bad += [
        ("warnings", b"not json"),
        (
            "warnings",
            json.dumps({"schema": "foreshock.warning/1", "id": ["x"], "event": "opened"}).encode(),
        ),
    ]
    rng.shuffle(bad)
    return bad


def test_bad_messages_through_the_broker_are_dead_letters_and_the_sink_runs_on(
    kafka_settings, tmp_path
):
    from confluent_kafka import Producer

    from foreshock.transport.topics import ensure_topics

    ensure_topics(kafka_settings)
    bad = _bad_messages()
    assert len(bad) >= 30
    for topic, value in bad:  # each one is bad somewhere: on the wire, or for the store
        if topic == "metrics":
            try:
                message = decode(value)
            except WireError:
                continue
            with pytest.raises(RecordError):
                BatchBuilder().add_metrics(message, 0.0)
    good = {
        run: [
            {
                "kind": "metrics",
                "schema": "foreshock.metrics/1",
                "run_id": run,
                "seq": s,
                "step": 10 * s,
                "values": {"loss": 2.0 + s, "router.epsilon@m": None},
            }
            for s in range(12)
        ]
        for run in ("fuzz-a", "fuzz-b")
    }
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    topics = {"metrics": kafka_settings.metrics_topic, "warnings": kafka_settings.warnings_topic}
    valid = [m for pair in zip(good["fuzz-a"], good["fuzz-b"], strict=True) for m in pair]
    for i, message in enumerate(valid):
        producer.produce(topics["metrics"], key=message["run_id"].encode(), value=encode(message))
        if i < len(bad):
            topic, value = bad[i]
            producer.produce(topics[topic], key=b"bad-run", value=value)
    for topic, value in bad[len(valid) :]:
        producer.produce(topics[topic], key=b"bad-run", value=value)
    assert producer.flush(10) == 0

    root = tmp_path / "store"
    sink = StorageSink(kafka_settings, root, group_id="fuzz-sink", max_wait=0.3)
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline, letters, steps = time.monotonic() + 30, [], []
        while time.monotonic() < deadline:
            if store_exists(str(root)):
                with open_history(root) as history:
                    steps = history.sql("SELECT run_id, seq FROM steps").to_pylist()
                    letters = history.sql(
                        "SELECT reason, raw, source FROM dead_letters"
                    ).to_pylist()
                if len(letters) >= len(bad) and len(steps) >= len(valid):
                    break
            time.sleep(0.3)
        assert sorted((s["run_id"], s["seq"]) for s in steps) == sorted(
            (m["run_id"], m["seq"]) for m in valid
        )  # every valid message, once
        assert len(letters) == len(bad), [d["reason"] for d in letters]
        assert all(d["reason"].strip() for d in letters)
        raws = {d["raw"] for d in letters}
        from_consumer = [v for t, v in bad if not _stores_as_record_error(t, v)]
        assert all(v in raws for v in from_consumer)
        assert sorted(
            d["reason"].split(":")[0] for d in letters if d["source"] == "sink:metrics"
        ) == ["malformed series key", "malformed series key", "series key with a head beyond int64"]
        assert thread.is_alive()  # and it still takes new messages
        late = {**good["fuzz-a"][0], "seq": 12, "step": 120}
        producer.produce(topics["metrics"], key=b"fuzz-a", value=encode(late))
        producer.flush(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with open_history(root) as history:
                if history.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] > len(valid):
                    break
            time.sleep(0.3)
        else:
            pytest.fail("the sink stopped storing after the bad messages")
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()


def _stores_as_record_error(topic: str, value: bytes) -> bool:
    if topic != "metrics":
        return False
    try:
        decode(value)
    except WireError:
        return False
    return True
