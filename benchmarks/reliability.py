"""Faults survived: kill and restart each part of the pipeline under a live fleet; count losses.

For each fault (``--faults``; default ``none`` as the control, then ``worker``, ``sink``,
``broker`` and ``dashboard``) :func:`benchmarks.pipeline_faults.run_fault` runs a fresh pipeline on
127.0.0.1 (the embedded Tansu, one ``foreshock detect`` worker, one ``foreshock sink`` and
``foreshock dashboard``, each its own process), streams a fleet of recorded lab runs
(``--runs``) through it, each run from its own producer writing one monitoring record every
``1 / --rate`` s, kills the part with SIGKILL and restarts it ``--down`` s later. The figures
(records and warning events stored against produced and expected, duplicates, recovery and
drain times, the end lag) are described in :mod:`benchmarks.pipeline_faults`; this prints
them as the table of docs/reliability.md.

``tests/test_reliability.py`` runs the same function on a smaller fleet and asserts on it.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from ._table import emit_json, format_table
from .pipeline_faults import DEFAULT_RUNS, FAULTS, Plan, run_fault


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per fault (the control first): the
    recovery time, records and warning events stored of those produced and expected,
    duplicates and values lost."""
    rows = []
    for f in result["faults"]:
        lost = f["records_produced"] - f["records_stored"] + len(f["missed_warning_events"])
        recovery = "–" if f["recovery_s"] is None else f"recovered in {f['recovery_s']} s"
        rows.append(
            (
                f"{f['fault']} killed (SIGKILL) and restarted mid-fleet"
                if f["fault"] != "none"
                else "control: no fault",
                f"{recovery}; records {f['records_stored']}/{f['records_produced']}, "
                f"warning events {f['warning_events_stored']}/"
                f"{f['warning_events_expected']}, duplicates "
                f"{f['duplicate_records'] + f['duplicate_warning_events']}, lost {lost}",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 runs, faults worker and broker")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS))
    parser.add_argument("--rate", type=float, default=3.0, help="records/s per run")
    parser.add_argument("--down", type=float, default=3.0, help="s a killed part stays down")
    args = parser.parse_args()
    logging.getLogger("foreshock.rdkafka").setLevel(logging.CRITICAL)  # refused reconnects
    if args.quick:
        args.faults, args.runs = "worker,broker", ",".join(DEFAULT_RUNS[::2][:3])
    plan = Plan(runs=tuple(args.runs.split(",")), rate=args.rate, down=args.down)
    results = []
    for fault in args.faults.split(","):
        with tempfile.TemporaryDirectory(prefix=f"foreshock-reliability-{fault}-") as tmp:
            results.append(run_fault(fault, plan, Path(tmp)))
        print(json.dumps(results[-1]), flush=True)
    rows = [
        [
            r["fault"],
            r["killed_s"],
            r["recovery_s"],
            r["drain_s"],
            f"{r['records_stored']}/{r['records_produced']}",
            f"{r['runs_exact']}/{r['runs']}",
            r["duplicate_records"],
            f"{r['warning_events_stored']}/{r['warning_events_expected']}",
            len(r["missed_warning_events"]),
            len(r["extra_warning_events"]),
            r["duplicate_warning_events"],
            r["lag_end"]["worker"],
            r["lag_end"]["sink"],
            f"{r['producer_pending_bytes']} B / {r['producer_kept_unstored']}",
        ]
        for r in results
    ]
    print(
        format_table(
            [
                "fault",
                "killed at s",
                "recovery s",
                "drain s",
                "records stored",
                "runs exact",
                "dup records",
                "warning events",
                "missed",
                "extra",
                "dup warnings",
                "end lag: worker",
                "end lag: sink",
                "kept by producers / of it unstored",
            ],
            rows,
        )
    )
    emit_json(
        {"runs": len(plan.runs), "rate_per_run": plan.rate, "down_s": plan.down, "faults": results}
    )


if __name__ == "__main__":
    main()
