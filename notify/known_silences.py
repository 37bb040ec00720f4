"""The Alertmanager silences a notifier made, found again after it restarted.

Why: a notifier keeps the id Alertmanager gave each silence it made (an acknowledgement's, a
person's silence) so that it can extend the silence while the warning stays open and *expire*
it the moment the warning resolves. A notifier that restarted without those ids made a second
silence on the next renewal and could expire neither: a person's ``silence --for 30d`` kept
muting that module's alerts — real warnings of later runs included — for the whole 30 days.

Alertmanager is where the silences live, so it is where their ids are read back: one
``GET <am>/api/v2/silences`` per Alertmanager at start. A silence is this notifier's when its
comment is the one :func:`~foreshock.notify.payloads.alertmanager_silence` writes
(``"<acknowledged|silenced> in foreshock: warning <id>…"``); expired ones are ignored. No file
or topic holds the ids, so a notifier moved to another host finds them too.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

from .delivery import request
from .targets import Target

log = logging.getLogger(__name__)

_COMMENT = re.compile(r"^(acknowledged|silenced) in foreshock: warning ([^\s:(]+)")
_LIVE = ("active", "pending")


def foreshock_silences(listing: Any) -> dict[tuple[str, str], tuple[str, float]]:
    """``(warning id, acknowledged|silenced) -> (silence id, ends at in epoch s)`` from an
    Alertmanager ``GET /api/v2/silences`` answer; only live silences foreshock made. Where one
    warning has several (a restart renewed it before this existed), the one ending last wins.

    >>> listing = [
    ...     {"id": "s1", "status": {"state": "active"}, "endsAt": "2026-01-01T00:00:00.000Z",
    ...      "comment": "silenced in foreshock: warning ab12: mute (http://d/run?run=r)"},
    ...     {"id": "s2", "status": {"state": "expired"}, "endsAt": "2026-01-01T00:00:00.000Z",
    ...      "comment": "acknowledged in foreshock: warning cd34 (http://d/run?run=r)"},
    ...     {"id": "s3", "status": {"state": "active"}, "comment": "maintenance window"},
    ... ]
    >>> foreshock_silences(listing)
    {('ab12', 'silenced'): ('s1', 1767225600.0)}
    >>> foreshock_silences({"error": "not a list"})
    {}
    """
    found: dict[tuple[str, str], tuple[str, float]] = {}
    for silence in listing if isinstance(listing, list) else []:
        if not isinstance(silence, dict) or not isinstance(silence.get("id"), str):
            continue
        state = (silence.get("status") or {}).get("state")
        match = _COMMENT.match(str(silence.get("comment") or ""))
        if state not in _LIVE or match is None:
            continue
        key, ends = (match.group(2), match.group(1)), _epoch(silence.get("endsAt"))
        if key not in found or ends > found[key][1]:
            found[key] = (silence["id"], ends)
    return found


def _epoch(text: Any) -> float:
    """An RFC 3339 time as epoch seconds; 0.0 when it is not one."""
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def read_silences(target: Target, timeout: float) -> dict[tuple[str, str], tuple[str, float]]:
    """The live silences foreshock made at ``target`` (an Alertmanager); empty, with one log
    line, when it cannot be asked — the notifier then works as if it had none."""
    outcome = request(target, f"{target.api}/silences", None, "GET", timeout)
    if not outcome.ok:
        log.warning(
            "foreshock notify: could not list the silences at %s (%s): silences made before "
            "this start are renewed as new ones and not expired when their warning resolves",
            target.where,
            outcome.reason,
        )
        return {}
    return foreshock_silences(outcome.answer)
