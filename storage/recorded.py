"""Load recorded lab runs straight into a store (no broker): seeding histories for tests,
benchmarks and the dashboard's demo data. The rows are the ones the sink would write for the
same messages, and the warnings are the detectors' own (offline replay, same code as live).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run

from .rows import BatchBuilder
from .store import DeltaStore

__all__ = ["store_recorded_runs"]


def store_recorded_runs(
    store: DeltaStore,
    paths: Iterable[str | Path],
    config: DetectorConfig | None,
    received_at: float | None = None,
) -> int:
    """Write each run (start, records, end, and its warnings unless ``config`` is None) as
    one batch; returns the number of runs."""
    now = time.time() if received_at is None else received_at
    count = 0
    for path in paths:
        run = load_run(path)
        builder = BatchBuilder()
        run_id = run.start.get("run_id") or Path(path).name.split(".")[0]
        builder.add_lifecycle({**run.start, "run_id": run_id, "kind": "start", "seq": 0}, now)
        for seq, record in enumerate(run.records, start=1):
            builder.add_metrics({**record, "run_id": run_id, "seq": seq}, now)
        if run.end is not None:
            last = len(run.records) + 1
            builder.add_lifecycle(
                {**run.end, "run_id": run_id, "kind": "end", "seq": last, "last_seq": last}, now
            )
        if config is not None:
            for event in replay_run(run, config).events:
                builder.add_warning(event.to_message(), now)
        store.write(builder.take())
        count += 1
    return count
