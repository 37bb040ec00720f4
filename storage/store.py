"""The store: five Delta Lake tables under one URI, written by any number of sinks at once.

Each table of :mod:`foreshock.storage.schema` is a Delta table ``<uri>/<name>`` (Parquet files
plus an atomic commit log, delta-rs): appends from many processes commit optimistically and
never conflict, every commit is a table *version* a reader can pin, and the same code runs on
a local folder or object storage. What this module adds is the project's own rules:

1. **Write order.** A batch is appended table by table in :data:`WRITE_ORDER` —
   ``metric_values`` before ``steps`` before ``run_events`` — and a reader pins the versions
   in the reverse order (:mod:`foreshock.storage.reader`). So a reader that sees a record's
   ``steps`` row sees all its values, and a run's ``end`` only after its records: it never
   sees half a record, and each table shows whole batches only (a Delta commit is atomic).
2. **Retries are idempotent.** Every commit carries a Delta *application transaction*
   (``txn``: this writer's ``app_id``, the batch number). Before retrying a table, the writer
   reads back the table's transaction version for its ``app_id``: a commit that landed but
   reported an error (a disk that filled after the log entry was written, a network reply
   lost) is not appended again. Delta also refuses a commit whose ``app_id`` a concurrent
   commit used (``ConcurrentTransaction``), so two handles with one ``app_id`` cannot both
   land the same batch.
3. **A crash between tables** leaves the batch's rows in the tables before the crash point
   only. The sink that takes the partition over reads them back
   (``stream_queries.orphan_values``: values with no ``steps`` row) and writes only the
   missing rows — see :mod:`foreshock.storage.sink`.

Maintenance (:meth:`DeltaStore.maintain`): ``optimize`` bin-packs a table's small files (one per
batch) into large ones, ``vacuum`` deletes files no version newer than ``retain_hours`` needs —
a reader pinned to a version younger than that keeps every file it was promised, and
``foreshock tune`` can re-read the exact version it was trained on (time travel) for as long.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import TableNotFoundError

from .location import RETAIN_HOURS, StoreLocation, load_location
from .schema import SCHEMA_VERSION, TABLES

__all__ = [
    "READ_ORDER",
    "WRITE_ORDER",
    "DeltaStore",
    "SchemaVersionError",
    "open_table",
    "schema_version",
    "store_exists",
    "table_versions",
]

log = logging.getLogger(__name__)

WRITE_ORDER = ("metric_values", "steps", "run_events", "warnings", "dead_letters")
READ_ORDER = tuple(reversed(WRITE_ORDER))
WRITER_KEY = "foreshock.writer"  # commit metadata: the sink group that wrote the commit
VERSION_PREFIX = "foreshock schema version "  # each table's Delta description: "… 1"
# Rows of a batch are sorted by run (then series and step) and row groups kept small, so each
# row group spans few runs and its min/max statistics let a run page skip the rest — also
# after compaction, which concatenates files without re-sorting (benchmarks.storage: run page
# at 200 runs x 20,000 steps).
SORT_KEYS = {
    "metric_values": ["run_id", "metric", "module", "head", "step"],
    "steps": ["run_id", "rank", "step"],
}
_WRITER = WriterProperties(compression="ZSTD", max_row_group_size=65_536)


def first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


class SchemaVersionError(RuntimeError):
    """A table's schema version is not the one this foreshock reads."""


def open_table(
    location: StoreLocation, table: str, version: int | None = None
) -> DeltaTable | None:
    """The Delta table ``table`` of the store (at ``version``), or None if never written."""
    try:
        return DeltaTable(
            location.table_uri(table), version=version, storage_options=location.options or None
        )
    except TableNotFoundError:
        return None


def readable_table(
    location: StoreLocation, table: str, version: int | None = None
) -> tuple[DeltaTable | None, str | None]:
    """For readers: ``open_table``, or — where the newest commits are damaged (a torn commit:
    :mod:`.repair`) — the table at its last readable version, and a sentence saying so. A
    damaged commit once stopped every read path (``warnings list``/``act``, ``report``,
    ``export``, the dashboard) with a traceback while people most needed them."""
    try:
        return open_table(location, table, version), None
    except Exception as exc:
        if version is not None:
            raise
        from .repair import first_damage

        damage = first_damage(location, table)
        if damage is None or damage.version < 1:
            raise
        try:
            older = open_table(location, table, damage.version - 1)
        except Exception:
            raise exc from None
        note = f"{damage.sentence()}; read at version {damage.version - 1} (foreshock store repair)"
        log.warning("foreshock store: %s", note)
        return older, note


