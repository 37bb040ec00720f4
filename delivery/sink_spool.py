"""The Kafka sink's spool: a file, or memory when the file can't be written, and the orphans.

Why: a message the broker has not acknowledged must outlive the broker's absence, and the
process too where a disk allows. So the sink appends it to its spool file
(:class:`~foreshock.delivery.spool.Spool`); when that file can't be written (an unwritable
folder, a full disk) to a bounded in-memory buffer (:class:`~foreshock.delivery.spool.
MemorySpool`), loudly; beyond that a message is dropped and counted, except a run's ``start``
and ``end``. Spools left by earlier producers in the same folder (*orphans*) are adopted and
re-sent first. The file holds older messages than memory, so it is drained first; once memory
holds anything, new messages go behind it, never around it. One lock guards every spool: the
training thread spools when its queue is full, the sending thread drains and spools.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from .rejects import Rejects, size_text
from .spool import MemorySpool, Spool, SpooledMessage, is_lifecycle, orphaned_spools

__all__ = ["SinkSpool"]

log = logging.getLogger("foreshock.delivery.kafka_sink")


class SinkSpool:
    """One producer's spool file (or memory) and the orphaned spools it adopted.

    Counters: ``spooled`` (messages spooled), ``spool_error`` (why the file is not being
    written, or None).
    """

    def __init__(self, folder: str, name: str, memory_bytes: int, rejects: Rejects) -> None:
        self.folder = folder
        self.lock = threading.Lock()
        self.spooled = 0
        self.spool_error: str | None = None
        self.memory = MemorySpool(memory_bytes)
        self._rejects = rejects
        self.file = self._open(name)
        self.others = self._adopt_orphans()  # earlier runs' leftovers

    def _open(self, name: str) -> Spool | None:
        """This producer's spool file, or None (and memory instead) if it can't be written."""
        try:
            return Spool(self.folder, name)
        except OSError as exc:
            self.spool_error = str(exc)
            log.error(
                "foreshock: cannot write the spool folder %s (%s): messages the broker "
                "has not taken are kept in memory (up to %s) and lost if this process "
                "ends before the broker takes them; set FORESHOCK_KAFKA_SPOOL_DIR to a "
                "writable folder",
                self.folder,
                exc,
                size_text(self.memory.max_bytes),
            )
            return None

    def _adopt_orphans(self) -> list[Spool]:
        try:
            return list(orphaned_spools(self.folder))
        except OSError as exc:
            log.warning(
                "foreshock: cannot read the spool folder %s (%s); earlier runs' spools "
                "there are not re-sent",
                self.folder,
                exc,
            )
            return []

    @property
    def path(self) -> str:
        return str(self.file.path) if self.file is not None else "memory (no spool file)"

    def own(self) -> list[Spool | MemorySpool]:
        """This sink's spools in the order they are drained: the file holds older messages."""
        return [self.file, self.memory] if self.file is not None else [self.memory]

    def drain_order(self) -> list[Spool | MemorySpool]:
        """Every spool to re-send, oldest first: the orphans, then this sink's own."""
        return [*self.others, *self.own()]

    def pending(self) -> int:
        """Bytes waiting here and in the orphans."""
        with self.lock:
            return sum(s.pending_bytes() for s in self.drain_order())

    def own_pending(self) -> int:
        with self.lock:
            return sum(s.pending_bytes() for s in self.own())

    def put(self, items: list[SpooledMessage]) -> None:
        """Spool ``items`` in order: to the file while it takes them and memory is empty, else
        to memory; a message neither can hold is dropped. Never raises."""
        with self.lock:
            if not self.memory.items and self.file is not None and self._append(items):
                return
            for item in items:
                if self.memory.append(item, force=is_lifecycle(item)):
                    self.spooled += 1
                else:
                    self._rejects.drop(
                        item, "spool unwritable, memory buffer full", self.memory.max_bytes
                    )

    def _append(self, items: list[SpooledMessage]) -> bool:
        """Append to the file (the caller holds the lock); False, logged once, if it fails."""
        assert self.file is not None
        try:
            self.file.append_many(items)
        except Exception as exc:  # ENOSPC, EIO, EACCES; a value that is no UTF-8
            if self.spool_error is None:
                log.error(
                    "foreshock: cannot write the spool %s (%s): messages the broker has "
                    "not taken are kept in memory (up to %s) and lost if this process "
                    "ends before the broker takes them; free space there or set "
                    "FORESHOCK_KAFKA_SPOOL_DIR",
                    self.file.path,
                    exc,
                    size_text(self.memory.max_bytes),
                )
            self.spool_error = str(exc)
            return False
        if self.spool_error is not None:
            log.warning("foreshock: the spool %s is written again", self.file.path)
            self.spool_error = None
        self.spooled += len(items)
        return True

    def sync(self) -> None:
        """fsync the file; an OSError is counted (the sending thread goes on)."""
        with self.lock:
            if self.file is not None:
                try:
                    self.file.sync()
                except OSError as exc:
                    self._rejects.error(f"spool fsync ({exc})", exc)

    def release_others(self, only_empty: bool) -> None:
        """Close adopted spools (only the emptied ones with ``only_empty``): a later flush, or
        another sink in this process, must be able to take what is left in them."""
        kept = []
        for spool in self.others:
            if only_empty and spool.pending_bytes():
                kept.append(spool)
            elif only_empty:
                spool.close()
            else:
                with contextlib.suppress(Exception):
                    spool.close()
        self.others = kept

    def close(self) -> None:
        """Move what only memory holds to the file if it can be written now (else it is
        dropped, and counted); fsync and release the file."""
        with self.lock:
            left = self.memory.take()
            if left and not (self.file is not None and self._append(left)):
                for item in left:
                    self._rejects.drop(
                        item, "unsent at close, spool unwritable", self.memory.max_bytes
                    )
            left_bytes = 0
            if self.file is not None:
                left_bytes = self.file.pending_bytes()
                self.file.close()
        if left_bytes:
            log.warning(
                "foreshock: %d bytes of undelivered messages are kept in %s; they are "
                "re-sent by the next run or `foreshock spool flush`",
                left_bytes,
                self.path,
            )
