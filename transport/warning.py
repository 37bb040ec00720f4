"""The warning event (``foreshock.warning/1``): its fields, its events and its one validation.

Every event on the warnings topic — the detectors' ``opened``/``updated``/``cleared`` and a
person's ``acknowledged``/``silenced`` (:mod:`foreshock.detectors.alerts`) — is one flat JSON
object with the fields below, plus ``schema`` and a free-form ``evidence``. The JSON Schema
beside the wire's, ``warning-v1.schema.json`` (:func:`json_schema`), says the same for other
languages; ``tests/test_warning_schema.py`` keeps the two in step.

Who checks what, with :func:`check` (one function, two depths):

* the notifier renders an event only if ``check(event)`` finds nothing: required text, known
  event kinds, numbers that are finite, a person's event with who and when;
* the storage sink dead-letters on ``check(event, key_only=True)`` — the fields its dedup key
  reads — and lets its batch builder refuse the rest (a dead-letter row, with Arrow's reason),
  among it a ``run_id`` outside the wire's rule, which the JSON Schema states as its pattern.

What a consumer reads is one type, :class:`WarningEvent` (:func:`decode_event` for the notifier;
:func:`foreshock.storage.rows.stored_warning` for the store, at its own depth): attributes, not
string keys, and :meth:`WarningEvent.to_message` gives back the message exactly as it came.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from functools import cache
from importlib.resources import files
from typing import Any

from .wire import WireError

__all__ = [
    "DETECTOR_EVENTS",
    "EVENTS",
    "FACTS",
    "FIELDS",
    "PERSON_EVENTS",
    "REQUIRED",
    "RESOLVED_BY",
    "SCHEMA",
    "Direction",
    "EventKind",
    "Role",
    "RunWarning",
    "WarningEvent",
    "check",
    "decode",
    "decode_event",
    "finite",
    "json_schema",
    "resolved_by",
]

SCHEMA = "foreshock.warning/1"


class EventKind(StrEnum):
    """What happened to a warning: the detectors' three, a person's two."""

    OPENED = "opened"
    UPDATED = "updated"  # its lead time, once the loss diverged
    CLEARED = "cleared"  # resolved (``evidence.resolved_by`` says why)
    ACKNOWLEDGED = "acknowledged"
    SILENCED = "silenced"


class Role(StrEnum):
    """What a warning says about the run's fault (``detectors/attribution.py``)."""

    CAUSE = "cause"  # the first mechanism family to move, the other calm
    SECONDARY = "secondary"  # a family that moved after the cause
    AMBIGUOUS = "ambiguous"  # both mechanism families on one record
    OPTIMIZER = "optimizer"  # every weight grew first: the optimizer's settings
    SYMPTOM = "symptom"  # loss, gradient or weight norm
    COLLISION = "collision"  # another producer writes under the run id (not the run's fault)


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"


DETECTOR_EVENTS = (EventKind.OPENED, EventKind.UPDATED, EventKind.CLEARED)
# what a person does to a warning (``foreshock warnings ack`` / ``silence``); a person's
# remedy is another word: :data:`foreshock.remediation.remedies.REMEDIES`
PERSON_EVENTS = (EventKind.ACKNOWLEDGED, EventKind.SILENCED)
EVENTS = DETECTOR_EVENTS + PERSON_EVENTS
# why a warning resolved (``cleared``'s ``evidence.resolved_by``): its statistic went back, its
# run ended, a newer attempt took over, or the trainer acted on it (an ``action`` record)
RESOLVED_BY = ("statistic", "run ended", "superseded", "action")

_TEXT = ("id", "event", "run_id", "family")  # required strings
_OPTIONAL_TEXT = ("module", "series", "direction", "role", "config_version")
_OPTIONAL_INT = ("divergence_step", "lead_time", "cleared_step", "rank")
_NUMBERS = ("statistic", "threshold", "false_alarm_rate")  # finite, or null
_KEY_TEXT, _KEY_INT = ("id", "event"), ("divergence_step", "cleared_step")  # the store's key

# the flat fields, in the store's column order (``evidence`` is kept as JSON beside them)
FIELDS = (
    "id",
    "event",
    "run_id",
    "family",
    "module",
    "series",
    "direction",
    "step",
    "role",
    "statistic",
    "threshold",
    "false_alarm_rate",
    "config_version",
    "divergence_step",
    "lead_time",
    "cleared_step",
    "rank",  # per-rank mode: the rank whose stream warned (absent before, and for one process)
)
REQUIRED = (*_TEXT, "step")
# the warning's own facts: what a person's event copies from the warning's latest state
FACTS = tuple(f for f in FIELDS if f not in ("event", "cleared_step"))


