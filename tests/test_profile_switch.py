"""Live runs switch to a profile published while they train (detectors/profile_switch.py)."""

from __future__ import annotations

import pytest

from foreshock.app.cli import main
from foreshock.app.harness import Replay
from foreshock.detectors import profile_switch
from foreshock.detectors.profile_switch import MAX_KEPT, switch
from foreshock.detectors.profiles import load_profiles, merged, shipped_profiles
from foreshock.detectors.registry import profiles_folder
from foreshock.detectors.streams import RunStreams
from foreshock.lab.recorded import RECORDED_DIR, load_run
from foreshock.operate import profile_builder as pb

LLAMA = RECORDED_DIR / "llama"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The shipped profiles, and those with the store's Llama profile built from 10 runs."""
    store = tmp_path_factory.mktemp("switch") / "store"
    healthy = [str(LLAMA / f"llama-healthy-s{seed}.jsonl.gz") for seed in range(10)]
    assert main(["store", "import", "--store", str(store), *healthy]) == 0
    assert pb.build(store, "auto").published == ["llama-l2-d128"]
    return shipped_profiles(), merged(shipped_profiles(), load_profiles(profiles_folder(store)))


def _messages(name: str) -> list[dict]:
    replay = Replay(load_run(LLAMA / name), name, interval=0)
    return [replay.message(j) for j in range(len(replay))]


def _key(events) -> list[tuple]:
    return [(e.id, e.event, e.family, e.module, e.step, e.role, e.statistic) for e in events]


def test_a_switched_run_warns_as_if_the_new_profile_had_judged_it_from_its_start(published):
    """Half-way through a fault run judged zero-shot, the Llama profile is published: the run
    switches at the record boundary, and every event after it equals a run judged by the new
    profile from its first record; the event says from what, to what, and after which step."""
    before, after = published
    messages = _messages("llama-fa-lowprec-s1.jsonl.gz")
    live = RunStreams("r", before, keep=MAX_KEPT)
    cut = 12
    early = [e for m in messages[:cut] for e in live.update(m)]
    assert live.profile.name == "zero-shot" and live.keeping and not early
    moved = switch(live, after)
    assert moved is not None
    rebuilt, event = moved
    assert (event.from_profile, event.to_profile) == ("zero-shot", "llama-l2-d128")
    assert event.step == messages[cut - 1]["step"] and "calibrated on llama" in event.reason
    assert event.to_dict()["action"] == "switched"
    reference = RunStreams("r", after)
    for m in messages[:cut]:
        reference.update(m)
    rest = [e for m in messages[cut:] for e in rebuilt.update(m)]
    expected = [e for m in messages[cut:] for e in reference.update(m)]
    assert rest and _key(rest) == _key(expected)
    assert rebuilt.profile.name == "llama-l2-d128" and not rebuilt.keeping


def test_no_switch_with_an_open_warning_past_the_bound_or_to_the_same_profile(
    published, monkeypatch
):
    before, after = published
    messages = _messages("llama-fa-lowprec-s1.jsonl.gz")
    warned = RunStreams("r", before, keep=MAX_KEPT)
    for m in messages[:-1]:
        warned.update(m)
        if warned.alerts_open:
            break
    assert warned.alerts_open and switch(warned, after) is None  # closed by its own detector
    unchanged = RunStreams("r", before, keep=MAX_KEPT)
    for m in messages[:5]:
        unchanged.update(m)
    assert switch(unchanged, before) is None  # the config still chooses the fallback
    monkeypatch.setattr(profile_switch, "MAX_KEPT", 3)
    long = RunStreams("r", before, keep=3)
    for m in messages[:5]:
        long.update(m)
    assert not long.keeping and not long.kept and switch(long, after) is None
    never = RunStreams("r", before)  # a worker with nothing to reload keeps nothing
    for m in messages[:5]:
        never.update(m)
    assert not never.kept and switch(never, after) is None


def test_the_worker_switches_its_live_runs_and_hands_each_switch_on(published):
    """The worker's side (``DetectorWorker._switch_live``, run at each reload): the live run
    judged zero-shot is replaced, counted and handed to ``on_switch`` (the store's lineage
    under ``foreshock detect --store``); a run of another model stays as it was."""
    from types import SimpleNamespace

    from foreshock.detectors.worker import DetectorWorker, WorkerConfig, WorkerStats

    before, after = published
    seen: list[dict] = []
    worker = SimpleNamespace(
        runs={},
        detectors=after,
        stats=WorkerStats(),
        config=WorkerConfig(before, on_switch=seen.append),
    )
    for name in ("llama-fa-lowprec-s1.jsonl.gz", "../deepseek-v3/deepseek-v3-healthy-s0.jsonl.gz"):
        run = worker.runs[name] = RunStreams(name, before, keep=MAX_KEPT)
        for m in _messages(name)[:8]:
            run.update(m)
    other = worker.runs["../deepseek-v3/deepseek-v3-healthy-s0.jsonl.gz"]
    DetectorWorker._switch_live(worker)
    assert (
        worker.stats.switched == 1
        and worker.runs["../deepseek-v3/deepseek-v3-healthy-s0.jsonl.gz"] is other
    )
    assert worker.runs["llama-fa-lowprec-s1.jsonl.gz"].profile.name == "llama-l2-d128"
    assert [(e["run_id"], e["to_profile"]) for e in seen] == [
        ("llama-fa-lowprec-s1.jsonl.gz", "llama-l2-d128")
    ]
