"""What a run's detectors keep to go back to a step: the last records, and snapshots of their
state between them.

Why: a run resumed from a checkpoint re-does steps, and its detectors must then hold what an
uninterrupted run that had reached the checkpoint would hold — warm-up baselines, CUSUMs,
open warnings. Replaying every record from the run's start is exact but unbounded; replaying
only the last ``window`` records from an empty state is bounded but wrong for a long run (its
warm-up would be re-learned mid-run). So every ``every`` records the state is snapshotted
(pickled: a few tens of kB against ~3 kB a record), and going back to step ``s`` restores the
newest snapshot taken at or before ``s`` and replays only the kept records after it — exact
for any ``s`` inside the window, at most ``every`` records replayed. A resume further back
than the window cannot be rebuilt exactly: it starts from nothing (as a new run would) and
says so (``exact`` False).

>>> rewind = Rewind(window=6, every=2)
>>> state = {"n": 0}
>>> for step in range(0, 100, 10):
...     rewind.keep({"step": step}, lambda: dict(state))
...     state["n"] += 1
>>> [m["step"] for m in rewind.records]  # the window: the last 6 records
[40, 50, 60, 70, 80, 90]
>>> blob, replay, exact = rewind.back_to(75)
>>> restore(blob), [m["step"] for m in replay], exact  # the state before step 60, then 60, 70
({'n': 6}, [60, 70], True)
>>> rewind.back_to(15)[1:]  # before the window: nothing to rebuild from
([], False)
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Rewind", "restore"]


class Rewind:
    """The kept records (``records``, the current timeline, steps increasing) and the state
    snapshots (``(step, pickled state before that step's record)``) of one detector."""

    def __init__(self, window: int, every: int = 250) -> None:
        self.window, self.every = window, every
        self.records: deque[dict[str, Any]] = deque(maxlen=window)
        self.snapshots: deque[tuple[int, bytes]] = deque(maxlen=max(window // every, 1))
        self.dropped = False  # has the window let a record go (so nothing replays from 0)?
        self._since = 0  # records kept since the last snapshot

    def keep(self, message: dict[str, Any], state: Callable[[], dict[str, Any]]) -> None:
        """Keep ``message`` (before it is applied); snapshot ``state()`` first when due."""
        if self.window <= 0:
            return
        if self._since >= self.every:
            self.snapshots.append((int(message["step"]), pickle.dumps(state())))
            self._since = 0
        self.dropped |= len(self.records) == self.window
        self.records.append(message)
        self._since += 1

    def note(self, message: dict[str, Any]) -> None:
        """Keep ``message`` without a snapshot before it: a message at the step of a record
        already kept (an action), where a snapshot would hold that record's effect."""
        if self.window > 0:
            self.dropped |= len(self.records) == self.window
            self.records.append(message)

    def back_to(self, step: int) -> tuple[bytes | None, list[dict[str, Any]], bool]:
        """``(snapshot or None, records to replay, exact)`` to rebuild the state just before
        ``step``; what was kept at or after ``step`` is forgotten (that timeline is over)."""
        oldest = int(self.records[0]["step"]) if self.records else step
        usable = [(s, blob) for s, blob in self.snapshots if oldest <= s <= step]
        start, blob = usable[-1] if usable else (None, None)
        timeline = [m for m in self.records if int(m["step"]) < step]
        if start is None:  # replay the timeline from nothing, if it is whole
            exact = not self.dropped
            self.records.clear()
            self.snapshots.clear()
            self.dropped, self._since = False, 0
            return None, timeline if exact else [], exact
        self.records = deque((m for m in timeline if int(m["step"]) < start), self.window)
        kept = [(s, b) for s, b in self.snapshots if s <= start]
        self.snapshots = deque(kept, self.snapshots.maxlen)
        self._since = 0
        return blob, [m for m in timeline if int(m["step"]) >= start], True


def restore(blob: bytes | None) -> dict[str, Any]:
    """A snapshot's state (empty for none)."""
    return {} if blob is None else pickle.loads(blob)
