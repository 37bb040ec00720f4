"""Migrations: a store written by an older foreshock brought up to date.

Two kinds:

* **Format** — a segment store (foreshock ≤ 0.1: ``manifest.json`` plus Parquet segments under
  ``data/<table>/``) becomes Delta tables in the same folder (:func:`migrate_segments`). Each
  table is copied in one commit tagged with an application transaction, so an interrupted
  migration re-run copies only the tables not yet done; the row counts are checked against
  the manifest's before the manifest is renamed ``manifest.json.migrated`` (the segments stay
  until the user deletes ``data/``). The rows go through the schema chain below on the way.
* **Schema** — ``MIGRATIONS[v]`` takes the rows of one table at schema version v (an Arrow
  table) and returns them at v + 1; :func:`migrate` overwrites each table through the chain
  in one commit, then records the new version in its description (run it with the sinks
  stopped: a running one writes rows at the old version). Additive changes (a new nullable
  column) need no entry: Delta merges the schema.
  Version 2 added ``attempt`` (:func:`_v1_to_v2`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, Transaction, write_deltalake

from .location import StoreLocation, load_location
from .schema import SCHEMA_VERSION, TABLES, conform
from .store import VERSION_PREFIX, DeltaStore, SchemaVersionError, open_table, schema_version

__all__ = ["MIGRATIONS", "SEGMENT_MANIFEST", "migrate", "migrate_segments"]

Migration = Callable[[str, pa.Table], pa.Table]  # (table name, rows at v) -> rows at v + 1


def _v1_to_v2(table: str, rows: pa.Table) -> pa.Table:
    """Version 2 adds ``attempt`` after ``rank`` (a resumed run's incarnation); v1 rows are 0."""
    if table not in ("run_events", "steps", "metric_values"):
        return rows
    zeros = pa.array([0] * rows.num_rows, pa.int64())
    return rows.add_column(rows.column_names.index("rank") + 1, "attempt", zeros)


MIGRATIONS: dict[int, Migration] = {1: _v1_to_v2}
SEGMENT_MANIFEST = "manifest.json"
_APP_ID = "foreshock-migrate-segments"


def migrate_segments(folder: str | Path, target: StoreLocation | str | None = None) -> dict:
    """Copy the segment store in ``folder`` into Delta tables (``target``, default the same
    folder); returns {table: rows}. Raises if a table's count does not match the manifest's."""
    folder = Path(folder)
    manifest = json.loads((folder / SEGMENT_MANIFEST).read_text())
    store = DeltaStore(load_location(target or str(folder)), app_id=_APP_ID)
    counts = {}
    for table, entries in manifest["tables"].items():
        expected = sum(e["rows"] for e in entries)
        delta = store.table(table)
        if entries and (delta.transaction_version(_APP_ID) or 0) < 1:
            parts = [
                pq.read_table(folder / e["file"]).replace_schema_metadata(None) for e in entries
            ]
            rows = pa.concat_tables(parts, promote_options="default")
            for version in range(manifest["schema_version"], SCHEMA_VERSION):
                rows = MIGRATIONS[version](table, rows)
            rows = conform(table, rows)
            write_deltalake(
                delta,
                rows,
                mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction(_APP_ID, 1)]),
            )
        delta.update_incremental()
        stored = sum(delta.get_add_actions(flatten=True).column("num_records").to_pylist())
        if stored != expected:
            raise RuntimeError(
                f"migrate: {table} has {stored} rows in Delta, the segment "
                f"store {expected}; the segments are left as they were"
            )
        counts[table] = stored
    (folder / SEGMENT_MANIFEST).rename(folder / f"{SEGMENT_MANIFEST}.migrated")
    return counts


def migrate(store: StoreLocation | str | None = None, target: int = SCHEMA_VERSION) -> dict:
    """Bring every table of ``store`` to schema version ``target``; {table: version it had}."""
    location = load_location(store)
    before = {}
    for name in TABLES:
        table = open_table(location, name)
        if table is None:
            continue
        start = before[name] = schema_version(table)
        if start > target:
            raise SchemaVersionError(f"table {name} is at {start}, newer than {target}")
        missing = [v for v in range(start, target) if v not in MIGRATIONS]
        if missing:
            raise SchemaVersionError(f"no migration from version(s) {missing}")
        if start == target:
            continue
        rows = table.to_pyarrow_table()
        for version in range(start, target):
            rows = MIGRATIONS[version](name, rows)
        write_deltalake(table, rows, mode="overwrite", schema_mode="overwrite")
        table.alter.set_table_description(f"{VERSION_PREFIX}{target}")
    return before
