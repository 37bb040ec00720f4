"""Retention and export: prune old runs from a store; write a run or a query to Parquet.

A run is *old* when its newest data (any step, lifecycle message or warning received) is more
than ``days`` days old; pruning rewrites only the segments that hold old runs' rows (via
:meth:`SegmentStore.rewrite`, so readers never see a half-pruned store) and drops dead letters
received before the same cutoff.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from foreshock.transport.wire import RUN_ID_PATTERN

from . import queries
from .reader import open_history
from .schema import TABLES
from .segments import SegmentStore

__all__ = ["export_query", "export_run", "old_runs", "prune"]


def old_runs(root: str | Path, days: float, now: float | None = None) -> list[str]:
    cutoff = (time.time() if now is None else now) - days * 86400
    with open_history(root) as history:
        return queries.idle_runs(history, cutoff)


def prune(store: SegmentStore, days: float, now: float | None = None) -> list[str]:
    """Remove runs with no data for ``days`` days (and older dead letters); returns their ids."""
    now = time.time() if now is None else now
    runs = old_runs(store.root, days, now)
    cutoff = now - days * 86400
    doomed = pa.array(runs, pa.string())
    for table in TABLES:
        if table == "dead_letters":
            keep = lambda rows: rows.filter(pc.greater_equal(rows["received_at"], cutoff))  # noqa: E731
        elif runs:
            keep = lambda rows: rows.filter(pc.invert(pc.is_in(rows["run_id"], doomed)))  # noqa: E731
        else:
            continue
        entries = [e for e in store.manifest["tables"][table]
                   if _touches(store.root / e["file"], table, doomed, cutoff)]  # fmt: skip
        if entries:
            store.rewrite(table, entries, keep)
    return runs


def _touches(path: Path, table: str, doomed: pa.Array, cutoff: float) -> bool:
    if table == "dead_letters":
        column = pq.read_table(path, columns=["received_at"])["received_at"]
        return len(column) > 0 and pc.min(column).as_py() < cutoff
    column = pq.read_table(path, columns=["run_id"])["run_id"]
    return pc.any(pc.is_in(column, doomed)).as_py() or False


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
        raise ValueError(f"export: not a valid run id (it must match {RUN_ID_PATTERN}): "
                         f"{str(run_id)[:80]!r}")  # fmt: skip
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
    """The result of the user's own read-only ``query`` over the views, as one Parquet file."""
    with open_history(root) as history:
        rows = history.sql(query)
    pq.write_table(rows, out)
    return rows.num_rows