def store_exists(location: StoreLocation | str | None) -> bool:
    """Has anything created the store's tables yet?"""
    location = load_location(location)
    uri = location.table_uri("steps")
    try:
        return DeltaTable.is_deltatable(uri, storage_options=location.options or None)
    except OSError:  # e.g. a bucket that does not exist (404)
        return False


def table_versions(location: StoreLocation | str | None) -> dict[str, int]:
    """Each table's newest version (-1: not created), read in :data:`READ_ORDER` — what a
    reader pins (``open_history(store, versions)``), so a cache can key on it."""
    location = load_location(location)
    out = {}
    for name in READ_ORDER:
        table, _ = readable_table(location, name)  # a damaged table: its last readable one
        out[name] = -1 if table is None else table.version()
    return out


def schema_version(table: DeltaTable) -> int:
    """From the table's description (delta-rs refuses custom configuration keys)."""
    text = table.metadata().description or ""
    return int(text.removeprefix(VERSION_PREFIX)) if text.startswith(VERSION_PREFIX) else 1


def _check_version(name: str, table: DeltaTable) -> None:
    found = schema_version(table)
    if found != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"table {name} has schema version {found}; this foreshock reads {SCHEMA_VERSION}: "
            + ("run `foreshock store migrate`" if found < SCHEMA_VERSION else "upgrade foreshock")
        )


def _add_new_columns(name: str, table: DeltaTable) -> None:
    """Columns :data:`TABLES` gained since ``table`` was created (nullable, at the end: no new
    schema version, see :mod:`.schema`) are added before this writer appends rows with them."""
    from deltalake.schema import Field, PrimitiveType

    have = {f.name for f in table.schema().fields}
    new = [f for f in TABLES[name] if f.name not in have]
    if not new:
        return
    types = {pa.int64(): "long", pa.string(): "string", pa.float64(): "double"}
    try:
        columns = [Field(f.name, PrimitiveType(types[f.type]), nullable=True) for f in new]
        table.alter.add_columns(columns)
    except Exception:  # another writer added them first
        table.update_incremental()
        if {f.name for f in table.schema().fields} < {f.name for f in TABLES[name]}:
            raise
    log.info("foreshock store: table %s gained column(s) %s", name, [f.name for f in new])


