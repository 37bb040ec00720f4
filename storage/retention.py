"""Retention and export: prune old runs from a store; write a run or a query to Parquet.

A run is *old* when its newest data (any step, lifecycle message or warning received) is more
than ``days`` days old; pruning is one Delta ``delete`` per table (a commit: a reader sees the
table with the run or without it) and drops dead letters received before the same cutoff. The
deleted rows' files stay readable by older versions until ``vacuum`` (the sink's maintenance,
``foreshock store maintain``) removes them after the retention period.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow.parquet as pq

from foreshock.transport.wire import RUN_ID_PATTERN

from . import queries
from .location import StoreLocation
from .reader import open_history
from .schema import TABLES
from .store import DeltaStore

__all__ = ["export_query", "export_run", "old_runs", "prune"]


def old_runs(root: str | Path | StoreLocation, days: float, now: float | None = None) -> list[str]:
    cutoff = (time.time() if now is None else now) - days * 86400
    with open_history(root) as history:
        return queries.idle_runs(history, cutoff)


def prune(store: DeltaStore, days: float, now: float | None = None) -> list[str]:
    """Remove runs with no data for ``days`` days (and older dead letters); returns their ids."""
    now = time.time() if now is None else now
    runs = old_runs(store.location, days, now)
    cutoff = now - days * 86400
    store.delete("dead_letters", f"received_at < {float(cutoff)!r}")
    for i in range(0, len(runs), 500):
        ids = runs[i : i + 500]
        if any(re.fullmatch(RUN_ID_PATTERN, r) is None for r in ids):
            raise ValueError("prune: a stored run id breaks the wire's rule")  # never quoted
        listed = ", ".join(f"'{r}'" for r in ids)
        for table in TABLES:
            if table != "dead_letters":
                store.delete(table, f"run_id IN ({listed})")
    return runs


def export_run(root: str | Path, run_id: str, out_dir: str | Path) -> dict[str, int]:
    """Every table's rows of one run as ``<out_dir>/<table>.parquet``; rows per table.

    The files are named after the tables, never the run; a run id outside the wire's rule
    (:data:`~foreshock.transport.wire.RUN_ID_PATTERN`) — no store holds one — is refused:

    >>> export_run("history", "../../etc/passwd", "out")
    Traceback (most recent call last):
    ...
    ValueError: export: not a valid run id (it must match [A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}): '../../etc/passwd'
    """  # noqa: E501
    if not isinstance(run_id, str) or re.fullmatch(RUN_ID_PATTERN, run_id) is None:
        raise ValueError(
            f"export: not a valid run id (it must match {RUN_ID_PATTERN}): {str(run_id)[:80]!r}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    with open_history(root) as history:
        for table in TABLES:
            if table == "dead_letters":
                continue
            rows = queries.run_rows(history, table, run_id)
            pq.write_table(rows, out / f"{table}.parquet")
            counts[table] = rows.num_rows
    return counts


def export_query(root: str | Path, query: str, out: str | Path) -> int:
    """The result of the user's own read-only ``query`` over the views, as one Parquet file
    (``History.user_sql``: one SELECT, no file outside the store; ValueError otherwise)."""
    with open_history(root) as history:
        rows = history.user_sql(query)
    pq.write_table(rows, out)
    return rows.num_rows
