"""What the sink knows it already stored: the dedup state, read back from the store.

Why read back and not remember: a partition's owner changes (a restart, a rebalance, a
SIGKILL between two tables' commits, a replay from offset 0 after Tansu forgot the offsets),
and only the store knows what the previous owner wrote. So on every assignment the new owner
reads the streams' stored seqs, the stored warning and dead-letter keys, and the values whose
step row a crashed writer never committed (see "Exactly once" in :mod:`.sink`).
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.consumer import Deduplicator

from . import stream_queries
from .location import StoreLocation
from .reader import open_history

__all__ = ["StoredState"]


class StoredState:
    """``seen``: event keys stored (warnings ``("w", …)``, dead letters ``("d", …)``);
    ``values``: (run, rank, attempt, step) whose values are stored without their step row."""

    def __init__(self) -> None:
        self.seen: set[tuple] = set()
        self.values: set[tuple[str, int, int, int]] = set()

    def read_back(self, location: StoreLocation, duplicates: int) -> Deduplicator:
        """Rebuild the state from the store; the metrics' dedup (by stream seq) is returned,
        carrying on the ``duplicates`` count of the one it replaces."""
        dedup, seen = Deduplicator(), set()
        with open_history(location) as history:
            for s in stream_queries.stored_streams(history):
                key = (s["run_id"], s["rank"], s["attempt"])
                if s["n"] == s["top"] + 1:
                    dedup.seed_prefix(key, s["n"])
                else:
                    dedup.seed(key, stream_queries.stream_seqs(history, *key))
            seen.update(stream_queries.stored_event_keys(history))
            orphans = set(stream_queries.orphan_values(history))
        dedup.duplicates = duplicates
        self.seen, self.values = seen, orphans
        return dedup

    def has_values(self, message: dict[str, Any]) -> bool:
        """Are this record's values already stored (a writer died before its step row)?"""
        if not self.values:
            return False
        try:
            key = (
                message.get("run_id"),
                message.get("rank") or 0,
                message.get("attempt") or 0,
                message.get("step"),
            )
            return key in self.values
        except TypeError:  # an unhashable field: the builder rejects the record anyway
            return False
