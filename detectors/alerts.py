"""A warning's life: open → resolved, or acknowledged / silenced by a person on the way.

States (what a person sees):

* ``open`` — the detectors opened it (``opened``; an ``updated`` adds the lead time);
* ``acknowledged`` — someone has it in hand (who, when, a note): no more nagging, still open;
* ``silenced`` — muted until a time (who, when, until); open again afterwards if not resolved;
* ``resolved`` — over: its statistic went back under the threshold, or its run ended. Stored
  as the detectors' ``cleared`` event (the store's views key on that name), with
  ``evidence.resolved_by`` = ``"statistic"`` or ``"run ended"``.

Every transition is a ``foreshock.warning/1`` event on the warnings topic, keyed by run id like
the detectors' own, so the sink stores it (with who and when) and the notifier hears it in
order with the warning's other events. A person's event (:func:`action_event`) copies the
warning's facts — run, family, module, step — so every consumer can render it alone, and puts
what the person did in ``evidence``: ``action_id`` (unique: two acknowledgements are two
events), ``by``, ``at``, ``until``, ``note``, ``via``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from foreshock.transport.warning import (
    DETECTOR_EVENTS,
    EVENTS,
    FACTS,
    PERSON_EVENTS,
    RESOLVED_BY,
    SCHEMA,
    resolved_by,
)

__all__ = [
    "DETECTOR_EVENTS",
    "EVENTS",
    "PERSON_EVENTS",
    "RESOLVED_BY",
    "STATES",
    "action_event",
    "publish",
    "resolved_by",
    "state_of",
]

STATES = ("open", "acknowledged", "silenced", "resolved")
_MAX_TEXT = 500


def state_of(events: Iterable[dict[str, Any]], now: float | None = None) -> str:
    """One warning's state from its events (any order): resolved beats an active silence beats
    an acknowledgement beats open.

    >>> ack = {"event": "acknowledged", "evidence": {"by": "ana", "at": 10.0}}
    >>> mute = {"event": "silenced", "evidence": {"by": "bo", "at": 11.0, "until": 100.0}}
    >>> [state_of(e, now=50.0) for e in ([{"event": "opened"}], [ack], [ack, mute],
    ...                                 [mute, {"event": "cleared"}])]
    ['open', 'acknowledged', 'silenced', 'resolved']
    >>> state_of([mute], now=200.0)  # the silence ran out
    'open'
    """
    now = time.time() if now is None else now
    events = list(events)
    if any(e.get("event") == "cleared" for e in events):
        return "resolved"
    if any(e.get("event") == "silenced" and (_until(e) or 0) > now for e in events):
        return "silenced"
    if any(e.get("event") == "acknowledged" for e in events):
        return "acknowledged"
    return "open"


def _until(event: dict[str, Any]) -> float | None:
    evidence = event.get("evidence")
    until = evidence.get("until") if isinstance(evidence, dict) else None
    return float(until) if isinstance(until, int | float) and not isinstance(until, bool) else None


def _text(value: str, what: str) -> str:
    """One line of a person's text, or ValueError (it ends up in Slack and in logs)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty text")
    if len(value) > _MAX_TEXT or any(ord(c) < 32 for c in value):
        raise ValueError(f"{what} must be one line of at most {_MAX_TEXT} characters")
    return value.strip()


def action_event(
    warning: dict[str, Any],
    kind: str,
    by: str,
    until: float | None = None,
    note: str | None = None,
    via: str = "cli",
    now: float | None = None,
) -> dict[str, Any]:
    """A person's event on ``warning`` (its latest detector event, as stored or sent).

    >>> w = {"id": "a1", "run_id": "r1", "family": "router", "module": "m", "step": 450,
    ...      "event": "opened", "evidence": {"recent": []}}
    >>> e = action_event(w, "silenced", "ana", until=4000.0, note="known", now=400.0)
    >>> e["event"], e["id"], e["step"], e["cleared_step"], sorted(e["evidence"])
    ('silenced', 'a1', 450, None, ['action_id', 'at', 'by', 'note', 'until', 'via'])
    >>> action_event({**w, "event": "cleared"}, "acknowledged", "ana")
    Traceback (most recent call last):
    ...
    ValueError: warning a1 is resolved already: there is nothing to acknowledge
    """
    if kind not in PERSON_EVENTS:
        raise ValueError(f"unknown action {kind!r} (one of {', '.join(PERSON_EVENTS)})")
    if warning.get("event") == "cleared":
        verb = "acknowledge" if kind == "acknowledged" else "silence"
        raise ValueError(
            f"warning {warning.get('id')} is resolved already: there is nothing to {verb}"
        )
    now = time.time() if now is None else now
    if kind == "silenced" and (until is None or until <= now):
        raise ValueError("a silence needs an end in the future")
    evidence = {
        "action_id": uuid.uuid4().hex,
        "by": _text(by, "who"),
        "at": now,
        "until": until if kind == "silenced" else None,
        "note": None if note is None else _text(note, "the note"),
        "via": via,
    }
    return {
        "schema": SCHEMA,
        **{k: warning.get(k) for k in FACTS},
        "event": kind,
        "cleared_step": None,
        "evidence": evidence,
    }


def publish(
    settings: Any, event: dict[str, Any], timeout: float = 15.0, topic: str | None = None
) -> None:
    """Produce ``event`` to the warnings topic, or ``topic`` (key: its run id); raise if it is
    not acknowledged by the broker within ``timeout`` s: a person must know their click did
    not land."""
    from confluent_kafka import KafkaException

    from foreshock.transport.clients import topic_producer

    topic = topic or settings.warnings_topic
    errors: list[Any] = []
    producer = topic_producer(
        settings,
        {
            "acks": "all",
            "allow.auto.create.topics": False,
            "message.timeout.ms": int(timeout * 1000),
        },
    )
    try:
        producer.produce(
            topic,
            key=str(event["run_id"]).encode(),
            value=json.dumps(event).encode(),
            on_delivery=lambda err, _msg: errors.append(err),
        )
    except KafkaException as exc:
        raise RuntimeError(f"cannot send to {topic}: {exc}") from None
    left = producer.flush(timeout + 5)  # the delivery report comes by message.timeout.ms
    if left or not errors or errors[0] is not None:
        reason = errors[0] if errors and errors[0] is not None else "no answer from the broker"
        raise RuntimeError(f"not delivered to {topic}: {reason}")