class DeltaStore:
    """A writer of the store (tables created if missing). Any number may write at once.

    ``app_id`` names this writer in the tables' transaction log (a fresh one per process by
    default); :meth:`write` numbers its batches 1, 2, … under it.
    """

    def __init__(
        self,
        location: StoreLocation | str | None = None,
        app_id: str | None = None,
        writer: str | None = None,
    ) -> None:
        self.location = load_location(location)
        self.app_id = app_id or f"foreshock-{uuid.uuid4().hex[:16]}"
        self.writer = writer  # the sink group whose commits these are (``recent_writers``)
        self.batches = 0
        if self.location.is_local:
            from pathlib import Path

            Path(self.location.table_uri("")).mkdir(parents=True, exist_ok=True)
        self.tables: dict[str, DeltaTable] = {}
        self.damaged: dict[str, Exception] = {}  # tables that would not open (a torn commit)
        with self._creating():
            for name in TABLES:
                try:
                    self.table(name)
                except SchemaVersionError:
                    raise
                except Exception:  # kept in self.damaged, tried again at its next write
                    continue
        if len(self.damaged) == len(TABLES):  # not one table: the store is away, not damaged
            raise next(iter(self.damaged.values()))

    def table(self, name: str) -> DeltaTable:
        """Table ``name``, opened (or created) now if it would not open before. One that fails
        is kept in :attr:`damaged` and tried again at its next write, so a torn commit of one
        table stops only that table's writes (``foreshock store repair`` mends it)."""
        if name in self.tables:
            return self.tables[name]
        try:
            self.tables[name] = self._ensure(name)
        except SchemaVersionError:
            raise
        except Exception as exc:  # delta-rs raises its own errors for an unreadable log
            if name not in self.damaged:
                log.error("foreshock store: table %s does not open (%s)", name, first_line(exc))
            self.damaged[name] = exc
            raise
        if self.damaged.pop(name, None) is not None:
            log.warning("foreshock store: table %s opens again", name)
        return self.tables[name]

    @contextlib.contextmanager
    def _creating(self):
        """One creator at a time on a local store: delta-rs retries a racing CREATE TABLE at
        the next version instead of failing it, which would leave two table ids in the log.
        (Object storage has no lock: there, create the tables before starting several sinks
        at once: one sink, or ``foreshock store maintain``, does.)"""
        if not self.location.is_local:
            yield
            return
        import fcntl
        from pathlib import Path

        with (Path(self.location.table_uri("")) / ".create.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _ensure(self, name: str) -> DeltaTable:
        table = open_table(self.location, name)
        if table is None:
            try:
                table = DeltaTable.create(
                    self.location.table_uri(name),
                    schema=TABLES[name],
                    mode="ignore",
                    name=name,
                    description=f"{VERSION_PREFIX}{SCHEMA_VERSION}",
                    storage_options=self.location.options or None,
                )
            except Exception:  # another writer created it first: read theirs
                table = open_table(self.location, name)
                if table is None:
                    raise
        _check_version(name, table)
        _add_new_columns(name, table)
        return table

    def close(self) -> None:
        """Nothing to release (no lock, no open file); kept so a store reads as a resource."""

    def __enter__(self) -> DeltaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_batch(self) -> int:
        self.batches += 1
        return self.batches

    def write(self, batch: dict[str, pa.Table], number: int | None = None) -> dict[str, int]:
        """Append one batch in :data:`WRITE_ORDER`; returns {table: version written}.

        Retry a failed call with the same ``number`` (:meth:`next_batch`): tables whose commit
        already landed under it are skipped (step 2 of the module docstring).
        """
        number = self.next_batch() if number is None else number
        written = {}
        for name in WRITE_ORDER:
            rows = batch.get(name)
            version = None if rows is None else self.write_table(name, rows, number)
            if version is not None:
                written[name] = version
        return written

    def write_table(self, name: str, rows: pa.Table, number: int) -> int | None:
        """Append ``rows`` to table ``name`` as batch ``number``; the version written (None:
        no rows, or the batch landed on an earlier try)."""
        if not rows.num_rows:
            return None
        try:
            return self._append(self.table(name), name, rows, number)
        except SchemaVersionError:
            raise
        except Exception:  # reopened at the next try: a log ``store repair`` mended reads again
            self.tables.pop(name, None)
            raise

    def _append(self, table: DeltaTable, name: str, rows: pa.Table, number: int) -> int | None:
        table.update_incremental()
        if (table.transaction_version(self.app_id) or 0) >= number:
            return None  # landed on an earlier try
        rows = rows.select(TABLES[name].names).cast(TABLES[name])
        if name in SORT_KEYS:
            rows = rows.sort_by([(key, "ascending") for key in SORT_KEYS[name]])
        write_deltalake(
            table,
            rows,
            mode="append",
            writer_properties=_WRITER,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self.app_id, number)],
                custom_metadata={WRITER_KEY: self.writer} if self.writer else None,
            ),
        )
        return table.version()

    def recent_writers(self, within: float, now: float | None = None) -> dict[str, float]:
        """The sink groups that committed to ``steps`` in the last ``within`` seconds, with
        how long ago each last did (s). Read from the commits' metadata (the last 100)."""
        now = time.time() if now is None else now
        table = next(self.tables[n] for n in ("steps", *WRITE_ORDER) if n in self.tables)
        table.update_incremental()
        ago: dict[str, float] = {}
        for commit in table.history(100):
            writer, at = commit.get(WRITER_KEY), commit.get("timestamp")
            if isinstance(writer, str) and isinstance(at, int | float):
                age = max(0.0, now - at / 1000)
                if age <= within:
                    ago[writer] = min(ago.get(writer, age), age)
        return ago

    def versions(self) -> dict[str, int]:
        out = {}
        for name, table in self.tables.items():
            table.update_incremental()
            out[name] = table.version()
        return out

    def delete(self, name: str, predicate: str) -> int:
        """Delete ``name``'s rows matching a SQL ``predicate``; returns how many."""
        table = self.table(name)
        table.update_incremental()
        return int(table.delete(predicate).get("num_deleted_rows", 0))

    def maintain(
        self,
        retain_hours: float = RETAIN_HOURS,
        target_size: int | None = None,
        vacuum: bool = True,
    ) -> dict[str, Any]:
        """Compact every table's small files, then vacuum what no recent version needs."""
        report: dict[str, Any] = {}
        for name, table in self.tables.items():
            table.update_incremental()
            metrics = table.optimize.compact(target_size=target_size, writer_properties=_WRITER)
            removed = []
            if vacuum:
                removed = table.vacuum(
                    retention_hours=math.ceil(retain_hours),
                    enforce_retention_duration=False,
                    dry_run=False,
                )
            report[name] = {
                "files_added": metrics.get("numFilesAdded", 0),
                "files_removed": metrics.get("numFilesRemoved", 0),
                "vacuumed": len(removed),
            }
        return report
