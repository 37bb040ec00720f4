"""Where a consumer service stands: a replay cursor and a flush-then-commit checkpoint.

The consumer services (``foreshock detect``, ``notify``, ``sink``) all commit offsets the same
way, and two of them rebuild their state the same way; this module is that one way.

:class:`ReplayCursor` — the detector worker and the notifier rebuild their state by reading
each assigned partition from its beginning: messages before the committed offset are
*history* (they update state; their effects went out before), the rest are new. The replay
mark of a partition is cleared as soon as the consumer reaches *or passes* the committed
offset: retention (or compaction) may have removed the message just before it, and a mark
cleared only on that exact offset would keep the partition in replay for ever.

:class:`Checkpoint` — the model is quix-streams' ``checkpointing/checkpoint.py``. A commit is
two numbered steps, and the second runs only when the first succeeded:

1. **Flush** what the consumed messages produced (the producer's queue acknowledged, the batch
   written to the store, the receivers settled): ``flush()`` returns True once it is durable.
2. **Commit** the offsets (the consumer's position, or the explicit ``offsets()``).

Nothing is committed that was not flushed — at shutdown either: the next member re-reads it
(delivery is at least once; the services drop the repeats). A failed commit is logged at
WARNING and the next checkpoint tries again (positions only move forward); an exception from
``flush`` propagates, since what it failed to make durable must not be committed past.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Checkpoint", "ReplayCursor"]

log = logging.getLogger(__name__)


class ReplayCursor:
    """Per partition, the committed offset found at assignment, until the replay reaches it.

    >>> cursor = ReplayCursor()
    >>> cursor.resume_at([(0, 5), (1, 0)])
    >>> [cursor.history(0, o) for o in (0, 1, 4)], cursor.replaying
    ([True, True, True], False)
    >>> cursor.resume_at([(0, 5)])
    >>> cursor.history(0, 7), cursor.replaying  # offset 4 was removed: passing 5 ends it too
    (False, False)
    """

    def __init__(self) -> None:
        self._resume: dict[int, int] = {}  # partition -> committed offset, while replaying

    @property
    def replaying(self) -> bool:
        """True while some partition has not yet reached its committed offset."""
        return bool(self._resume)

    def resume_at(self, found: Iterable[tuple[int, int]], forget: bool = False) -> None:
        """Replay each (partition, committed offset) up to that offset (none below 1).
        ``forget``: drop the marks of the other partitions (a new assignment)."""
        if forget:
            self._resume.clear()
        for partition, offset in found:
            if offset > 0:
                self._resume[partition] = offset
            else:
                self._resume.pop(partition, None)

    def history(self, partition: int, offset: int) -> bool:
        """Is this message history (below the committed offset)? Reaching the offset before
        the mark — or passing it — ends that partition's replay."""
        resume = self._resume.get(partition, 0)
        if resume and offset >= resume - 1:
            del self._resume[partition]
        return offset < resume

    def replay_from_start(self, consumer: Any, partitions: list[Any]) -> list[Any]:
        """An ``on_assign`` step: remember each partition's committed offset, then read it from
        its beginning. Returns the committed positions found (negative: none)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        committed = consumer.committed(partitions, timeout=10)
        found = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in committed]
        self.resume_at(((tp.partition, tp.offset) for tp in committed), forget=True)
        for tp in committed:
            tp.offset = OFFSET_BEGINNING
        consumer.assign(committed)
        return found


class Checkpoint:
    """Flush, then commit (steps 1 and 2 above) for one consumer of ``service``.

    ``flush()``: step 1, True once what was produced is durable.

    >>> class Consumer:
    ...     def commit(self, offsets=None):
    ...         print("commit", offsets)
    ...         return True
    >>> Checkpoint(Consumer(), "demo", flush=lambda: True).commit()
    commit None
    True
    >>> Checkpoint(Consumer(), "demo", flush=lambda: False).commit()  # not flushed: no commit
    False
    """

    def __init__(
        self,
        consumer: Any,
        service: str,
        flush: Callable[[], bool] = lambda: True,
    ) -> None:
        self.consumer, self.service, self._flush = consumer, service, flush
        self.unflushed = 0  # checkpoints that stopped at step 1
        self.failures = 0  # commits the consumer refused (step 2)

    def commit(self, offsets: list[Any] | None = None, final: bool = False) -> bool:
        """Steps 1 and 2; True if offsets were committed. ``offsets``: the positions to commit
        (default: the consumer's own; an empty list: nothing moved). ``final``: at shutdown."""
        if not self._flush():  # 1. flush
            self.unflushed += 1
            if final:
                log.warning(
                    "foreshock %s: outputs not flushed at shutdown; their offsets stay "
                    "uncommitted (the next member reads them again)",
                    self.service,
                )
            return False
        if offsets is not None and not offsets:
            return False  # nothing moved
        if not self.consumer.commit(offsets):  # 2. commit (it logs why not)
            self.failures += 1
            return False
        return True
