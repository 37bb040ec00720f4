"""Tell a resumed run from two jobs that share a run id, as the messages arrive.

A run resumed from a checkpoint keeps its ``run_id`` and starts a new ``attempt`` (see
:mod:`foreshock.transport.wire`); its earlier attempt stopped sending before the new one
started. Two *concurrent* jobs under one run id also show up as two attempts of one
(run, rank), but both send at once. So, per (run, rank), each attempt's span of producer
times [first, last] is kept, and two attempts whose spans overlap are a **collision**: the
two jobs' data stay apart (each
attempt is its own stream), and the sink reports it once per pair — a log line and a dead
letter with the reason — while ``queries.run_attempts`` flags the run (``overlaps``).

Records a producer re-sends from its spool carry the times they were made, inside their own
attempt's past, so a resume whose predecessor's spool arrives late is not a collision. And
attempts of different restart counts (:mod:`foreshock.transport.attempts`: the later one
resumed from a checkpoint the earlier wrote) are a resume whatever their clocks say — a host
60 s behind makes the resumed attempt's times overlap the crashed one's — so only attempts
of one restart count are compared.
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.attempts import restart_of

__all__ = ["AttemptTracker"]


class AttemptTracker:
    """``observe(message)`` → a reason the first time it shows a collision, else None.

    >>> t = AttemptTracker()
    >>> [t.observe({"run_id": "r", "attempt": 1, "time": s}) for s in (1.0, 2.0, 3.0)]
    [None, None, None]
    >>> t.observe({"run_id": "r", "attempt": 2, "time": 9.0})  # resumed after 1 stopped
    >>> t.observe({"run_id": "r", "attempt": 3, "time": 9.5})  # a second job, while 2 sends
    >>> t.observe({"run_id": "r", "attempt": 2, "time": 10.0})
    'run id collision: run r rank 0: attempts 2 and 3 send at the same time (two jobs under one run id)'
    """  # noqa: E501

    def __init__(self) -> None:
        self._spans: dict[tuple[str, int], dict[int, list[float]]] = {}
        self._reported: set[tuple[str, int, int, int]] = set()

    def observe(self, message: dict[str, Any]) -> str | None:
        key = (str(message.get("run_id")), _int(message.get("rank")))
        attempt, time = _int(message.get("attempt")), message.get("time")
        if not isinstance(time, int | float) or isinstance(time, bool):
            return None
        spans = self._spans.setdefault(key, {})
        span = spans.setdefault(attempt, [time, time])
        span[0], span[1] = min(span[0], time), max(span[1], time)
        for other, (first, last) in spans.items():
            if other == attempt or not (first < span[1] and span[0] < last):
                continue
            if restart_of(other) != restart_of(attempt):  # one resumed the other's checkpoint
                continue
            low, high = sorted((attempt, other))
            pair = (key[0], key[1], low, high)
            if pair not in self._reported:
                self._reported.add(pair)
                return (
                    f"run id collision: run {key[0]} rank {key[1]}: attempts {pair[2]} and "
                    f"{pair[3]} send at the same time (two jobs under one run id)"
                )
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
