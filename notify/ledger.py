"""What a notifier has already sent of each warning: the deduplication of its transitions.

Why: delivery is at least once (a crash re-sends the window after the last commit), the
embedded broker replays from offset 0 after a restart, and a detector worker re-emits after
its own; a receiver must still hear each transition once. The ledger admits an ``opened`` for a
warning not yet opened or resolved, one ``cleared``, each (warning, divergence step) update
once, and a person's event once (its ``action_id``), while the warning is not resolved. It is
rebuilt on start by replaying the retained topic (:mod:`foreshock.notify.notifier`).
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.warning import ACTIONS

__all__ = ["Ledger"]


class Ledger:
    """Which events went out: open warnings (event and start time), resolved ids, updates, and
    people's acknowledgements and silences.

    >>> ledger = Ledger()
    >>> a = {"id": "a", "event": "opened"}
    >>> [ledger.admit(e, at=1.0) for e in (a, a, {"id": "a", "event": "updated",
    ...     "divergence_step": 9}, {"id": "a", "event": "cleared"}, {"id": "a", "event": "cleared"},
    ...     a)]
    [True, False, True, True, False, False]
    >>> ledger.open, ledger.cleared
    ({}, {'a'})
    >>> ledger.admit({"id": "b", "event": "cleared"}, at=2.0)  # its opening predates retention
    True
    >>> ack = {"id": "c", "event": "acknowledged", "evidence": {"action_id": "x1", "by": "ana"}}
    >>> ledger.admit(ack, at=3.0), ledger.admit(ack, at=3.0), sorted(ledger.acked)
    (True, False, ['c'])
    """

    def __init__(self) -> None:
        self.open: dict[str, tuple[dict[str, Any], float, int | None]] = {}  # event, at, partition
        self.cleared: set[str] = set()
        self.updated: dict[str, Any] = {}  # id -> divergence step last sent
        self.acked: dict[str, dict[str, Any]] = {}  # id -> its latest acknowledgement
        self.silenced: dict[str, dict[str, Any]] = {}  # id -> its latest silence
        self.actions: set[str] = set()  # action ids seen

    def admit(self, event: dict[str, Any], at: float, partition: int | None = None) -> bool:
        """True the first time ``event`` should go out (and remember it); False for a repeat."""
        wid, kind = event["id"], event["event"]
        if kind == "opened":
            if wid in self.open or wid in self.cleared:
                return False
            self.open[wid] = (event, at, partition)
            return True
        if kind == "cleared":
            if wid in self.cleared:
                return False
            self.open.pop(wid, None)
            self.acked.pop(wid, None)
            self.silenced.pop(wid, None)
            self.cleared.add(wid)
            return True
        if kind == "updated":
            if wid in self.updated and self.updated[wid] == event.get("divergence_step"):
                return False
            self.updated[wid] = event.get("divergence_step")
            if wid in self.open:
                _, started, where = self.open[wid]
                self.open[wid] = (event, started, where)
            return True
        if kind in ACTIONS:
            evidence = event.get("evidence")
            action = str(evidence.get("action_id") if isinstance(evidence, dict) else None)
            if action in self.actions or wid in self.cleared:
                return False
            self.actions.add(action)
            (self.acked if kind == "acknowledged" else self.silenced)[wid] = event
            return True
        return False

    def started(self, wid: str) -> float | None:
        """When the open warning ``wid`` opened (epoch seconds), if it is open."""
        entry = self.open.get(wid)
        return None if entry is None else entry[1]

    def muted(self, wid: str, now: float) -> bool:
        """Is ``wid`` silenced at ``now``?"""
        until = (self.silenced.get(wid, {}).get("evidence") or {}).get("until")
        return isinstance(until, int | float) and until > now
