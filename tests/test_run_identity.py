"""Run identity: a run resumed from a checkpoint under its run id is one run with two attempts,
stored whole and detected as if uninterrupted; a second job under a live run id is a stray,
never followed, stored apart and warned of; malformed steps give clear errors, not crashes or
nonsense lead times."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _kafka import service_env

from foreshock.detectors.engine import RunDetector
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.storage import queries, stream_queries
from foreshock.storage.attempts import AttemptTracker
from foreshock.storage.reader import open_history
from foreshock.storage.reconcile import check_streams
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.sink import StorageSink
from foreshock.storage.store import DeltaStore
from foreshock.transport.attempts import attempt_number, restart_of
from foreshock.transport.topics import ensure_topics


def _records(name: str = "fa-lowprec-s1"):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    return run, [{**r, "kind": "metrics"} for r in run.records]


def _feed(detector: RunDetector, messages) -> list:
    return [e for m in messages for e in detector.update(m)]


FIRST, RESUMED = attempt_number(0, 10**15), attempt_number(1, 10**15 - 60 * 10**6)


def test_a_resumed_run_is_detected_as_if_it_never_stopped():
    run, records = _records()
    start = {**run.start, "kind": "start"}
    straight = RunDetector("r", default_config())
    _feed(straight, [start, *records])
    cut = 2 * len(records) // 3  # killed here; the checkpoint was 10 records earlier
    resumed = RunDetector("r", default_config())
    _feed(
        resumed,
        [
            start,
            *({**m, "attempt": FIRST} for m in records[:cut]),
            *({**m, "attempt": RESUMED} for m in records[cut - 10 :]),
        ],
    )
    assert resumed.resumes == [(RESUMED, records[cut - 10]["step"])]
    assert [(a.family, a.module, a.step) for a in resumed.alerts] == [
        (a.family, a.module, a.step) for a in straight.alerts
    ]
    assert straight.alerts and resumed.divergence_step == straight.divergence_step


def test_records_of_a_superseded_attempt_are_ignored_not_merged():
    _, records = _records()
    detector = RunDetector("r", default_config())
    _feed(detector, [{**m, "attempt": FIRST} for m in records[:20]])
    _feed(detector, [{**m, "attempt": RESUMED} for m in records[5:25]])
    _feed(detector, [{**m, "attempt": FIRST} for m in records[20:30]])  # its late spool
    assert detector.ignored == 10 and detector.last_step == records[24]["step"]


def test_one_stray_record_under_a_live_run_never_blinds_its_detectors():
    """An evaluation job reusing a live run's id writes one record (and its start and end):
    the detectors stay on the live attempt — every warning of the uninterrupted run, its
    divergence — skip the stray's messages, and warn of the collision once."""
    run, records = _records()
    start = {**run.start, "kind": "start", "attempt": FIRST}
    straight = RunDetector("r", default_config())
    straight_events = _feed(straight, [start, *({**m, "attempt": FIRST} for m in records)])
    stray_attempt = attempt_number(0, 10**15 + 10**6)  # started later, knows no checkpoint
    t = records[10]["time"]
    stray = [
        {"kind": "start", "attempt": stray_attempt, "time": t, "labels": {"job": "eval"}},
        {"kind": "metrics", "attempt": stray_attempt, "step": 0, "time": t,
         "values": {"loss": 9.0}},
        {"kind": "end", "attempt": stray_attempt, "time": t, "status": "finished"},
    ]  # fmt: skip
    detector = RunDetector("r", default_config())
    live = [{**m, "attempt": FIRST} for m in records]
    events = _feed(detector, [start, *live[:11], *stray, *live[11:]])
    assert straight.alerts and detector.divergence_step == straight.divergence_step
    assert [(a.family, a.module, a.step) for a in detector.alerts] == [
        (a.family, a.module, a.step) for a in straight.alerts
    ]
    collisions = [e for e in events if e.family == "collision"]
    assert [e.event for e in collisions] == ["opened"]
    assert collisions[0].role == "collision"
    assert collisions[0].evidence["stray_attempt"] == stray_attempt
    assert len(events) == len(straight_events) + 1
    assert detector.collisions.records == 3 and detector.ignored == 0


