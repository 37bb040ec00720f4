"""Put each stream's messages back in seq order before the detectors see them.

A message re-sent from a producer's spool can arrive after newer ones; detectors are
sequential, so each (run_id, rank, attempt) stream is released in seq order. A gap that does
not fill within ``max_held`` held messages is skipped (logged): a lost message must not stall
a run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from foreshock.transport.wire import stream_of

__all__ = ["SeqOrderer"]

log = logging.getLogger(__name__)

Item = TypeVar("Item")


def _itself(item: Any) -> dict[str, Any]:
    return item


class SeqOrderer(Generic[Item]):
    """``push(item)`` returns the items now ready, in seq order. An item is a message, or
    anything ``message_of`` reads one from (a consumed envelope).

    >>> o = SeqOrderer()
    >>> [m["seq"] for m in o.push({"run_id": "r", "seq": 0})]
    [0]
    >>> o.push({"run_id": "r", "seq": 2})
    []
    >>> [m["seq"] for m in o.push({"run_id": "r", "seq": 1})]
    [1, 2]
    """

    def __init__(
        self, max_held: int = 200, message_of: Callable[[Item], dict[str, Any]] = _itself
    ) -> None:
        self.max_held, self.message_of = max_held, message_of
        self._next: dict[tuple[str, int, int], int] = {}
        self._held: dict[tuple[str, int, int], dict[int, Item]] = {}
        self.skipped = 0

    def push(self, item: Item) -> list[Item]:
        message = self.message_of(item)
        stream = stream_of(message)
        expected = self._next.get(stream, 0)
        seq = message["seq"]
        if seq < expected:
            return []  # already released (a duplicate the consumer did not see as one)
        held = self._held.setdefault(stream, {})
        held[seq] = item
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
