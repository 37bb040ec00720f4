"""Schema migrations: how a store written by an older foreshock is brought up to date.

``MIGRATIONS[v]`` takes the rows of one table at schema version v (an Arrow table) and returns
them at v + 1. ``foreshock store migrate`` (with the sink stopped: it takes the writer lock)
rewrites every segment through the chain and publishes all of them with the new version in
one manifest: readers see the old store or the new one, never a mix.

Additive changes (a new nullable column) need no rewrite: readers union segments by column
name. Only renames, splits or type changes need an entry here. Version 1 is the first, so the
chain is empty today; the mechanism is tested with a synthetic migration.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from . import segments
from .schema import SCHEMA_VERSION

__all__ = ["MIGRATIONS", "migrate"]

Migration = Callable[[str, pa.Table], pa.Table]  # (table name, rows at v) -> rows at v + 1
MIGRATIONS: dict[int, Migration] = {}


def migrate(root: str | Path, target: int = SCHEMA_VERSION) -> int:
    """Bring the store at ``root`` to ``target``; returns the version it had."""
    start = segments.read_manifest(root, any_version=True)["schema_version"]
    if start > target:
        raise segments.SchemaVersionError(f"store is at {start}, newer than {target}")
    missing = [v for v in range(start, target) if v not in MIGRATIONS]
    if missing:
        raise segments.SchemaVersionError(f"no migration from version(s) {missing}")
    if start == target:
        return start
    with segments.SegmentStore(root, any_version=True) as store:
        store.replace_all(lambda table, rows: _chain(table, rows, start, target), target)
    return start


def _chain(table: str, rows: pa.Table, start: int, target: int) -> pa.Table:
    for version in range(start, target):
        rows = MIGRATIONS[version](table, rows)
    return rows
