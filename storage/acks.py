"""Warnings as people see them in the store: each one's state, and who acknowledged or silenced
it, when, until when.

The ``warnings`` table holds every event as it came (:mod:`foreshock.detectors.alerts`): the
detectors' ``opened``/``updated``/``cleared`` and people's ``acknowledged``/``silenced``, whose
``evidence`` says who, when, until, why. :func:`warning_states` folds them, per warning id, into
the detectors' newest event (the facts) plus the state and the latest acknowledgement and
silence — what ``foreshock warnings list`` prints and a dashboard shows.

A person's events are not repeats of each other: two people acknowledging one warning are two
events with the same (id, event, divergence step, cleared step). :func:`event_key` is the sink's
dedup key with the action's own id added, :data:`STORED_EVENT_KEYS` the same key read back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from foreshock.transport.warning import PERSON_EVENTS, WarningEvent

from .reader import History

__all__ = ["STORED_EVENT_KEYS", "event_key", "find_warning", "warning_states"]

_ACTIONS = "('acknowledged', 'silenced')"

STORED_EVENT_KEYS = f"""
SELECT id, event, divergence_step, cleared_step,
       CASE WHEN event IN {_ACTIONS} THEN json_extract_string(evidence, '$.action_id') END
           AS action_id
FROM warnings
"""


def event_key(event: WarningEvent | Mapping[str, Any]) -> tuple:
    """A warning event's dedup key: (id, event, divergence step, cleared step, action id).

    ``event`` is typed, or a message checked only as deep as this key
    (:func:`~foreshock.transport.warning.decode` with ``key_only``: the sink deduplicates
    before its batch builder checks the rest), whose missing fields count as null.

    >>> event_key({"id": "a", "event": "opened", "divergence_step": None, "cleared_step": None})
    ('a', 'opened', None, None, None)
    >>> event_key(WarningEvent("a", "acknowledged", "r1", "loss", 5, evidence={"action_id": "x1"}))
    ('a', 'acknowledged', None, None, 'x1')
    """
    key: tuple[Any, ...]
    if isinstance(event, WarningEvent):
        key = (event.id, event.event, event.divergence_step, event.cleared_step)
        evidence: Any = event.evidence
    else:
        key = tuple(event.get(k) for k in ("id", "event", "divergence_step", "cleared_step"))
        evidence = event.get("evidence")
    action = None
    if key[1] in PERSON_EVENTS:
        found = evidence.get("action_id") if isinstance(evidence, dict) else None
        action = found if isinstance(found, str) else None
    return (*key, action)


_STATES = f"""
WITH facts AS (
    SELECT * EXCLUDE (rk) FROM (
        SELECT *, row_number() OVER (PARTITION BY id ORDER BY
            CASE event WHEN 'cleared' THEN 2 WHEN 'updated' THEN 1 ELSE 0 END DESC,
            received_at DESC) AS rk
        FROM warnings WHERE event NOT IN {_ACTIONS}) WHERE rk = 1),
actions AS (
    SELECT id, event, json_extract_string(evidence, '$.by') AS who,
           TRY_CAST(json_extract(evidence, '$.at') AS DOUBLE) AS acted,
           TRY_CAST(json_extract(evidence, '$.until') AS DOUBLE) AS until,
           json_extract_string(evidence, '$.note') AS note
    FROM warnings WHERE event IN {_ACTIONS}),
acks AS (
    SELECT id, arg_max(who, acted) AS acknowledged_by, max(acted) AS acknowledged_at,
           arg_max(note, acted) AS acknowledged_note
    FROM actions WHERE event = 'acknowledged' GROUP BY id),
mutes AS (
    SELECT id, arg_max(who, acted) AS silenced_by, max(acted) AS silenced_at,
           arg_max(until, acted) AS silenced_until, arg_max(note, acted) AS silenced_note
    FROM actions WHERE event = 'silenced' GROUP BY id)
SELECT f.*,
       CASE WHEN f.event = 'cleared' THEN 'resolved'
            WHEN m.silenced_until > $now THEN 'silenced'
            WHEN a.acknowledged_by IS NOT NULL THEN 'acknowledged'
            ELSE 'open' END AS state,
       CASE WHEN f.event = 'cleared'
            THEN coalesce(json_extract_string(f.evidence, '$.resolved_by'), 'statistic')
            END AS resolved_by,
       a.acknowledged_by, a.acknowledged_at, a.acknowledged_note,
       m.silenced_by, m.silenced_at, m.silenced_until, m.silenced_note
FROM facts f LEFT JOIN acks a USING (id) LEFT JOIN mutes m USING (id)
WHERE ($run::VARCHAR IS NULL OR f.run_id = $run)
  AND ($id::VARCHAR IS NULL OR starts_with(f.id, $id))
  AND ($resolved OR f.event <> 'cleared')
ORDER BY f.run_id, f.step, f.family, f.module
"""


def warning_states(
    history: History,
    run_id: str | None = None,
    resolved: bool = True,
    id_prefix: str | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Each warning (of ``run_id``; whose id starts with ``id_prefix``; not resolved unless
    ``resolved``): its newest detector event's columns, evidence parsed, plus ``state``
    (open | acknowledged | silenced | resolved), ``resolved_by``, and the latest
    acknowledgement's and silence's who, when, note (and until)."""
    params = {
        "now": time.time() if now is None else now,
        "run": run_id,
        "id": id_prefix,
        "resolved": resolved,
    }
    rows = history.sql(_STATES, params).to_pylist()
    for row in rows:
        row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
    return rows


def find_warning(history: History, id_or_prefix: str) -> dict[str, Any]:
    """The one warning whose id is (or starts with) ``id_or_prefix``; LookupError otherwise."""
    rows = warning_states(history, id_prefix=id_or_prefix)
    exact = [r for r in rows if r["id"] == id_or_prefix]
    if exact:
        return exact[0]
    if not rows:
        raise LookupError(f"no warning {id_or_prefix!r} in the store")
    if len(rows) > 1:
        ids = ", ".join(r["id"] for r in rows[:5])
        raise LookupError(f"{id_or_prefix!r} is the start of {len(rows)} warnings' ids ({ids}…)")
    return rows[0]
