"""A local spool for messages the broker has not acknowledged: nothing is lost while it is down.

One append-only JSON Lines file per producer (``<spool_dir>/<name>.spool``), held under an
exclusive ``flock`` while its producer lives, and a cursor file (``.cursor``) with the byte
offset up to which the broker has acknowledged the messages. Draining re-sends from the cursor
in order; the cursor moves only after the broker acknowledged a whole batch, so a crash in
between re-sends (consumers drop duplicates on (run, rank, seq)) but never skips. A fully
drained spool is deleted. Torch-free: ``foreshock spool flush`` drains it from any process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

__all__ = ["Spool", "SpooledMessage", "orphaned_spools"]


class SpooledMessage(NamedTuple):
    topic: str
    key: bytes
    value: bytes


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

    def _open_locked(self) -> BinaryIO:
        """Open (or create) the spool holding its lock; BlockingIOError if another owns it.

        A new spool is created and locked under a hidden name and then renamed into place, so
        that a producer scanning the folder for orphans never locks a spool being born.
        """
        if self.path.exists():
            file = self.path.open("a+b")
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                raise
            return file
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        file = tmp.open("a+b")
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(tmp, self.path)
        return file

    @classmethod
    def try_open(cls, path: Path) -> Spool | None:
        """Open an existing spool file unless a live producer holds it."""
        try:
            return cls(path.parent, path.name.removesuffix(".spool"))
        except BlockingIOError:
            return None

    def append(self, message: SpooledMessage) -> None:
        line = json.dumps({"t": message.topic, "k": message.key.decode("utf-8", "replace"),
                           "v": message.value.decode()}, separators=(",", ":"))  # fmt: skip
        self._file.write(line.encode() + b"\n")
        self._file.flush()
        self.appended += 1

    def cursor(self) -> int:
        try:
            return int(self.cursor_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

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
        """The broker acknowledged everything before ``offset``; a drained spool is emptied."""
        if offset >= self.path.stat().st_size:
            self._file.truncate(0)
            self.cursor_path.unlink(missing_ok=True)
            return
        tmp = self.cursor_path.with_suffix(".cursor.tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self.cursor_path)

    def close(self, delete_if_empty: bool = True) -> None:
        if self._file.closed:
            return
        if delete_if_empty and self.pending_bytes() == 0:
            self.path.unlink(missing_ok=True)
            self.cursor_path.unlink(missing_ok=True)
        self._file.close()  # releases the lock


def orphaned_spools(directory: str | Path) -> Iterator[Spool]:
    """Spools in ``directory`` that no live producer holds (left by a finished or dead run)."""
    root = Path(directory)
    if not root.is_dir():
        return
    for path in sorted(root.glob("*.spool")):
        spool = Spool.try_open(path)
        if spool is not None:
            yield spool
