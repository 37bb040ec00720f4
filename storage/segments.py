"""The store on disk: immutable Parquet segments and a manifest, one writer, many readers.

DuckDB lets one process write a database file or many read it, never both at once — but the
dashboard and the CLI must read history while the sink writes. So the sink never holds a
database open: it writes each batch as new, immutable Parquet files and then publishes them by
replacing one small manifest; readers open a private in-memory DuckDB over the files the
manifest lists (:mod:`foreshock.storage.reader`). A reader sees whole batches or nothing:

1. each table's rows of a batch go to ``data/<table>/<generation>-<id>.parquet`` — written
   under a hidden temporary name, fsynced, then renamed into place (atomic on POSIX);
2. the manifest (``manifest.json``: schema version, generation, the live files of every
   table) is written the same way: temporary name, fsync, rename, fsync of the folder;
3. only then does the caller commit its Kafka offsets.

A crash between 1 and 2 leaves files no manifest names: the next writer deletes them, and the
uncommitted messages are delivered again. Compaction merges small segments of a table into one
sorted segment (size tiers: 8 files of a tier make one of the next), publishes the new list,
and deletes the merged files only ``grace`` seconds later, so a reader still working from the
previous manifest finds every file it was promised. The merge sorts in DuckDB with a memory
limit (``MERGE_MEMORY``), spilling to disk: a merge of tens of millions of rows costs the sink
no more memory than one of a few thousand (sorting in Arrow took ~180 B/row: 2.5 GB for a
tier-2 merge in the soak test).

One writer per store is enforced by an exclusive ``flock`` on ``writer.lock``; a second sink
(or ``foreshock store prune`` while a sink runs) gets :class:`StoreLockedError`.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from .schema import SCHEMA_VERSION, TABLES

__all__ = ["MANIFEST", "SchemaVersionError", "SegmentStore", "StoreLockedError", "read_manifest"]

MANIFEST = "manifest.json"
TIER_ROWS = 100_000  # tier t holds segments of 100k·8^(t−1) … 100k·8^t rows
MERGE_AT = 8  # segments of one tier that are merged into one
MERGE_MEMORY = "256MB"  # DuckDB's memory limit for one merge; it spills the sort beyond it
ROW_GROUP = 128_000
SORT_KEYS: dict[str, list[str]] = {
    "metric_values": ["run_id", "metric", "module", "head", "step"],
    "steps": ["run_id", "rank", "step"],
    "run_events": ["run_id", "seq"],
    "warnings": ["run_id", "step", "id"],
    "dead_letters": ["received_at"],
}


class StoreLockedError(RuntimeError):
    """Another process is writing this store."""


class SchemaVersionError(RuntimeError):
    """The store's schema version is not the one this foreshock reads."""


def read_manifest(root: str | Path, any_version: bool = False) -> dict[str, Any]:
    """The published state of a store; an empty one where nothing was written yet."""
    path = Path(root) / MANIFEST
    if not path.exists():
        return _empty_manifest()
    manifest = json.loads(path.read_text())
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION and not any_version:
        raise SchemaVersionError(
            f"store {root} has schema version {version}; this foreshock reads "
            f"{SCHEMA_VERSION}: "
            + ("run `foreshock store migrate`" if version < SCHEMA_VERSION else "upgrade foreshock")
        )
    return manifest


def _empty_manifest() -> dict[str, Any]:
    return {"format": "foreshock-store", "schema_version": SCHEMA_VERSION, "generation": 0,
            "tables": {t: [] for t in TABLES}, "retired": []}  # fmt: skip