@dataclass
class RunWarning:
    """One warning of a run: what the detectors hold and emit, the one statement of the
    event's fields (:data:`FIELDS`, the JSON Schema and the store's Arrow schema are checked
    against it: ``tests/test_warning_schema.py``); ``to_message()`` is its event on the
    warnings topic. ``family`` is one of :data:`foreshock.catalogue.FAMILIES`."""

    id: str
    run_id: str
    family: str
    module: str | None
    series: str
    direction: Direction | str
    step: int
    role: Role | str
    statistic: float
    threshold: float
    false_alarm_rate: float | None
    config_version: str
    evidence: dict[str, Any]
    event: EventKind | str = EventKind.OPENED
    divergence_step: int | None = None
    lead_time: int | None = None
    cleared_step: int | None = None
    rank: int | None = None  # the rank whose stream warned, in per-rank mode

    def to_message(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}


@dataclass(frozen=True)
class WarningEvent:
    """A warning event as its consumers read it (the notifier, the store): one checked message
    of the warnings topic, typed. The required fields (:data:`REQUIRED`) always; every other
    field of :data:`FIELDS` None where the message had it null or had it not (a person's event
    carries only the warning's :data:`FACTS`); ``evidence`` when it is an object or null; and
    in ``extra`` whatever else the message held (fields a person's event or a newer producer
    adds; ``evidence`` that is not an object), so :meth:`to_message` gives back exactly the
    message it came from, keys in their order.

    >>> m = {"schema": "foreshock.warning/1", "id": "a", "event": "opened", "run_id": "r1",
    ...      "family": "router", "step": 5, "module": None, "evidence": {"z": 1.5}, "new": 7}
    >>> e = WarningEvent.from_message(m)
    >>> e.id, e.step, e.module, e.role, e.evidence, dict(e.extra)
    ('a', 5, None, None, {'z': 1.5}, {'new': 7})
    >>> e.to_message() == m and list(e.to_message()) == list(m)
    True
    >>> e.has("module"), e.has("role")  # null in the message, and not in it
    (True, False)
    """

    id: str
    event: EventKind | str
    run_id: str
    family: str
    step: int
    module: str | None = None
    series: str | None = None
    direction: Direction | str | None = None
    role: Role | str | None = None
    statistic: float | None = None
    threshold: float | None = None
    false_alarm_rate: float | None = None
    config_version: str | None = None
    divergence_step: int | None = None
    lead_time: int | None = None
    cleared_step: int | None = None
    rank: int | None = None
    evidence: dict[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # the message's keys, in its order (None: built here, not decoded: every field is sent)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> WarningEvent:
        """The event of ``message``, a warning event that :func:`check` accepted (in full: a
        required field it lacks is a KeyError)."""
        known = {k: v for k, v in message.items() if k in _ATTRIBUTES}
        extra = {k: v for k, v in message.items() if k not in _ATTRIBUTES}
        if extra.get("schema") == SCHEMA:  # every event's: kept in ``keys``, not as extra
            del extra["schema"]
        if not isinstance(known.get("evidence"), dict | None):  # kept as it came, not typed
            extra["evidence"] = known.pop("evidence")
        missing = [k for k in REQUIRED if k not in known]
        if missing:
            raise KeyError(f"warning event without {missing}")
        return cls(**known, extra=extra, keys=tuple(message))

    def has(self, name: str) -> bool:
        """Did the message hold ``name`` (null or not)? Always, for an event built here."""
        return self.keys is None or name in self.keys

    def to_message(self) -> dict[str, Any]:
        """The message again: the keys it had, in their order (then any field set since, not
        null); an event built here: ``schema``, every field, ``evidence`` and ``extra``."""
        if self.keys is None:
            message = {"schema": SCHEMA, **{f: getattr(self, f) for f in FIELDS}}
            return {**message, "evidence": self.evidence, **self.extra}
        message = {k: self._value(k) for k in self.keys}
        for name in (*FIELDS, "evidence"):
            value = getattr(self, name)
            if name not in message and value is not None:
                message[name] = value
        return {**message, **self.extra}

    def _value(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        return SCHEMA if key == "schema" else getattr(self, key)


_ATTRIBUTES = frozenset(f.name for f in fields(WarningEvent)) - {"extra", "keys"}


def decode_event(value: bytes | str | None) -> WarningEvent:
    """A warning event from its bytes on the wire, fully checked (:func:`check`), typed;
    :class:`~foreshock.transport.wire.WireError` saying why it is not one.

    >>> decode_event(b'{"schema": "foreshock.warning/1", "id": "a", "event": "opened", '
    ...              b'"run_id": "r1", "family": "router", "step": 5}').family
    'router'
    """
    return WarningEvent.from_message(decode(value))


def decode(value: bytes | str | None, key_only: bool = False) -> dict[str, Any]:
    """A warning event from its bytes on the wire, checked (:func:`check`, at ``key_only``
    depth); :class:`~foreshock.transport.wire.WireError` saying why it is not one.

    >>> decode(b'{"schema": "foreshock.warning/1", "id": "a", "event": "opened", '
    ...        b'"run_id": "r1", "family": "router", "step": 5}')["step"]
    5
    >>> decode(b"{")
    Traceback (most recent call last):
    ...
    foreshock.transport.wire.WireError: warning is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
    """  # noqa: E501
    try:
        event = json.loads(value)  # type: ignore[arg-type]
    except RecursionError:
        raise WireError("warning is not JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:  # a UnicodeDecodeError is a ValueError
        raise WireError(f"warning is not JSON: {exc}") from None
    problem = check(event, key_only)
    if problem is not None:
        raise WireError(problem)
    return event


def check(event: Any, key_only: bool = False) -> str | None:
    """Why ``event`` is not a warning event; None if it is. ``key_only``: only the schema and
    the fields a store's dedup key reads (strings or null, integers or null).

    >>> check({"schema": "foreshock.warning/1", "id": "a", "event": "opened",
    ...        "run_id": "r1", "family": "router", "step": 5})
    >>> check({"schema": "foreshock.warning/1", "id": ["a"], "event": "opened",
    ...        "run_id": "r1", "family": "router", "step": 5})
    "warning event whose 'id' is not a string"
    >>> check({"schema": "foreshock.warning/1", "id": "a", "event": "acknowledged",
    ...        "run_id": "r1", "family": "router", "step": 5, "evidence": {"by": 7}})
    'acknowledged event without who (evidence.by) and when (evidence.at)'
    >>> check({"schema": "foreshock.warning/1", "cleared_step": 1.5}, key_only=True)
    "warning event whose 'cleared_step' is not an integer or null"
    """
    if not isinstance(event, dict) or event.get("schema") != SCHEMA:
        return f"not a {SCHEMA} event"
    if key_only:
        return _check_key(event)
    missing = [k for k in REQUIRED if event.get(k) is None]
    if missing:
        return f"warning event without {missing}"
    for name in _TEXT:
        if not isinstance(event[name], str):
            return f"warning event whose {name!r} is not a string"
    if event["event"] not in EVENTS:
        return f"unknown warning event {event['event'][:40]!r}"
    for name in _OPTIONAL_TEXT:
        if not isinstance(event.get(name), str | None):
            return f"warning event whose {name!r} is not a string or null"
    for name in ("step", *_OPTIONAL_INT):
        if not _integer_or_null(event.get(name)):
            return f"warning event whose {name!r} is not an integer"
    for name in _NUMBERS:
        value = event.get(name)
        if value is not None and not finite(value):
            return f"warning event whose {name!r} is not a finite number"
    return _check_action(event) if event["event"] in PERSON_EVENTS else None


def _check_key(event: dict[str, Any]) -> str | None:
    for name in _KEY_TEXT:
        if not isinstance(event.get(name), str | None):
            return f"warning event whose {name!r} is not a string"
    for name in _KEY_INT:
        if not _integer_or_null(event.get(name)):
            return f"warning event whose {name!r} is not an integer or null"
    return None


def _check_action(event: dict[str, Any]) -> str | None:
    """A person's event: who (text), when and until (numbers), note (text), a unique id."""
    kind, evidence = event["event"], event.get("evidence")
    if not isinstance(evidence, dict):
        return f"{kind} event without evidence"
    if not isinstance(evidence.get("by"), str) or not _time(evidence.get("at")):
        return f"{kind} event without who (evidence.by) and when (evidence.at)"
    if not isinstance(evidence.get("action_id"), str):
        return f"{kind} event without evidence.action_id"
    if not isinstance(evidence.get("note"), str | None):
        return f"{kind} event whose note is not text"
    until = evidence.get("until")
    if (kind == "silenced" or until is not None) and not _time(until):
        return f"{kind} event whose evidence.until is not a time"
    return None


def _integer_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def finite(value: Any) -> bool:
    """A finite int or float (not a bool).

    >>> finite(1.5), finite(float("nan")), finite(True), finite(10**400)
    (True, False, False, False)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float
        return False


def _time(value: Any) -> bool:
    """Unix seconds a date can show (1970 to the year 9999)."""
    return finite(value) and 0 <= value < 253_402_300_800


def resolved_by(event: WarningEvent | Mapping[str, Any]) -> str | None:
    """Why a ``cleared`` event (a message or a :class:`WarningEvent`) resolved its warning
    (None for any other event).

    A clearing stored before the reason was recorded was a statistic's: nothing else cleared.

    >>> resolved_by({"event": "cleared", "evidence": {"resolved_by": "run ended"}})
    'run ended'
    >>> resolved_by({"event": "cleared", "evidence": None}), resolved_by({"event": "opened"})
    ('statistic', None)
    """
    kind: Any
    if isinstance(event, WarningEvent):
        kind, evidence = event.event, event.evidence
    else:
        kind, evidence = event.get("event"), event.get("evidence")
    if kind != "cleared":
        return None
    reason = evidence.get("resolved_by") if isinstance(evidence, dict) else None
    return reason if reason in RESOLVED_BY else "statistic"


@cache
def json_schema() -> dict[str, Any]:
    """The JSON Schema of a warning event (``warning-v1.schema.json``, shipped beside this)."""
    text = files("foreshock.transport").joinpath("warning-v1.schema.json").read_text()
    return json.loads(text)