def test_a_fresh_job_after_the_live_one_fell_silent_takes_the_run_over():
    """A job resubmitted by hand after a crash, with no restart count, replaces the run once
    the crashed one has been silent for ``STALE_AFTER_S``; its collision warning, if one
    opened while both wrote, is resolved as having taken over."""
    _, records = _records()
    detector = RunDetector("r", default_config())
    _feed(detector, [{**m, "attempt": FIRST} for m in records[:20]])
    fresh = attempt_number(0, 10**15 + 10**6)
    last = records[19]["time"]
    early = {**records[0], "attempt": fresh, "time": last + 10}
    late = [{**m, "attempt": fresh, "time": last + 400 + i} for i, m in enumerate(records[:5])]
    events = _feed(detector, [early, *late])
    assert detector.resumes == [(fresh, records[0]["step"])]
    cleared = [e for e in events if e.family == "collision" and e.event == "cleared"]
    assert [e.evidence["resolved_by"] for e in cleared] == ["took over"]


def test_two_attempts_are_two_streams_in_the_store_and_overlap_is_flagged(tmp_path):
    """What the store's views do with attempts the sink keeps (a resume, an older attempt's
    late spool): one stream each, and two of one restart count that overlap are flagged."""
    b = BatchBuilder()
    for attempt, steps, t0 in (
        (1, range(0, 20), 100.0),
        (2, range(10, 30), 200.0),
        (3, range(0, 5), 205.0),
    ):
        b.add_lifecycle(
            {"run_id": "r", "kind": "start", "seq": 0, "attempt": attempt, "time": t0}, 0.0
        )
        for seq, step in enumerate(steps, start=1):
            b.add_metrics(
                {
                    "run_id": "r",
                    "attempt": attempt,
                    "seq": seq,
                    "step": step,
                    "time": t0 + seq,
                    "values": {"loss": float(step)},
                },
                0.0,
            )
    DeltaStore(tmp_path / "s").write(b.take())
    with open_history(tmp_path / "s") as history:
        attempts = queries.run_attempts(history, "r")
        assert stream_queries.duplicate_records(history) == []
        _, records, _ = queries.run_records(history, "r")
    assert [
        (a["attempt"], a["number"], a["first_step"], a["last_step"], a["overlaps"])
        for a in attempts
    ] == [(1, 1, 0, 19, False), (2, 2, 10, 29, True), (3, 3, 0, 4, True)]
    assert len(records) == 20 + 20 + 5  # each attempt's steps, once each


def test_the_sink_stores_a_stray_attempt_apart_and_keeps_resumes_and_late_spools():
    tracker = AttemptTracker()
    seen = [
        (a, t, tracker.observe({"run_id": "r", "attempt": a, "time": t}))
        for a, t in ((FIRST, 1.0), (FIRST + 1, 1.5), (FIRST, 2.0), (FIRST + 1, 2.5),
                     (FIRST - 1, 0.5), (RESUMED, 3.0), (FIRST, 3.5))
    ]  # fmt: skip
    apart = [r is not None for _, _, r in seen]
    assert apart == [False, True, False, True, False, False, False]
    assert "stored apart" in seen[1][2] and f"attempt {FIRST} is live" in seen[1][2]


