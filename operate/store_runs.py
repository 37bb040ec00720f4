"""Load recorded lab runs straight into a store (no broker): seeding histories for tests,
benchmarks and the dashboard's demo data. The rows are the ones the sink would write for the
same messages, and the warnings are the detectors' own (offline replay, same code as live).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.profiles import ProfileConfigs
from foreshock.detectors.replay import replay_run
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore
from foreshock.transport.run_files import load_run

if TYPE_CHECKING:
    from foreshock.storage.location import StoreLocation

__all__ = ["import_runs", "store_recorded_runs"]


def store_recorded_runs(
    store: DeltaStore,
    paths: Iterable[str | Path],
    config: DetectorConfig | ProfileConfigs | None,
    received_at: float | None = None,
) -> int:
    """Write each run (start, records, actions, end, and its warnings unless ``config`` is
    None) as one batch; returns the number of runs."""
    now = time.time() if received_at is None else received_at
    count = 0
    for path in paths:
        run = load_run(path)
        builder = BatchBuilder()
        run_id = run.start.get("run_id") or Path(path).name.split(".")[0]
        builder.add_lifecycle({**run.start, "run_id": run_id, "kind": "start", "seq": 0}, now)
        for seq, record in enumerate(run.records, start=1):
            builder.add_metrics({**record, "run_id": run_id, "seq": seq}, now)
        for seq, action in enumerate(run.actions, start=len(run.records) + 1):
            builder.add_lifecycle({**action, "run_id": run_id, "kind": "action", "seq": seq}, now)
        if run.end is not None:
            last = len(run.records) + len(run.actions) + 1
            builder.add_lifecycle(
                {**run.end, "run_id": run_id, "kind": "end", "seq": last, "last_seq": last}, now
            )
        if config is not None:
            for event in replay_run(run, config).events:
                builder.add_warning(event.to_message(), now)
        store.write(builder.take())
        count += 1
    return count


def import_runs(args: argparse.Namespace) -> int:
    """Runs from JSON Lines files into the store, with the shipped detectors' warnings. A run
    id already in the store, or in two of the files, is refused and nothing is written: two
    runs under one id would be read as one (``foreshock tune`` and ``calibrate`` would judge
    a blend)."""
    from foreshock.storage.commands import location_of

    from .detect_commands import default_config

    try:
        ids = [load_run(path).run_id for path in args.runs]
    except (ValueError, OSError, KeyError) as exc:
        print(f"foreshock store import: {exc}", file=sys.stderr)
        return 2
    location = location_of(args)
    stored = _stored_run_ids(location)
    twice = sorted({i for i in ids if ids.count(i) > 1})
    clash = sorted(set(ids) & stored)
    if twice or clash:
        why = [f"in two files: {', '.join(twice)}"] if twice else []
        why += [f"already in the store: {', '.join(clash)}"] if clash else []
        print(f"foreshock store import: refused, run ids {'; '.join(why)}", file=sys.stderr)
        return 1
    config = None if args.no_warnings else default_config()
    count = store_recorded_runs(DeltaStore(location), args.runs, config)
    print(f"imported {count} runs into {location.uri}")
    return 0


def _stored_run_ids(location: StoreLocation) -> set[str]:
    """The run ids a store holds (none for a store not yet written)."""
    from foreshock.storage.reader import open_history

    try:
        with open_history(location) as history:
            rows = history.sql("SELECT DISTINCT run_id FROM run_events").to_pylist()
    except (ValueError, FileNotFoundError):  # no tables yet: an empty store
        return set()
    return {row["run_id"] for row in rows}
