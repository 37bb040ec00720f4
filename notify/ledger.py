"""What a notifier has already sent of each warning: the deduplication of its transitions.

Why: delivery is at least once (a crash re-sends the window after the last commit), the
embedded broker replays from offset 0 after a restart, and a detector worker re-emits after
its own; a receiver must still hear each transition once. The ledger admits an ``opened`` for a
warning not yet opened or resolved, one ``cleared``, each (warning, divergence step) update
once, and a person's event once (its ``action_id``), while the warning is not resolved. It is
rebuilt on start by replaying the retained topic (:mod:`foreshock.notify.notifier`).
"""

from __future__ import annotations

from foreshock.transport.warning import PERSON_EVENTS, WarningEvent

__all__ = ["Ledger"]


class Ledger:
    """Which events went out: open warnings (event and start time), resolved ids, updates, and
    people's acknowledgements and silences.

    >>> def event(wid, kind, **more):
    ...     return WarningEvent(wid, kind, run_id="r1", family="loss", step=5, **more)
    >>> ledger = Ledger()
    >>> a = event("a", "opened")
    >>> [ledger.admit(e, at=1.0) for e in (a, a, event("a", "updated", divergence_step=9),
    ...     event("a", "cleared"), event("a", "cleared"), a)]
    [True, False, True, True, False, False]
    >>> ledger.open, ledger.cleared
    ({}, {'a'})
    >>> ledger.admit(event("b", "cleared"), at=2.0)  # its opening predates retention
    True
    >>> ack = event("c", "acknowledged", evidence={"action_id": "x1", "by": "ana"})
    >>> ledger.admit(ack, at=3.0), ledger.admit(ack, at=3.0), sorted(ledger.acked)
    (True, False, ['c'])
    """

    def __init__(self) -> None:
        self.open: dict[str, tuple[WarningEvent, float, int | None]] = {}  # event, at, partition
        self.cleared: set[str] = set()
        self.updated: dict[str, int | None] = {}  # id -> divergence step last sent
        self.acked: dict[str, WarningEvent] = {}  # id -> its latest acknowledgement
        self.silenced: dict[str, WarningEvent] = {}  # id -> its latest silence
        self.actions: set[str] = set()  # action ids seen

    def admit(self, event: WarningEvent, at: float, partition: int | None = None) -> bool:
        """True the first time ``event`` should go out (and remember it); False for a repeat."""
        wid, kind = event.id, event.event
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
            if wid in self.updated and self.updated[wid] == event.divergence_step:
                return False
            self.updated[wid] = event.divergence_step
            if wid in self.open:
                _, started, where = self.open[wid]
                self.open[wid] = (event, started, where)
            return True
        if kind in PERSON_EVENTS:
            action = str((event.evidence or {}).get("action_id"))
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
        silence = self.silenced.get(wid)
        until = (silence.evidence or {}).get("until") if silence is not None else None
        return isinstance(until, int | float) and until > now
