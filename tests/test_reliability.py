"""Faults under a live fleet: each part of the pipeline killed and restarted, nothing lost.

Every case runs its own Tansu, detector worker, sink and dashboard on 127.0.0.1 (the broker is
one of the things killed), streams recorded lab runs through real KafkaSinks, and compares the
store with what the producers wrote and with an undisturbed offline replay of the detectors.
The experiment is :func:`benchmarks.pipeline_faults.run_fault`, on the harness's pipeline and
replayers; the figures for docs/reliability.md come from ``python -m benchmarks.reliability``
(same code).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.pipeline_faults import Plan, kept_unstored, run_fault
from foreshock.delivery.spool import Spool, SpooledMessage
from foreshock.storage.reader import open_history
from foreshock.storage.reconcile import check_streams, missing_ranges
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore

FLEET = Plan(runs=("fa-lowprec-s0", "lr-high-s0", "healthy-s0"), rate=5.0, down=2.0, drain=60)


@pytest.mark.parametrize("fault", ["worker", "sink", "broker", "dashboard"])
def test_part_killed_and_restarted_mid_fleet_loses_and_duplicates_nothing(fault, tmp_path):
    result = run_fault(fault, FLEET, tmp_path)
    print(json.dumps(result))
    assert result["services_failed"] == {}
    assert result["record_mismatch"] == {}  # every run: stored (run, step) rows == produced
    assert result["runs_exact"] == len(FLEET.runs)
    assert result["duplicate_records"] == 0
    assert result["warning_events_expected"] > 10  # the fleet does warn
    assert result["missed_warning_events"] == []
    assert result["extra_warning_events"] == []
    assert result["duplicate_warning_events"] == 0
    assert result["producer_kept_unstored"] == 0  # what producers kept to re-send is stored
    assert result["recovery_s"] is not None and result["recovery_s"] < 60
    assert result["lag_end"] == {"worker": 0, "sink": 0}


def _stream(b: BatchBuilder, run_id: str, seqs: list[int], last_seq: int | None) -> None:
    for seq in seqs:
        if seq == 0:
            b.add_lifecycle(
                {
                    "kind": "start",
                    "schema": "foreshock.run/1",
                    "run_id": run_id,
                    "seq": 0,
                    "labels": {},
                },
                0.0,
            )
        elif seq == last_seq:
            b.add_lifecycle(
                {
                    "kind": "end",
                    "schema": "foreshock.run/1",
                    "run_id": run_id,
                    "seq": seq,
                    "last_seq": seq,
                    "status": "finished",
                },
                0.0,
            )
        else:
            b.add_metrics(
                {
                    "kind": "metrics",
                    "schema": "foreshock.metrics/1",
                    "run_id": run_id,
                    "seq": seq,
                    "step": 10 * seq,
                    "values": {"loss": 1.0},
                },
                0.0,
            )


def test_store_check_finds_the_streams_with_missing_seqs(tmp_path):
    """Reconciliation against the producers' seqs: complete, incomplete (with the missing
    ranges), open; ``foreshock store check`` exits 1 on an incomplete stream."""
    b = BatchBuilder()
    _stream(b, "whole", list(range(8)), last_seq=7)
    _stream(b, "holed", [0, 1, 2, 5, 6, 9], last_seq=9)
    _stream(b, "running", [0, 1, 3], last_seq=None)
    with DeltaStore(tmp_path) as store:
        store.write(b.take())
    with open_history(tmp_path) as history:
        checks = {c.run_id: c for c in check_streams(history)}
    assert checks["whole"].status == "complete" and checks["whole"].missing == []
    assert checks["holed"].status == "incomplete"
    assert checks["holed"].missing == [(3, 4), (7, 8)]
    assert (checks["holed"].stored, checks["holed"].expected) == (6, 10)
    assert checks["running"].status == "open" and checks["running"].missing == [(2, 2)]
    assert missing_ranges(list(range(5)), 5) == []

    cli = [sys.executable, "-m", "foreshock.app.cli", "store", "check", "--store", str(tmp_path)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "holed" in done.stdout and "3-4 7-8" in done.stdout and "whole" not in done.stdout
    listed = json.loads(
        subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60).stdout
    )
    assert listed["duplicated"] == [] and listed["value_mismatches"] == []
    assert {c["run_id"]: c["status"] for c in listed["streams"]} == {
        "holed": "incomplete",
        "running": "open",
        "whole": "complete",
    }


def test_kept_unstored_counts_what_a_producer_kept_and_the_store_lacks(tmp_path):
    """The fault test's last check: spooled copies of stored messages don't count, others do."""
    b = BatchBuilder()
    _stream(b, "run-k", [0, 1, 2, 3], last_seq=3)
    with DeltaStore(tmp_path / "store") as store:
        store.write(b.take())
    spool = Spool(tmp_path / "spool", "run-k")
    for seq in (2, 3, 4, 5):  # 2 and 3 stored (a step, the end); 4 and 5 not
        body = {"run_id": "run-k", "rank": 0, "seq": seq}
        spool.append(SpooledMessage("metrics", b"run-k", json.dumps(body).encode()))
    spool.close(delete_if_empty=False)
    assert kept_unstored(tmp_path / "spool", tmp_path / "store") == 2
    assert kept_unstored(tmp_path / "empty", tmp_path / "store") == 0
