"""The history's tables (schema version 2): what each column means and why the layout.

Five tables, each an Arrow schema and a Delta table of the store (:mod:`.store`), whose
description records the schema version.

* ``run_events`` — one row per lifecycle message (``start`` / ``end``) as it came: labels and
  the producer's version on start, status and divergence step on end; and one per ``action``
  the trainer took about a warning (what, at which step, how it went: in ``body``). The
  ``runs`` view folds them into one row per run (see :mod:`foreshock.storage.reader`).
* ``steps`` — one row per (run, rank, monitoring step): seq, times, how many values, flags. The
  fleet page's "last step / last data" and the reconciliation of produced vs stored records
  read this small table, never the values.
* ``metric_values`` — **long**: one row per (run, rank, step, series) with the series key split
  into metric, module and head. Long because every query the dashboard and tuning make picks
  a *metric* across modules, layers, heads or runs (``WHERE metric = ?``), models differ in
  which series they have (layers, heads, routers), and a wide table would need a column per
  (metric, module, head) that changes with every model.
* ``warnings`` — every warning event (opened / cleared / updated) as the detectors sent it;
  the ``warnings_latest`` view keeps each warning id's newest state.
* ``dead_letters`` — what could not be stored or decoded, verbatim, with the reason and origin.

A column added later at the end of a table, nullable (``warnings.rank``: per-rank mode, the
rank whose records warned), keeps the version: a writer adds it to an older table when it
opens it (:mod:`.store`), a reader shows it null over files written before
(:mod:`.reader`).

``attempt`` (version 2) tells apart the incarnations of a run resumed under the same run id
(see :mod:`foreshock.transport.wire`): each (run, rank, attempt) is a stream numbered from 0,
and a step re-done after a checkpoint is stored once per attempt. Version-1 rows are attempt 0
(``storage.migrations``).

Values are float64 (``null`` where the producer found them non-finite). Times are Unix
seconds (float64). Steps and seqs are int64.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["SCHEMA_VERSION", "TABLES", "conform", "empty"]

SCHEMA_VERSION = 2

TABLES: dict[str, pa.Schema] = {
    "run_events": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int64()),
            ("attempt", pa.int64()),
            ("kind", pa.string()),
            ("seq", pa.int64()),
            ("time", pa.float64()),
            ("received_at", pa.float64()),
            ("project", pa.string()),
            ("scenario", pa.string()),
            ("fault", pa.string()),
            ("onset", pa.int64()),
            ("status", pa.string()),
            ("divergence_step", pa.int64()),
            ("last_seq", pa.int64()),
            ("body", pa.string()),  # the whole message, JSON
        ]
    ),
    "steps": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int64()),
            ("attempt", pa.int64()),
            ("step", pa.int64()),
            ("seq", pa.int64()),
            ("time", pa.float64()),
            ("received_at", pa.float64()),
            ("n_values", pa.int64()),
            ("flags", pa.string()),
        ]
    ),
    "metric_values": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int64()),
            ("attempt", pa.int64()),
            ("step", pa.int64()),
            ("metric", pa.string()),
            ("module", pa.string()),
            ("head", pa.int64()),
            ("value", pa.float64()),
        ]
    ),
    "warnings": pa.schema(
        [
            ("id", pa.string()),
            ("event", pa.string()),
            ("run_id", pa.string()),
            ("family", pa.string()),
            ("module", pa.string()),
            ("series", pa.string()),
            ("direction", pa.string()),
            ("step", pa.int64()),
            ("role", pa.string()),
            ("statistic", pa.float64()),
            ("threshold", pa.float64()),
            ("false_alarm_rate", pa.float64()),
            ("config_version", pa.string()),
            ("divergence_step", pa.int64()),
            ("lead_time", pa.int64()),
            ("cleared_step", pa.int64()),
            ("received_at", pa.float64()),
            ("evidence", pa.string()),  # JSON
            ("rank", pa.int64()),  # per-rank mode: the rank that warned (null: one process)
        ]
    ),
    "dead_letters": pa.schema(
        [
            ("received_at", pa.float64()),
            ("source", pa.string()),
            ("partition", pa.int64()),
            ("offset", pa.int64()),
            ("reason", pa.string()),
            ("raw", pa.binary()),
        ]
    ),
}


def empty(table: str) -> pa.Table:
    """A table with no rows and ``table``'s schema (what a view reads before any segment)."""
    return TABLES[table].empty_table()


def conform(table: str, rows: pa.Table) -> pa.Table:
    """``rows`` of ``table`` with the columns added since they were written (nullable, at the
    end: see above) as nulls, in the table's order and types."""
    for field in TABLES[table]:
        if field.name not in rows.column_names:
            rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
    return rows.select(TABLES[table].names).cast(TABLES[table])