class SegmentStore:
    """The single writer of a store folder (created if missing)."""

    def __init__(self, root: str | Path, grace: float = 60.0, any_version: bool = False) -> None:
        self.root = Path(root)
        self.grace = grace
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.root / "writer.lock", "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreLockedError(
                f"store {self.root} is being written by another process (a running "
                "`foreshock sink`?); stop it first, or let it prune with --retention-days"
            ) from None
        self._lock_file.seek(0), self._lock_file.truncate(), self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()
        self._mutex = threading.Lock()
        self.manifest = read_manifest(self.root, any_version)
        for table in TABLES:
            self.manifest["tables"].setdefault(table, [])
            (self.root / "data" / table).mkdir(parents=True, exist_ok=True)
        self._delete_unpublished()

    def close(self) -> None:
        fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()

    def __enter__(self) -> SegmentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, batch: dict[str, pa.Table]) -> int:
        """Publish one batch (steps 1–2 above); returns the manifest generation."""
        with self._mutex:
            generation = self.manifest["generation"] + 1
            added = {t: self._write_segment(t, rows, generation)
                     for t, rows in batch.items() if rows.num_rows}  # fmt: skip
            if not added:
                return self.manifest["generation"]
            for table, entry in added.items():
                self.manifest["tables"][table].append(entry)
            self.manifest["generation"] = generation
            self._publish()
            return generation

    def files(self, table: str) -> list[Path]:
        return [self.root / e["file"] for e in self.manifest["tables"][table]]

    def _write_segment(self, table: str, rows: pa.Table, generation: int) -> dict[str, Any]:
        rows = rows.cast(TABLES[table])
        name = f"data/{table}/{generation:08d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.root / f"data/{table}/.tmp-{uuid.uuid4().hex}.parquet"
        meta = {b"foreshock.schema_version": str(SCHEMA_VERSION).encode()}
        pq.write_table(rows.replace_schema_metadata(meta), tmp, row_group_size=ROW_GROUP,
                       compression="zstd")  # fmt: skip
        _fsync(tmp)
        os.replace(tmp, self.root / name)
        return {"file": name, "rows": rows.num_rows}

    def _publish(self) -> None:
        tmp = self.root / f".{MANIFEST}.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps(self.manifest, indent=0))
        _fsync(tmp)
        os.replace(tmp, self.root / MANIFEST)
        _fsync(self.root)

    def _delete_unpublished(self) -> None:
        """Files of a batch whose manifest never went out (a crash between steps 1 and 2)."""
        live = {e["file"] for entries in self.manifest["tables"].values() for e in entries}
        live |= {f for f, _ in self.manifest["retired"]}
        for path in (self.root / "data").glob("*/*"):
            if str(path.relative_to(self.root)) not in live:
                path.unlink(missing_ok=True)

    def compact(self, tables: list[str] | None = None) -> int:
        """Merge each tier that has ``MERGE_AT`` segments; returns how many merges ran."""
        merges = 0
        for table in tables or list(TABLES):
            for group in self._mergeable(table):
                self.merge(table, group)
                merges += 1
        self.delete_retired()
        return merges

    def _mergeable(self, table: str) -> list[list[dict[str, Any]]]:
        tiers: dict[int, list[dict[str, Any]]] = {}
        for entry in self.manifest["tables"][table]:
            tier = 0 if entry["rows"] < TIER_ROWS else 1 + int(
                math.log(entry["rows"] / TIER_ROWS, MERGE_AT))  # fmt: skip
            tiers.setdefault(tier, []).append(entry)
        return [group for group in tiers.values() if len(group) >= MERGE_AT]

    def merge(self, table: str, entries: list[dict[str, Any]]) -> None:
        """Replace ``entries`` of ``table`` by one segment sorted on its keys, in bounded memory.

        DuckDB reads the segments and sorts them out of core under ``MERGE_MEMORY`` (one
        thread, temporary files in the store's ``.merge-tmp``); the result is published like
        :meth:`rewrite`'s. Should DuckDB write a schema other than the table's, the merge
        falls back to :meth:`rewrite` (in memory) rather than publish it.
        """
        tmp = self.root / f"data/{table}/.tmp-{uuid.uuid4().hex}.parquet"
        rows = _sorted_copy([str(self.root / e["file"]) for e in entries], tmp, table,
                            self.root / ".merge-tmp")  # fmt: skip
        if rows is None:
            tmp.unlink(missing_ok=True)
            self.rewrite(table, entries, lambda rows: rows)
            return
        _fsync(tmp)
        with self._mutex:
            generation = self.manifest["generation"] + 1
            name = f"data/{table}/{generation:08d}-{uuid.uuid4().hex[:8]}.parquet"
            os.replace(tmp, self.root / name)
            self._swap(table, entries, [{"file": name, "rows": rows}] if rows else [], generation)

    def _swap(self, table: str, gone_entries: list[dict[str, Any]], new: list[dict[str, Any]],
              generation: int) -> None:  # fmt: skip
        """Under the mutex: ``new`` replaces ``gone_entries`` in one published manifest."""
        gone = {e["file"] for e in gone_entries}
        kept = [e for e in self.manifest["tables"][table] if e["file"] not in gone]
        self.manifest["tables"][table] = kept + new
        self.manifest["retired"] += [[f, time.time()] for f in sorted(gone)]
        self.manifest["generation"] = generation
        self._publish()

    def rewrite(self, table: str, entries: list[dict[str, Any]],
                transform: Callable[[pa.Table], pa.Table]) -> None:  # fmt: skip
        """Replace ``entries`` of ``table`` by one sorted segment of ``transform(their rows)``.

        Reading and writing happen outside the mutex (batches keep flowing); the swap in the
        manifest is one atomic publish. The old files are retired, deleted after ``grace``.
        """
        rows = pa.concat_tables([pq.read_table(self.root / e["file"]) for e in entries])
        rows = transform(rows.replace_schema_metadata(None))
        if rows.num_rows:
            rows = rows.sort_by([(k, "ascending") for k in SORT_KEYS[table]])
        with self._mutex:
            generation = self.manifest["generation"] + 1
            new = [self._write_segment(table, rows, generation)] if rows.num_rows else []
            self._swap(table, entries, new, generation)

    def replace_all(self, transform: Callable[[str, pa.Table], pa.Table],
                    schema_version: int) -> None:  # fmt: skip
        """Rewrite every table through ``transform`` and publish them, with the new schema
        version, in one manifest: readers see the old store or the new one (migrations)."""
        with self._mutex:
            generation = self.manifest["generation"] + 1
            old = [e["file"] for entries in self.manifest["tables"].values() for e in entries]
            for table, entries in self.manifest["tables"].items():
                if not entries:
                    continue
                parts = [pq.read_table(self.root / e["file"]) for e in entries]
                rows = pa.concat_tables([p.replace_schema_metadata(None) for p in parts])
                rows = transform(table, rows)
                self.manifest["tables"][table] = [self._write_segment(table, rows, generation)]
            self.manifest["retired"] += [[f, time.time()] for f in old]
            self.manifest["generation"], self.manifest["schema_version"] = (
                generation,
                schema_version,
            )
            self._publish()

    def delete_retired(self, now: float | None = None) -> int:
        """Delete retired files older than ``grace`` seconds; returns how many."""
        now = time.time() if now is None else now
        with self._mutex:
            old = [(f, t) for f, t in self.manifest["retired"] if now - t >= self.grace]
            if not old:
                return 0
            self.manifest["retired"] = [r for r in self.manifest["retired"] if r not in old]
            self._publish()
        for f, _ in old:
            (self.root / f).unlink(missing_ok=True)
        return len(old)


def _sorted_copy(files: list[str], out: Path, table: str, spill: Path) -> int | None:
    """Write ``files``' rows sorted on ``table``'s keys to ``out``; the row count, or None
    if the written schema is not ``table``'s."""
    spill.mkdir(exist_ok=True)
    config = {"memory_limit": MERGE_MEMORY, "threads": 1, "temp_directory": str(spill),
              "preserve_insertion_order": False}  # fmt: skip
    keys = ", ".join(SORT_KEYS[table])
    meta = f"{{'foreshock.schema_version': '{SCHEMA_VERSION}'}}"
    with duckdb.connect(":memory:", config=config) as con:
        con.execute(
            f"COPY (SELECT * FROM read_parquet(?) ORDER BY {keys}) TO ? (FORMAT parquet, "
            f"COMPRESSION zstd, ROW_GROUP_SIZE {ROW_GROUP}, KV_METADATA {meta})",
            [files, str(out)],
        )
    written = pq.ParquetFile(out)
    if not written.schema_arrow.remove_metadata().equals(TABLES[table]):
        return None
    return written.metadata.num_rows


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