@pytest.mark.parametrize("step", ['"12"', "null", "-1", "true", "9223372036854775808"])
def test_replay_of_a_malformed_step_is_a_clear_error(tmp_path, step):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as file:
        file.write(json.dumps({"kind": "start", "run_id": "bad", "labels": {}}) + "\n")
        file.write(f'{{"kind": "metrics", "step": {step}, "values": {{"loss": 1.0}}}}\n')
    done = subprocess.run(
        [sys.executable, "-m", "foreshock.app.cli", "detect", "--replay", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "step must be an integer" in done.stderr and "Traceback" not in done.stderr


def test_a_warning_after_the_divergence_has_no_lead_time():
    _, records = _records()
    detector = RunDetector("r", default_config())
    _feed(detector, records)
    assert detector.divergence_step is not None
    late = {**records[-1], "step": 10**12}  # a producer's wrong step, far past divergence
    _feed(detector, [late])
    assert all(a.lead_time is None or a.lead_time >= 0 for a in detector.alerts)


def _trainer(kafka_settings, tmp_path, steps: int = 60) -> tuple[list[str], dict]:
    env = {**service_env(kafka_settings), "FORESHOCK_KAFKA_SPOOL_DIR": str(tmp_path / "spool")}
    script = Path(__file__).parent / "_resumable_trainer.py"
    return [sys.executable, str(script), "resumed", str(tmp_path / "ckpt.pt"), str(steps)], env


def test_a_trainer_killed_and_resumed_from_its_checkpoint_is_one_run_stored_whole(
    kafka_settings, tmp_path
):
    """SIGKILL a real trainer after step 35, restart it on a host whose clock is 60 s behind
    (it resumes from its step-29 checkpoint under the same run id): the store holds both
    attempts, each record once, the re-done steps once per attempt, and the run page's data
    show one run with one restart, in the right order (the checkpoint's restart count)."""
    ensure_topics(kafka_settings)
    command, env = _trainer(kafka_settings, tmp_path)
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    delivered = -1
    for line in first.stdout:
        delivered = int(line.split()[1])
        if delivered >= 35:
            break
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    behind = {**env, "CLOCK_OFFSET": "-60"}
    second = subprocess.run(command, env=behind, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    store = tmp_path / "store"
    StorageSink(kafka_settings, store, group_id="sink-resume").run(threading.Event(), idle_exit=4)
    with open_history(store) as history:
        attempts = queries.run_attempts(history, "resumed")
        assert stream_queries.duplicate_records(history) == []
        assert stream_queries.value_count_mismatches(history) == []
        checks = {c.attempt: c for c in check_streams(history)}
        steps = history.sql(
            "SELECT attempt, step FROM steps WHERE run_id = 'resumed' ORDER BY ALL"
        ).to_pylist()
        fleet = [r["run_id"] for r in queries.fleet(history)]
    assert fleet == ["resumed"]  # one run
    one, two = attempts
    assert (one["number"], one["first_step"], one["ended"]) == (1, 0, False)
    assert one["last_step"] >= delivered >= 35
    assert (two["number"], two["first_step"], two["last_step"], two["ended"]) == (2, 30, 59, True)
    assert not one["overlaps"] and not two["overlaps"]
    mine = {
        a: [s["step"] for s in steps if s["attempt"] == a] for a in (one["attempt"], two["attempt"])
    }
    assert mine[one["attempt"]] == list(range(one["last_step"] + 1))  # everything sent, once
    assert mine[two["attempt"]] == list(range(30, 60))
    assert checks[two["attempt"]].status == "complete"
    assert checks[one["attempt"]].status == "open" and checks[one["attempt"]].missing == []
    from foreshock.dashboard.charts import restart_steps

    assert restart_steps(attempts) == [(1, 30)]
    assert (restart_of(one["attempt"]), restart_of(two["attempt"])) == (0, 1)


def test_two_jobs_under_one_run_id_are_kept_apart_and_reported(kafka_settings, tmp_path):
    """Two producers claim run id ``twin`` at once (two jobs, one name, neither resuming the
    other): the run's tables hold one job's records — the attempt the broker gave first —
    and every message of the other is stored apart, a dead letter with the reason."""
    from foreshock.delivery.kafka_sink import KafkaSink

    ensure_topics(kafka_settings)
    _, records = _records()
    jobs = [KafkaSink(kafka_settings, name=f"job-{i}") for i in range(2)]
    assert jobs[0].attempt != jobs[1].attempt
    for record in records[:30]:
        for job in jobs:
            job.write({**record, "run_id": "twin"})
    for job in jobs:
        job.close()
        assert job.pending() == 0
    store = tmp_path / "store"
    StorageSink(kafka_settings, store, group_id="sink-twin").run(threading.Event(), idle_exit=4)
    with open_history(store) as history:
        attempts = queries.run_attempts(history, "twin")
        letters = queries.dead_letters(history)
        assert stream_queries.duplicate_records(history) == []
    assert len(attempts) == 1 and attempts[0]["records"] == 30 and not attempts[0]["overlaps"]
    (stray,) = {j.attempt for j in jobs} - {attempts[0]["attempt"]}
    assert len(letters) >= 30 and all("run id collision" in d["reason"] for d in letters)
    with open_history(store) as history:
        raw = history.sql("SELECT raw FROM dead_letters").to_pylist()
    kept = [json.loads(r["raw"]) for r in raw]
    assert {m["attempt"] for m in kept} == {stray}  # the other job's messages, whole
    assert sum(m.get("kind", "metrics") == "metrics" for m in kept) == 30


def test_two_producers_claiming_one_attempt_are_reported(kafka_settings, tmp_path):
    """Two jobs given the same explicit attempt: the second one's seqs look like duplicates;
    its ``start`` (another producer) is dead-lettered as a collision instead of vanishing."""
    from foreshock.delivery.kafka_sink import KafkaSink

    ensure_topics(kafka_settings)
    _, records = _records()
    for name in ("job-a", "job-b"):
        job = KafkaSink(kafka_settings, name=name, attempt=7)
        job.write(
            {
                "schema": "foreshock.run/1",
                "kind": "start",
                "run_id": "same",
                "labels": {},
                "time": 1.0 if name == "job-a" else 2.0,
            }
        )
        for record in records[:5]:
            job.write({**record, "run_id": "same"})
        job.close()
    store = tmp_path / "store"
    StorageSink(kafka_settings, store, group_id="sink-same").run(threading.Event(), idle_exit=4)
    with open_history(store) as history:
        letters = [d["reason"] for d in queries.dead_letters(history)]
    assert len(letters) == 1 and "claimed by two producers" in letters[0]


def test_warnings_continue_through_a_restart_on_the_live_worker(kafka_settings):
    """The shipped fa-lowprec run sent by a producer that dies two thirds in, then by a new one
    resuming from its checkpoint 10 records back (a new attempt, restart count 1): the live
    worker's warnings are those of the uninterrupted run (same ids, families, modules and
    steps), no more and no fewer."""
    from foreshock.delivery.kafka_sink import KafkaSink
    from foreshock.detectors.worker import DetectorWorker

    ensure_topics(kafka_settings)
    run, records = _records()
    cut = 2 * len(records) // 3
    first = KafkaSink(kafka_settings, name="first", confirm_group=None)
    first.write({**run.start, "run_id": "restarted"})
    for record in records[:cut]:
        first.write({**record, "run_id": "restarted"})
    assert first.wait_delivered(30)
    first._sender.closing.set()  # dies: no end message (what a SIGKILL leaves)
    second = KafkaSink(kafka_settings, name="second", confirm_group=None, restart=1)
    second.write({**run.start, "run_id": "restarted"})
    for record in [*records[cut - 10 :]]:
        second.write({**record, "run_id": "restarted"})
    second.write({**run.end, "run_id": "restarted"})
    second.close()
    DetectorWorker(kafka_settings, default_config(), group_id="det-restart").run(
        threading.Event(), idle_exit=4
    )
    live = _warnings_topic(kafka_settings)
    straight = RunDetector("restarted", default_config())
    _feed(straight, [{**run.start, "kind": "start"}, *records])
    # the resume resolves what the first attempt left open ("superseded"), and the steps
    # re-done raise their warnings again as new ones (new ids: a receiver told of the old
    # one's end hears of them): as warnings, exactly the uninterrupted run's
    opened = {(w["family"], w["module"], w["step"]) for w in live if w["event"] == "opened"}
    assert opened == {(a.family, a.module, a.step) for a in straight.alerts} and opened
    resumed_at = records[cut - 10]["step"]
    first = next(i for i, w in enumerate(live) if w["evidence"].get("resolved_by") == "superseded")
    before, after = live[:first], live[first:]
    opened_before = {w["id"]: w for w in before if w["event"] == "opened"}
    abandoned = {i for i, w in opened_before.items() if w["step"] >= resumed_at}
    superseded = {w["id"] for w in after if w["evidence"].get("resolved_by") == "superseded"}
    assert abandoned and abandoned <= superseded  # resolved when the resume was seen
    reopened = {w["id"]: w for w in after if w["event"] == "opened"}
    assert reopened and not set(reopened) & set(opened_before)  # new warnings, new ids
    assert {(w["family"], w["module"], w["step"]) for w in reopened.values()} >= {
        (a.family, a.module, a.step) for a in straight.alerts if a.step >= resumed_at
    }
    still_open = {w["id"] for w in live if w["event"] == "opened"} - {
        w["id"] for w in live if w["event"] == "cleared"
    }
    assert not still_open  # the run ended: nothing left open
    # Alertmanager hears each superseded warning end (endsAt), with the reason
    ended = _alertmanager_ends(kafka_settings, "notify-restart")
    assert superseded <= set(ended)
    assert all("the run resumed from an earlier step" in ended[i] for i in superseded)


def _warnings_topic(settings) -> list[dict]:
    """Every event on the warnings topic, from the start."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": "read-all",
         "enable.auto.commit": False}
    )  # fmt: skip
    consumer.assign(
        [TopicPartition(settings.warnings_topic, p, 0) for p in range(settings.partitions)]
    )
    events, quiet = [], 0
    while quiet < 15:
        message = consumer.poll(0.2)
        quiet = 0 if message is not None and not message.error() else quiet + 1
        if quiet == 0:
            events.append(json.loads(message.value()))
    consumer.close()
    return events


def test_a_stray_job_under_a_live_run_id_is_stored_apart_and_warned_of(kafka_settings, tmp_path):
    """An evaluation job reuses a live run's id and writes its start, one record and its end
    while the run trains on (through the broker, the live worker and the storage sink): the
    run is warned exactly as if alone, one ``collision`` warning says another job wrote, the
    fleet page shows the live run's status (diverged, not the stray's ``finished``) with the
    collision flagged, and the stray's messages are kept whole, apart, as dead letters."""
    from foreshock.delivery.kafka_sink import KafkaSink
    from foreshock.detectors.worker import DetectorWorker

    ensure_topics(kafka_settings)
    run, records = _records()
    now = time.time()  # the producers' clocks: both jobs send now, 0.1 s a record
    records = [{**r, "time": now + 0.1 * i} for i, r in enumerate(records)]
    live = KafkaSink(kafka_settings, name="live", confirm_group=None)
    live.write({**run.start, "run_id": "shared"})
    for record in records[:10]:
        live.write({**record, "run_id": "shared"})
    assert live.wait_delivered(30)
    stray = KafkaSink(kafka_settings, name="eval", confirm_group=None)  # no restart count
    t = records[9]["time"]
    stray.write({"schema": "foreshock.run/1", "kind": "start", "run_id": "shared", "time": t,
                 "labels": {"job": "eval"}})  # fmt: skip
    stray.write({**records[0], "run_id": "shared", "time": t, "values": {"loss": 9.0}})
    stray.write({"kind": "end", "run_id": "shared", "status": "finished", "time": t})
    stray.close()
    for record in records[10:]:
        live.write({**record, "run_id": "shared"})
    live.write({**run.end, "run_id": "shared"})
    live.close()
    DetectorWorker(kafka_settings, default_config(), group_id="det-stray").run(
        threading.Event(), idle_exit=4
    )
    store = tmp_path / "store"
    StorageSink(kafka_settings, store, group_id="sink-stray").run(threading.Event(), idle_exit=4)
    events = _warnings_topic(kafka_settings)
    straight = RunDetector("shared", default_config())
    _feed(straight, [{**run.start, "kind": "start"}, *records])
    opened = [w for w in events if w["event"] == "opened"]
    mechanisms = {
        (w["family"], w["module"], w["step"]) for w in opened if w["family"] != "collision"
    }
    assert mechanisms == {(a.family, a.module, a.step) for a in straight.alerts} != set()
    assert [w["role"] for w in opened if w["family"] == "collision"] == ["collision"]
    with open_history(store) as history:
        (row,) = queries.fleet(history, run_id="shared")
        attempts = queries.run_attempts(history, "shared")
        raw = [
            json.loads(r["raw"]) for r in history.sql("SELECT raw FROM dead_letters").to_pylist()
        ]
    assert row["status"] == "diverged" and row["collisions"] == 1
    assert [a["attempt"] for a in attempts] == [live.attempt]
    assert sorted(m.get("kind", "metrics") for m in raw) == ["end", "metrics", "start"]
    assert {m["attempt"] for m in raw} == {stray.attempt}


def _alertmanager_ends(settings, group: str) -> dict[str, str]:
    """Warning id -> description of each alert a notifier posted to Alertmanager with an
    ``endsAt`` (resolved), reading the warnings topic from the start."""
    from test_notify import DASH, Receiver

    from foreshock.notify.notifier import Notifier, NotifyConfig
    from foreshock.notify.targets import Target

    receiver = Receiver()
    try:
        target = Target("alertmanager", receiver.url("/am"))
        config = NotifyConfig([target], DASH, group_id=group, refresh=0)
        Notifier(settings, config).run(threading.Event(), idle_exit=3)
        posted = [a for body in receiver.bodies("/am/api/v2/alerts") for a in body]
    finally:
        receiver.close()
    ended = [a["annotations"]["description"] for a in posted if "endsAt" in a]
    return {text.split()[3]: text for text in ended}  # "foreshock FAMILY warning ID (role)…"
