"""Profiles that build themselves (issue 47 item 3): recorded Llama runs (a model no shipped
profile knows) imported into a real store; the builder waits for 10 healthy runs, publishes
under ``auto``, holds the candidate under ``approve`` until a person approves it, and a later
run of that model is judged by it."""

from __future__ import annotations

import json
import threading
import time

import pytest

from foreshock.app.cli import main
from foreshock.lab.recorded import RECORDED_DIR
from foreshock.operate import profile_builder as pb
from foreshock.operate.profile_groups import by_signature, fleet_runs

LLAMA = RECORDED_DIR / "llama"
HEALTHY = [str(LLAMA / f"llama-healthy-s{seed}.jsonl.gz") for seed in range(12)]
FAULTS = [str(LLAMA / f"llama-{s}-s0.jsonl.gz") for s in ("fa-lowprec", "lr-high")]


def _import(store, paths) -> None:
    assert main(["store", "import", "--store", str(store), *paths]) == 0


def test_fewer_than_ten_healthy_runs_build_nothing_and_ten_publish_under_auto(tmp_path, capsys):
    store = tmp_path / "store"
    _import(store, HEALTHY[:9] + FAULTS)
    report = pb.build(store, "auto")
    assert report.outcomes == [("llama L2 d128 h4/2", "9 of 10 healthy runs")]
    assert not report.published and not pb.lineage(store)
    _import(store, HEALTHY[9:10])
    report = pb.build(store, "auto")
    assert report.published == ["llama-l2-d128"]
    entry = pb.lineage(store)[-1]
    assert entry["action"] == "published" and entry["by"] == "auto"
    assert sorted(entry["runs"]) == sorted(f"llama-healthy-s{s}" for s in range(10))
    judged = entry["judged"]
    assert judged["healthy_runs"] == 10
    assert set(judged["measured_false_warning_rate"]) == {
        "attention-numerics",
        "router",
        "optimizer",
    }
    stated = judged["stated_false_warning_rate"]["attention-numerics"]
    assert stated == pytest.approx(4 / 11, abs=0.05)  # |F|·k/(n+1), a few rules per family
    faults = {f["scenario"]: f for f in judged["faults"]}
    assert faults["fa-lowprec"]["attribution"] == "correct" and faults["fa-lowprec"]["lead"] > 0
    assert pb.build(store, "auto").outcomes == [("llama L2 d128 h4/2", "has profile llama-l2-d128")]
    capsys.readouterr()
    # a later run of the model is judged by it (the detectors started with --store)
    later = str(LLAMA / "llama-fa-lowprec-s1.jsonl.gz")
    assert main(["detect", "--store", str(store), "--replay", later, "--json"]) == 0
    judged_later = json.loads(capsys.readouterr().out)
    assert judged_later["profile"] == "llama-l2-d128"
    assert judged_later["warnings"], "the fault run is warned under the built profile"


def test_under_approve_the_candidate_waits_for_a_person(tmp_path, capsys):
    store = str(tmp_path / "store")
    _import(store, HEALTHY[:10])
    assert pb.policy(store) == "approve"  # the default
    assert main(["profiles", "build", "--store", store]) == 0
    assert "candidate llama-l2-d128 awaits approval" in capsys.readouterr().out
    assert pb.profile_of_group(pb.in_force(store), by_signature(fleet_runs(store))[0]) is None
    assert main(["profiles", "build", "--store", store]) == 0  # built once, not again
    assert "a candidate awaits approval" in capsys.readouterr().out
    assert main(["profiles", "approve", "nope", "--store", store]) == 2
    assert "pending: llama-l2-d128" in capsys.readouterr().err
    assert main(["profiles", "approve", "llama-l2-d128", "--store", store, "--by", "ana"]) == 0
    assert pb.lineage(store)[-1] | {"judged": None} == pb.lineage(store)[-1] | {
        "judged": None,
        "action": "published",
        "by": "ana",
        "profile": "llama-l2-d128",
    }
    assert main(["profiles", "approve", "llama-l2-d128", "--store", store]) == 2
    assert "(it is published)" in capsys.readouterr().err
    assert main(["profiles", "list", "--store", store]) == 0
    listed = capsys.readouterr().out
    assert "llama L2 d128 h4/2" in listed and "llama-l2-d128" in listed and "10/10" in listed


