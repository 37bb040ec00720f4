"""The sink's counts: what it stored and what it refused, for its telemetry and its exit line.

One dataclass rather than a dict of names: a miscounted key is an AttributeError at once, not
a new zero-valued entry that no dashboard reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from foreshock.transport.service_loop import ServiceStats

__all__ = ["SinkStats"]


@dataclass
class SinkStats(ServiceStats):
    """Counts since the sink started (messages, values and batches stored; the rest, events)."""

    messages: int = 0  # metrics, lifecycle and warning messages added to a batch
    values: int = 0  # metric values written
    batches: int = 0  # batches handed to the store
    dead_letters: int = 0  # dead-letter rows added (consumed dead letters and rejects)
    duplicates: int = 0  # warnings and rejects already stored (dropped)
    write_retries: int = 0  # writes of held tables that failed
    read_backs: int = 0  # times the dedup state was read back from the store
    read_back_retries: int = 0  # read-backs that failed and were retried
    collisions: int = 0  # records of a second job under a run id
