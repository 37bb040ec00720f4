"""Put each stream's messages back in seq order before the detectors see them.

A message re-sent from a producer's spool can arrive after newer ones; detectors are
sequential, so each (run_id, rank, attempt) stream is released in seq order. A gap that does
not fill within ``max_held`` held messages is skipped (logged): a lost message must not stall
a run.
"""

from __future__ import annotations

import logging
from typing import Any

from foreshock.transport.wire import stream_of

__all__ = ["SeqOrderer"]

log = logging.getLogger(__name__)


class SeqOrderer:
    """``push(message)`` returns the messages now ready, in seq order.

    >>> o = SeqOrderer()
    >>> [m["seq"] for m in o.push({"run_id": "r", "seq": 0})]
    [0]
    >>> o.push({"run_id": "r", "seq": 2})
    []
    >>> [m["seq"] for m in o.push({"run_id": "r", "seq": 1})]
    [1, 2]
    """

    def __init__(self, max_held: int = 200) -> None:
        self.max_held = max_held
        self._next: dict[tuple[str, int, int], int] = {}
        self._held: dict[tuple[str, int, int], dict[int, dict[str, Any]]] = {}
        self.skipped = 0

    def push(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        stream = stream_of(message)
        expected = self._next.get(stream, 0)
        seq = message["seq"]
        if seq < expected:
            return []  # already released (a duplicate the consumer did not see as one)
        held = self._held.setdefault(stream, {})
        held[seq] = message
        if expected not in held and len(held) > self.max_held:
            gap_end = min(held)
            log.warning(
                "foreshock: run %s rank %s: seqs %d..%d never arrived; skipping",
                stream[0],
                stream[1],
                expected,
                gap_end - 1,
            )
            self.skipped += gap_end - expected
            expected = gap_end
        ready = []
        while expected in held:
            ready.append(held.pop(expected))
            expected += 1
        self._next[stream] = expected
        return ready