def test_a_rejected_candidate_is_built_again_only_with_more_healthy_runs(tmp_path, capsys):
    store = str(tmp_path / "store")
    _import(store, HEALTHY[:10])
    pb.build(store)
    assert main(["profiles", "reject", "llama-l2-d128", "--store", store, "--note", "no"]) == 0
    assert pb.build(store).outcomes[0][1].startswith("a candidate of 10 healthy runs was rejected")
    _import(store, HEALTHY[10:11])
    assert pb.build(store).outcomes[0][1] == "candidate llama-l2-d128 awaits approval"


def test_a_run_whose_warning_a_person_confirmed_is_not_healthy(tmp_path):
    """An acknowledgement stored as the sink stores one (``warnings ack`` sends it on the
    warnings topic) takes the run out of the healthy ones; a silence does not."""
    from foreshock.detectors.alerts import action_event
    from foreshock.storage.acks import warning_states
    from foreshock.storage.reader import open_history
    from foreshock.storage.rows import BatchBuilder
    from foreshock.storage.store import DeltaStore

    store = tmp_path / "store"
    _import(store, FAULTS[:1])
    with open_history(store) as history:
        warning = next(w for w in warning_states(history) if w["family"] == "attention-numerics")
    (run,) = fleet_runs(store)
    assert not run.confirmed  # warned, diverged: a fault, but nobody confirmed anything yet

    def store_event(kind: str, until: float | None = None) -> None:
        """As sent while the warning was open (the run's end resolved it since)."""
        opened = {**warning, "event": "opened"}
        builder = BatchBuilder()
        builder.add_warning(action_event(opened, kind, "ana", until, None), time.time())
        DeltaStore(store).write(builder.take())

    store_event("silenced", time.time() + 60)
    assert not fleet_runs(store)[0].confirmed
    store_event("acknowledged")
    (run,) = fleet_runs(store)
    assert run.confirmed == (warning["id"],) and not run.healthy
    assert run.verdict.startswith("diverged at step")


def test_a_bad_policy_is_refused_and_off_builds_nothing(tmp_path):
    store = str(tmp_path / "store")
    with pytest.raises(pb.BuilderError, match="expected one of auto, approve, off"):
        pb.set_policy(store, "sometimes")
    _import(store, HEALTHY[:10])
    pb.set_policy(store, "off", by="ana")
    assert pb.build(store).outcomes == [] and not pb.candidates(store)


def test_the_worker_builds_after_runs_end_and_again_for_a_run_not_yet_stored(kafka_settings):
    """The hook: ``build_profiles`` runs in its own thread ``build_after`` s after a run
    ended; a run the store did not hold as ended yet is tried again."""
    from foreshock.detectors.worker import DetectorWorker
    from foreshock.operate.detect_commands import default_config
    from foreshock.transport.envelope import Consumed

    calls, stored = [], [set()]

    def build() -> set[str]:
        calls.append(time.monotonic())
        return stored[0]

    worker = DetectorWorker(kafka_settings, default_config(), build_profiles=build, build_after=0.0)
    try:
        for offset, kind in enumerate(("start", "end")):
            message = {"kind": kind, "run_id": "r", "rank": 0, "seq": offset, "attempt": 1}
            worker.process(Consumed(message, "foreshock.metrics", 0, offset))
        for expected in (1, 2):
            worker.refresh()
            worker._builder.join(5)
            assert len(calls) == expected
        stored[0] = {"r"}  # the sink caught up
        worker.refresh()
        worker._builder.join(5)
        worker.refresh()
        assert len(calls) == 3 and not worker._unbuilt
        assert isinstance(worker._builder, threading.Thread)
    finally:
        worker.consumer.close()
