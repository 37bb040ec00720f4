"""A local spool for messages the broker has not acknowledged: nothing is lost while it is down.

One append-only JSON Lines file per producer (``<spool_dir>/<name>.spool``), held under an
exclusive ``flock`` while its producer lives, and a cursor file (``.cursor``) with the byte
offset up to which the broker has acknowledged the messages. Draining re-sends from the cursor
in order; the cursor moves only after the broker acknowledged a whole batch, so a crash in
between re-sends (consumers drop duplicates on (run, rank, seq)) but never skips. A fully
drained spool is deleted. Torch-free: ``foreshock spool flush`` drains it from any process.

A spool must survive its disk. An append that fails (``ENOSPC``, ``EIO``) is cut back off the
file, so no torn line is left for the next append to glue onto, and raises for the producer
to fall back to a :class:`MemorySpool`. :meth:`Spool.sync` fsyncs what was appended (the
producer calls it once per turn of its loop: one fsync costs ~3 ms here, one per message would
cap spooling at a few hundred messages a second). A cursor that cannot be written is kept in
memory: the worst case is a re-send, never a skip.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

__all__ = [
    "MemorySpool",
    "Spool",
    "SpooledMessage",
    "is_lifecycle",
    "orphaned_spools",
    "spool_line",
    "write_all",
]

log = logging.getLogger(__name__)


class SpooledMessage(NamedTuple):
    topic: str
    key: bytes
    value: bytes


def is_lifecycle(message: SpooledMessage) -> bool:
    """A run's ``start``, ``end`` or ``action`` (small; what proves a run ended, what resolves
    a warning), judged without decoding: a full memory buffer still keeps these.

    >>> is_lifecycle(SpooledMessage("t", b"r", b'{"schema":"foreshock.run/1","kind":"end"}'))
    True
    """
    return len(message.value) < 65_536 and b'"schema":"foreshock.run/1"' in message.value


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a full disk may take part of it, then raise)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Spool:
    """An owned spool file.

    >>> import tempfile
    >>> spool = Spool(tempfile.mkdtemp(), "run-a")
    >>> spool.append(SpooledMessage("t", b"run-a", b'{"seq":0}'))
    >>> batch, end = spool.read_batch(10)
    >>> [m.value for m in batch], spool.pending_bytes() > 0
    ([b'{"seq":0}'], True)
    >>> spool.commit(end); spool.pending_bytes()
    0
    """

    def __init__(self, directory: str | Path, name: str) -> None:
        self.path = Path(directory) / f"{name}.spool"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cursor_path = self.path.with_suffix(".cursor")
        self._file = self._open_locked()
        self.appended = 0
        self._dirty = False
        self._cursor = 0  # the last committed offset, for when the cursor file can't be written

    def _open_locked(self) -> BinaryIO:
        """Open (or create) the spool holding its lock; BlockingIOError if another owns it.

        A new spool is created and locked under a hidden name and then renamed into place, so
        that a producer scanning the folder for orphans never locks a spool being born.
        Unbuffered: an append that failed leaves nothing in a buffer for ``close`` to retry.
        """
        if self.path.exists():
            file = self.path.open("a+b", buffering=0)
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                raise
            return file
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        file = tmp.open("a+b", buffering=0)
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(tmp, self.path)
        _sync_dir(self.path.parent)
        return file

    @classmethod
    def try_open(cls, path: Path) -> Spool | None:
        """Open an existing spool file unless a live producer holds it (or it can't be
        opened for writing: then it is left for a process that can, and said so)."""
        try:
            return cls(path.parent, path.name.removesuffix(".spool"))
        except BlockingIOError:
            return None
        except OSError as exc:
            log.warning("foreshock: cannot open spool %s (%s); it is left where it is", path, exc)
            return None

    def append(self, message: SpooledMessage) -> None:
        self.append_many([message])

    def append_many(self, messages: Iterable[SpooledMessage]) -> None:
        """Append in one write; on failure the file is cut back to where it was, and it raises."""
        data = b"".join(spool_line(m) for m in messages)
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # frees space, never needs any
            raise
        self.appended += data.count(b"\n")
        self._dirty = True

    def sync(self) -> None:
        """fsync what was appended since the last sync (a no-op when nothing was)."""
        if self._dirty and not self._file.closed:
            os.fsync(self._file.fileno())
            self._dirty = False

    def cursor(self) -> int:
        try:
            return max(int(self.cursor_path.read_text() or 0), self._cursor)
        except (FileNotFoundError, ValueError):
            return self._cursor

    def pending_bytes(self) -> int:
        try:
            return max(0, self.path.stat().st_size - self.cursor())
        except FileNotFoundError:  # closed and deleted: nothing pending
            return 0

    def read_batch(self, max_messages: int) -> tuple[list[SpooledMessage], int]:
        """Up to ``max_messages`` messages after the cursor, and the offset after them."""
        batch: list[SpooledMessage] = []
        with self.path.open("rb") as file:
            file.seek(self.cursor())
            offset = file.tell()
            for line in file:
                if not line.endswith(b"\n"):
                    break  # a torn last line (crash while appending): not yet complete
                offset += len(line)
                with contextlib.suppress(ValueError, KeyError):
                    item = json.loads(line)
                    batch.append(SpooledMessage(item["t"], item["k"].encode(), item["v"].encode()))
                if len(batch) >= max_messages:
                    break
        return batch, offset

    def commit(self, offset: int) -> None:
        """The broker acknowledged everything before ``offset``; a drained spool is emptied.
        A cursor file that can't be written (full disk) is kept in memory instead."""
        if offset >= self.path.stat().st_size:
            self._file.truncate(0)
            self._cursor = 0
            self.cursor_path.unlink(missing_ok=True)
            return
        self._cursor = offset
        tmp = self.cursor_path.with_suffix(".cursor.tmp")
        try:
            tmp.write_text(str(offset))
            os.replace(tmp, self.cursor_path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning(
                "foreshock: cannot write %s (%s); the cursor is kept in memory",
                self.cursor_path,
                exc,
            )

    def close(self, delete_if_empty: bool = True) -> None:
        if self._file.closed:
            return
        try:
            self.sync()
            pending = self.pending_bytes()
            if delete_if_empty and pending == 0:
                self.path.unlink(missing_ok=True)
                self.cursor_path.unlink(missing_ok=True)
            elif pending and self._cursor > 0:  # kept in memory: one more try to write it down
                self.commit(self._cursor)
        finally:
            self._file.close()  # releases the lock


class MemorySpool:
    """A bounded in-memory spool, for a producer whose spool file can't be written: the same
    reading interface as :class:`Spool` (offsets are message counts). Lost if the process ends
    before the broker takes it.

    >>> memory = MemorySpool(max_bytes=20)
    >>> memory.append(SpooledMessage("t", b"r", b"0123456789")), memory.append(
    ...     SpooledMessage("t", b"r", b"0123456789ab"))
    (True, False)
    >>> batch, end = memory.read_batch(10); memory.commit(end); memory.pending_bytes()
    0
    """

    path = "memory"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.size, self.appended = max_bytes, 0, 0
        self.items: collections.deque[SpooledMessage] = collections.deque()

    def append(self, message: SpooledMessage, force: bool = False) -> bool:
        """Keep ``message`` unless that would pass ``max_bytes`` (``force``: keep it anyway)."""
        if not force and self.size + len(message.value) > self.max_bytes:
            return False
        self.items.append(message)
        self.size += len(message.value)
        self.appended += 1
        return True

    def read_batch(self, max_messages: int) -> tuple[list[SpooledMessage], int]:
        batch = [self.items[i] for i in range(min(max_messages, len(self.items)))]
        return batch, len(batch)

    def commit(self, count: int) -> None:
        for _ in range(count):
            self.size -= len(self.items.popleft().value)

    def take(self) -> list[SpooledMessage]:
        items, self.items, self.size = list(self.items), collections.deque(), 0
        return items

    def pending_bytes(self) -> int:
        return self.size

    def sync(self) -> None:
        pass

    def close(self, delete_if_empty: bool = True) -> None:
        pass


def spool_line(message: SpooledMessage) -> bytes:
    """One message as a spool file holds it (a JSON line)."""
    line = {
        "t": message.topic,
        "k": message.key.decode("utf-8", "replace"),
        "v": message.value.decode(),
    }
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _sync_dir(directory: Path) -> None:
    """fsync a folder, so that a file just renamed into it survives a crash (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def orphaned_spools(directory: str | Path) -> Iterator[Spool]:
    """Spools in ``directory`` that no live producer holds (left by a finished or dead run)."""
    root = Path(directory)
    if not root.is_dir():
        return
    for path in sorted(root.glob("*.spool")):
        spool = Spool.try_open(path)
        if spool is not None:
            yield spool
