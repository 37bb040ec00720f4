"""A folder of small files beside a store's tables, wherever the store is: ``<store>/<name>/``.

Why: what a store's detectors run with (the detector-config registry, the profiles users
publish) belongs beside the history it was chosen from — on object storage too. The registry
used to take the store's URI as a local path: ``foreshock tune --store s3://…`` could not
publish, and a detector started with ``--store s3://…`` silently found no live config.

A local folder is written as before: a file is replaced atomically (temporary name, fsync,
``os.replace``), appended to in place, and a lock (``fcntl``) serialises read-modify-writes.
On object storage (through delta-rs's object store, with the store's options) a file is one
object, and a PUT replaces it whole, so a reader sees the old file or the new one, never half;
an append rewrites the object; and there is no lock: one publisher at a time per store (what
``foreshock tune`` and its rollbacks are — a person's command).

>>> import tempfile
>>> files = StoreFiles(tempfile.mkdtemp(), "notes")
>>> files.exists(), files.read_text("a.txt")
(False, None)
>>> files.write_text("a.txt", "one"); files.append_line("log", "x"); files.append_line("log", "y")
>>> files.read_text("a.txt"), files.read_text("log"), files.names()
('one', 'x\\ny\\n', ['a.txt', 'log'])
>>> files.child("sub").names()
[]
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .location import StoreLocation, load_location

__all__ = ["StoreFiles"]


class StoreFiles:
    """The files of ``<store>/<folder>``; local or remote as the store is."""

    def __init__(self, store: StoreLocation | str | Path | None, folder: str) -> None:
        self.location = load_location(str(store) if isinstance(store, Path) else store)
        self.folder = folder
        self.uri = self.location.table_uri(folder)
        self.path = Path(self.uri) if self.location.is_local else None
        self._fs: Any = None  # the remote folder's handler, made when first used

    def __str__(self) -> str:
        return self.uri

    def child(self, name: str) -> StoreFiles:
        return StoreFiles(self.location, f"{self.folder}/{name}")

    def exists(self) -> bool:
        """Has anything been written here?"""
        return bool(self.names()) if self.path is None else self.path.is_dir()

    def names(self) -> list[str]:
        """The files directly in the folder, sorted (none: ``[]``)."""
        if self.path is not None:
            if not self.path.is_dir():
                return []
            return sorted(p.name for p in self.path.iterdir() if p.is_file())
        from pyarrow.fs import FileSelector, FileType

        found = self._remote().get_file_info_selector(FileSelector("", allow_not_found=True))
        return sorted(info.path.rsplit("/", 1)[-1] for info in found if info.type == FileType.File)

    def read_text(self, name: str) -> str | None:
        """The file's text, or None when there is no such file."""
        data = self.read_bytes(name)
        return None if data is None else data.decode()

    def read_bytes(self, name: str) -> bytes | None:
        if self.path is not None:
            path = self.path / name
            return path.read_bytes() if path.is_file() else None
        from pyarrow.fs import FileType

        if self._remote().get_file_info([name])[0].type != FileType.File:  # one HEAD, no LIST
            return None
        source = self._remote().open_input_file(name)
        try:
            return bytes(source.read())
        finally:
            source.close()

    def move(self, name: str, to: StoreFiles) -> None:
        """Move file ``name`` into the folder ``to`` (on object storage: copy, then delete)."""
        if self.path is not None and to.path is not None:
            to.path.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.path / name), to.path / name)
            return
        data = self.read_bytes(name)
        if data is None:
            raise FileNotFoundError(f"{self}/{name}")
        to.write_bytes(name, data)
        self.delete(name)

    def delete(self, name: str) -> None:
        if self.path is not None:
            (self.path / name).unlink(missing_ok=True)
        else:
            self._remote().delete_file(name)

    def write_text(self, name: str, text: str) -> None:
        """Replace the file whole: a reader sees the old text or the new, never part."""
        self.write_bytes(name, text.encode())

    def write_bytes(self, name: str, data: bytes) -> None:
        if self.path is None:
            # one PUT, at close. delta-rs wraps its stream in pyarrow's PythonFile, whose
            # write hands the Rust side a Buffer it refuses: write to the stream itself
            handler = self._remote()
            raw = getattr(handler, "_handler", None)
            sink = raw.open_output_stream(name, None) if raw else handler.open_output_stream(name)
            try:
                sink.write(data)
            finally:
                sink.close()
            return
        self.path.mkdir(parents=True, exist_ok=True)
        path = self.path / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        with tmp.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def append_line(self, name: str, line: str) -> None:
        if self.path is None:
            self.write_text(name, (self.read_text(name) or "") + line + "\n")
            return
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / name).open("a") as file:
            file.write(line + "\n")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One read-modify-write at a time, on a local folder (see the module docstring)."""
        if self.path is None:
            yield
            return
        import fcntl

        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _remote(self) -> Any:
        """delta-rs's handler of the folder (its object store, with the store's options)."""
        if self._fs is None:
            from deltalake.fs import DeltaStorageHandler

            self._fs = DeltaStorageHandler(self.uri, self.location.options or None)
        return self._fs
