"""Local copies of a remote store's Parquet files, so a page reads them at local speed.

Why: a remote table can only be scanned through delta-rs's Arrow dataset (DuckDB's own
object-store extension cannot be assumed), and Arrow's scanner decodes what DuckDB's Parquet
reader skips: a run page over a remote store took several times the local time (``python -m
benchmarks.storage``, ``pyarrow_dataset`` against ``read_parquet``) even with every filter
handed to the scan. A Delta data file is immutable — a version adds and removes files, never
rewrites one — so a copy, once downloaded, is valid for as long as the file exists: a reader
downloads what is new since it last looked (a sink's batch, a compaction's output) and reads
everything else from its own disk.

The cache is a folder (``$FORESHOCK_READ_CACHE``, default ``~/.cache/foreshock/store-files``;
``off`` turns it off) bounded by ``$FORESHOCK_READ_CACHE_GB`` (default 4): the files read
least recently go first. A table larger than the bound is read through the Arrow dataset, as
before. Downloads go to a temporary name and are renamed into place, so a reader never sees
half a file and several readers (dashboard sessions, processes) can share one folder.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> cache = FileCache(folder, max_bytes=10)
>>> cache.fits([4, 5]), cache.fits([6, 5])
(True, False)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["FileCache", "default_cache"]

DEFAULT_GB = 4.0
_CHUNK = 8 * 2**20  # bytes per read while copying a file down


class FileCache:
    """Copies of remote files under ``folder``, at most ``max_bytes`` in all."""

    def __init__(self, folder: str | Path, max_bytes: int) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.downloads = 0  # files copied down by this object (tests, benchmarks)

    def fits(self, sizes: list[int]) -> bool:
        """Would files of these sizes (bytes) fit at once?"""
        return sum(sizes) <= self.max_bytes

    def local_paths(self, table: Any, table_uri: str, options: dict[str, str]) -> list[str]:
        """Local copies of every data file of ``table`` (a pinned ``DeltaTable``) at its
        version, downloading the missing ones; raises :class:`OSError` when they do not fit."""
        actions = table.get_add_actions(flatten=True)
        paths = [str(p) for p in actions.column("path").to_pylist()]
        sizes = [int(s) for s in actions.column("size_bytes").to_pylist()]
        if not self.fits(sizes):
            raise OSError(f"{sum(sizes)} bytes do not fit the read cache ({self.max_bytes})")
        home = self.folder / hashlib.sha256(table_uri.encode()).hexdigest()[:16]
        local = [home / path for path in paths]
        missing = [(p, path) for p, path in zip(local, paths, strict=True) if not p.exists()]
        if missing:
            from deltalake.fs import DeltaStorageHandler

            handler = DeltaStorageHandler(table_uri, options or None)
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda m: self._download(handler, *m), missing))
        for p in local:
            with contextlib.suppress(OSError):
                os.utime(p)  # read now: last to be evicted
        if missing:  # only a download grows the folder
            self._evict(keep=set(local))
        return [str(p) for p in local]

    def _download(self, handler: Any, local: Path, path: str) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(f".{local.name}.{os.getpid()}.part")
        source = handler.open_input_file(path)
        try:
            with part.open("wb") as out:
                while chunk := source.read(_CHUNK):
                    out.write(chunk)
            os.replace(part, local)
        finally:
            source.close()
            part.unlink(missing_ok=True)
        self.downloads += 1

    def _evict(self, keep: set[Path]) -> None:
        """Remove the least recently read files until the folder fits ``max_bytes``."""
        files = []
        for p in self.folder.rglob("*.parquet"):
            with contextlib.suppress(OSError):
                stat = p.stat()
                files.append((stat.st_mtime, stat.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                return
            if p not in keep:
                p.unlink(missing_ok=True)
                total -= size


def _default_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "foreshock" / "store-files"


def default_cache() -> FileCache | None:
    """The cache the environment asks for (see the module docstring); None when ``off``."""
    asked = os.environ.get("FORESHOCK_READ_CACHE", "")
    if asked.lower() == "off":
        return None
    folder = Path(asked) if asked else _default_folder()
    gigabytes = float(os.environ.get("FORESHOCK_READ_CACHE_GB", DEFAULT_GB))
    return FileCache(folder, int(gigabytes * 2**30))
