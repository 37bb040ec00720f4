"""The collision warning: another producer writes under a live run's id.

Why a warning of its own: the records of a stray attempt
(:mod:`foreshock.transport.attempt_guard`) are not followed, so the detectors stay on the
live run — but a person must hear that a second job (an evaluation reusing the run id, a
launch script run twice) writes under it, once, on the run page and the fleet page, and
with what it is: family ``collision``, role ``collision``, not a mechanism, never acted on
(:mod:`foreshock.remediation.remedy` acts on causes only), and no part of any detection
figure. One opens per stray attempt, at the live run's step; it is resolved when the run
ends, or when the stray turns out to be the replacement after all (the live attempt fell
silent: it took over).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from foreshock.catalogue import COLLISION
from foreshock.transport.warning import EventKind, RunWarning

from .warning_facts import alert_id

__all__ = ["Collisions"]


class Collisions:
    """The open collision warnings of one run (or rank) and the stray records counted."""

    def __init__(self, run_id: str, rank: int | None) -> None:
        self.run_id, self.rank = run_id, rank
        self.open: dict[int, RunWarning] = {}  # stray attempt -> its warning
        self.records = 0  # messages of stray attempts, skipped

    def stray(self, message: dict[str, Any], live: int | None, step: int) -> list[RunWarning]:
        """Count one stray message; the first of its attempt opens the warning."""
        self.records += 1
        attempt = int(message.get("attempt") or 0)
        if attempt in self.open:
            self.open[attempt].evidence["stray_records"] += 1
            return []
        warning = RunWarning(
            alert_id(self.run_id, COLLISION, None, step, "attempts", self.rank, attempt),
            self.run_id, COLLISION, None, "attempt", "up", max(step, 0), COLLISION, 1.0, 1.0,
            None, "attempts", self._evidence(message, live), rank=self.rank,
        )  # fmt: skip
        self.open[attempt] = warning
        return [RunWarning(**asdict(warning))]

    def close(self, step: int, why: dict[str, Any], attempt: int | None = None) -> list[RunWarning]:
        """Resolve the open collision warnings (``attempt``: only that stray's)."""
        keys = [a for a in self.open if attempt is None or a == attempt]
        events = []
        for key in keys:
            warning = self.open.pop(key)
            warning.cleared_step = step
            event = RunWarning(**{**asdict(warning), "event": EventKind.CLEARED})
            event.evidence = {**event.evidence, **why}
            events.append(event)
        return events

    @staticmethod
    def _evidence(message: dict[str, Any], live: int | None) -> dict[str, Any]:
        return {
            "stray_attempt": int(message.get("attempt") or 0),
            "live_attempt": live,
            "stray_kind": str(message.get("kind", "metrics")),
            "stray_step": message.get("step"),
            "stray_records": 1,
            "why": "another producer writes under this run id while the run is live and "
            "does not resume it (no higher restart count): its records are stored apart "
            "and the detectors stay on the live attempt",
        }
