"""A producer that nothing it sends, and no disk, can kill (issue 19): records at and over the
size limit, a spool holding a record the broker refuses, a full or unwritable spool folder.
Every test goes through the real broker and a real KafkaSink; the "training loop" is the test
itself, which must never see an exception."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from _kafka import Collector, has_end, spool_flush
from confluent_kafka import KafkaException, Producer

from foreshock.delivery import spool as spool_module
from foreshock.delivery.kafka_sink import RECORD_OVERHEAD, KafkaSink
from foreshock.delivery.spool import Spool, SpooledMessage
from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import ensure_topics
from foreshock.transport.wire import MAX_MESSAGE_BYTES

METRICS = "foreshock.metrics/1"
DROPPED = "spool unwritable, memory buffer full"


def _record(run_id: str, step: int, pad: int = 0) -> dict:
    values = {"loss": 3.0 - step / 100}
    values |= {f"attn.d2.entropy@model.layers.{i}.attn": 0.5 for i in range(pad // 40)}
    return {"schema": METRICS, "run_id": run_id, "step": step, "values": values}


def _sized(run_id: str, step: int, seq: int, size: int, attempt: int = 0) -> dict:
    """A metrics record of per-head series (layers x heads x metrics, as a large model's)
    whose wire message, numbered ``seq`` (and ``attempt``) by the sink, is exactly ``size``
    bytes."""
    record = {"schema": METRICS, "run_id": run_id, "step": step, "values": {}}
    values, used = (
        record["values"],
        len(_wire({**record, "kind": "metrics", "rank": 0, "seq": seq, "attempt": attempt})),
    )
    metric = 0
    while used < size - 200:
        for layer in range(80):
            for head in range(64):
                key = f"attn.m{metric}@model.layers.{layer}.self_attn#h{head}"
                values[key] = 0.123456789
                used += len(key) + len(",'':0.123456789")
                if used >= size - 200:
                    break
            if used >= size - 200:
                break
        metric += 1
    message = {**record, "kind": "metrics", "rank": 0, "seq": seq, "attempt": attempt}
    pad = size - len(_wire(message)) - len(',"pad@":0.0')
    values["pad@" + "m" * pad] = 0.0
    assert len(_wire(message)) == size
    return record


def _delivered(settings, run: str) -> dict[int, dict]:
    """The run's messages on the metrics topic by seq, once its end has arrived."""
    collector = Collector(settings)
    try:
        assert collector.wait_for(has_end(run), 60)
    finally:
        collector.close()
    return {m["seq"]: m for m in collector.messages if m["run_id"] == run}


def _wire(message: dict) -> bytes:
    """The bytes ``encode`` makes, for any size (it refuses more than 1,000,000)."""
    return json.dumps(message, allow_nan=False, separators=(",", ":")).encode()


def _received(message: dict) -> bytes:
    return _wire({k: v for k, v in message.items() if not k.startswith("_")})


def _rejects(sink: KafkaSink) -> list[dict]:
    return [json.loads(line) for line in sink.rejects_path.read_text().splitlines()]


def _largest_accepted(producer: Producer, topic: str, key: bytes) -> int:
    """The largest value ``produce()`` takes under ``key`` (binary search, nothing sent)."""
    low, high = 0, 2 * MAX_MESSAGE_BYTES
    while low < high:
        middle = (low + high + 1) // 2
        try:
            producer.produce(topic, key=key, value=b"x" * middle)
            producer.purge()
            low = middle
        except KafkaException:
            high = middle - 1
    return low


def test_the_size_limit_is_the_clients_real_one(kafka_settings):
    """librdkafka counts key, value and 36 bytes of record framing against message.max.bytes:
    with its default it refused wire-valid messages above 999,959 bytes (key "run-limit":
    999,955). The sink raises the client's limit so the wire's 1,000,000 binds, and computes
    the limit from the client's config when a user sets a smaller one."""
    ensure_topics(kafka_settings)
    key, topic = b"run-limit", kafka_settings.metrics_topic
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})  # all defaults
    largest = _largest_accepted(raw, topic, key)
    assert largest == 1_000_000 - RECORD_OVERHEAD - len(key) == 999_955
    raw.produce(topic, key=key, value=b"x" * largest)
    assert raw.flush(30) == 0  # and the broker takes it
    sink = KafkaSink(kafka_settings, confirm_group=None)
    capped = KafkaSink(
        replace(kafka_settings, client={"message.max.bytes": "1000000"}), confirm_group=None
    )
    try:
        assert sink.max_value_bytes(key) == MAX_MESSAGE_BYTES
        assert capped.max_value_bytes(key) == largest
    finally:
        sink.close()
        capped.close()


def test_records_of_999_990_bytes_and_5_mb_are_stored_or_refused_with_a_reason(
    kafka_settings, tmp_path
):
    """999,990 and 1,000,000 bytes (the wire's limit) are delivered and stored whole; 5 MB is
    refused: kept in the rejects file, counted, and its step stored as a flagged stand-in, so
    the run is complete and says what it lacks."""
    from foreshock.storage.reader import open_history
    from foreshock.storage.reconcile import check_streams
    from foreshock.storage.sink import StorageSink

    run, sizes = "run-big", {1: 999_990, 2: MAX_MESSAGE_BYTES, 3: 5_000_000}
    sink = KafkaSink(kafka_settings, confirm_group=None)
    records = [
        _sized(run, s, s + 1, sizes[s], sink.attempt) if s in sizes else _record(run, s)
        for s in range(6)
    ]
    for record in records:
        sink.write(record)  # the training loop: no exception, never blocked
    sink.write({"schema": "foreshock.run/1", "kind": "end", "run_id": run, "status": "finished"})
    sink.close(timeout=30)
    assert (sink.rejected, dict(sink.reasons), sink.dropped, sink.errors) == (
        1,
        {"too large": 1},
        0,
        0,
    )
    [rejected] = _rejects(sink)
    assert (rejected["seq"], rejected["step"], rejected["reason"]) == (4, 3, "too large")
    assert json.loads(rejected["value"])["values"] == records[3]["values"]  # kept whole

    got = _delivered(kafka_settings, run)
    assert sorted(got) == list(range(8))  # start, 6 steps, end: no gap
    assert len(_received(got[2])) == 999_990 and len(_received(got[3])) == 1_000_000
    stand_in = got[4]
    assert stand_in["step"] == 3 and stand_in["values"] == {}
    assert stand_in["flags"] == ["producer_rejected"] and "too large" in stand_in["error"]
    assert got[7]["rejected"]["count"] == 1 and got[7]["status"] == "finished"

    store = tmp_path / "store"
    StorageSink(kafka_settings, store, group_id="big-sink", max_wait=0.3).run(
        threading.Event(), idle_exit=3
    )
    with open_history(store) as history:
        [check] = [c for c in check_streams(history) if c.run_id == run]
        counts = history.sql(
            "SELECT step, count(*) AS n FROM metric_values WHERE run_id = ? "
            "GROUP BY step ORDER BY step",
            [run],
        ).to_pylist()
        flags = history.sql(
            "SELECT flags FROM steps WHERE run_id = ? AND step = 3", [run]
        ).to_pylist()
    assert check.status == "complete"
    assert {c["step"]: c["n"] for c in counts} == {
        s: len(r["values"]) for s, r in enumerate(records) if s != 3
    }
    assert json.loads(flags[0]["flags"]) == ["producer_rejected"]


def test_a_record_the_client_refuses_does_not_kill_the_sending_thread(kafka_settings):
    """A user caps message.max.bytes: a 999,990-byte record is refused in ``write`` by the
    computed limit. A limit gotten wrong is caught too: ``produce()`` raising
    MSG_SIZE_TOO_LARGE in the sending thread quarantines that message, and the ones after
    it still go."""
    settings = replace(kafka_settings, client={"message.max.bytes": "1000000"})
    sink = KafkaSink(settings, confirm_group=None)
    run = "run-capped"
    sink.write(_record(run, 0))
    sink.write(_sized(run, 1, 2, 999_990, sink.attempt))  # over this client's limit
    assert sink.wait_delivered(30)
    sink._encoder.max_message_bytes = 10_000_000  # as if the limit were wrong: produce() decides
    sink.write(_sized(run, 2, 3, 999_990, sink.attempt))
    sink.write(_record(run, 3))
    sink.close(timeout=30)
    assert sink._sender.thread.is_alive() is False and sink.errors == 0
    assert dict(sink.reasons) == {"too large": 1, "refused by the client": 1}
    assert [r["seq"] for r in _rejects(sink)] == [2, 3]
    assert "MSG_SIZE_TOO_LARGE" in _rejects(sink)[1]["detail"]
    got = _delivered(settings, run)
    assert sorted(got) == list(range(6))
    assert [got[s]["flags"] for s in (2, 3)] == [["producer_rejected"]] * 2
    assert got[4]["values"]["loss"] == 2.97


def test_a_message_in_the_sending_threads_hands_is_not_yet_delivered(kafka_settings):
    """``wait_delivered`` is what a trainer trusts before a SIGKILL can take nothing away: a
    message the thread has taken off the queue but not yet handed to the producer is neither
    queued nor in flight, and must not count as delivered (CI saw step 35 lost this way)."""
    sink = KafkaSink(kafka_settings, confirm_group=None)
    assert sink.wait_delivered(30)
    holding, release = threading.Event(), threading.Event()
    send = sink._sender._send

    def held_send(item, callback, wait):
        holding.set()
        release.wait(30)
        return send(item, callback, wait)

    sink._sender._send = held_send
    try:
        sink.write(_record("run-held", 0))
        assert holding.wait(30) and sink._sender.messages.empty()
        assert not sink.wait_delivered(0.5)  # taken off the queue, not yet produced
    finally:
        release.set()
    assert sink.wait_delivered(30)
    sink.close(timeout=30)
    got = _delivered(kafka_settings, "run-held").values()
    assert [m["step"] for m in got if m.get("kind", "metrics") == "metrics"] == [0]


def test_an_unexpected_exception_in_the_sending_thread_is_counted_and_it_carries_on(
    kafka_settings, caplog
):
    """Whatever a turn of the sending loop raises is counted and logged; the next turn goes on
    (here: its spool fsync raises on up to three turns)."""
    sink = KafkaSink(kafka_settings, confirm_group=None)
    calls = {"n": 0}

    def failing_sync() -> None:
        calls["n"] += 1
        if calls["n"] <= 3:
            raise RuntimeError("simulated")

    sink._spool.sync = failing_sync
    with caplog.at_level(logging.ERROR):
        for step in range(5):
            sink.write(_record("run-flaky", step))
        sink.close(timeout=30)
    assert 1 <= sink.errors == min(calls["n"], 3)
    assert "unexpected error in the Kafka sink's sending thread" in caplog.text
    collector = Collector(kafka_settings)
    try:
        assert collector.wait_for(has_end("run-flaky"), 60)
    finally:
        collector.close()
    assert sorted(m["seq"] for m in collector.messages) == list(range(7))


def test_a_spool_holding_a_record_the_broker_refuses_is_quarantined_and_flush_clears_it(
    kafka_settings,
):
    """An earlier run spooled a 1.2 MB message (as versions before the size check did). It no
    longer kills every sink that adopts the spool: ``foreshock spool flush`` quarantines it,
    sends its stand-in and everything behind it, and empties the spool."""
    spool_dir = Path(kafka_settings.spool_dir)
    run = "run-poison"
    messages = [
        {"kind": "start", "schema": "foreshock.run/1", "run_id": run, "rank": 0, "seq": 0},
        {**_sized(run, 0, 1, 1_200_000), "kind": "metrics", "rank": 0, "seq": 1, "attempt": 0},
        {**_record(run, 1), "kind": "metrics", "rank": 0, "seq": 2},
        {
            "kind": "end",
            "schema": "foreshock.run/1",
            "run_id": run,
            "rank": 0,
            "seq": 3,
            "last_seq": 3,
            "status": "finished",
        },
    ]
    old = Spool(spool_dir, "old-run")
    old.append_many(
        [SpooledMessage(kafka_settings.metrics_topic, run.encode(), _wire(m)) for m in messages]
    )
    old.close(delete_if_empty=False)
    flush = spool_flush(kafka_settings, 30)
    assert flush.returncode == 0, flush.stderr
    assert "0 bytes still spooled" in flush.stdout and "Traceback" not in flush.stderr
    assert not list(spool_dir.glob("*.spool"))
    [rejects] = spool_dir.glob("*.rejects")
    [line] = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert (line["seq"], line["reason"], line["bytes"]) == (1, "too large", 1_200_000)
    got = _delivered(kafka_settings, run)
    assert sorted(got) == [0, 1, 2, 3] and got[1]["flags"] == ["producer_rejected"]


def test_a_spool_for_a_topic_the_broker_does_not_have_is_set_aside_not_waited_on(
    kafka_settings,
):
    """An earlier run's spool holds three messages for a topic the broker no longer has (a
    renamed prefix), then a whole run for the live topic. They used to time out as if the
    broker were down, forever, and hold up everything behind them; now they are set aside
    (``.stranded``, in the spool's format, named in the log) and the rest is delivered."""
    spool_dir = Path(kafka_settings.spool_dir)
    run, gone = "run-renamed", "foreshock.metrics.renamed-away"
    old_topic = [SpooledMessage(gone, b"old", _wire(_record("old", s))) for s in range(3)]
    messages = [
        {"kind": "start", "schema": "foreshock.run/1", "run_id": run, "rank": 0, "seq": 0},
        {**_record(run, 1), "kind": "metrics", "rank": 0, "seq": 1},
        {
            "kind": "end",
            "schema": "foreshock.run/1",
            "run_id": run,
            "rank": 0,
            "seq": 2,
            "last_seq": 2,
            "status": "finished",
        },
    ]
    live = [SpooledMessage(kafka_settings.metrics_topic, run.encode(), _wire(m)) for m in messages]
    old = Spool(spool_dir, "renamed-run")
    old.append_many([*old_topic, *live])
    old.close(delete_if_empty=False)
    flush = spool_flush(kafka_settings, 30)
    assert flush.returncode == 0, flush.stderr
    assert "3 messages delivered, 0 bytes still spooled, 3 set aside" in flush.stdout
    assert f"the broker has no topic '{gone}': 3 spooled messages" in flush.stderr
    assert not list(spool_dir.glob("*.spool"))
    [stranded] = spool_dir.glob("*.stranded")
    kept = [json.loads(line) for line in stranded.read_text().splitlines()]
    assert [(k["t"], json.loads(k["v"])["step"]) for k in kept] == [(gone, 0), (gone, 1), (gone, 2)]
    assert sorted(_delivered(kafka_settings, run)) == [0, 1, 2]


@pytest.mark.slow
def test_an_unwritable_spool_folder_keeps_messages_in_memory_until_the_broker_is_back(
    tmp_path, caplog
):
    """The spool folder can't be made (here: its parent is a file, which holds for root too).
    The constructor says so instead of raising, spools in memory while the broker is away,
    and delivers all of it once the broker is back. ``write`` after ``close`` is refused."""
    port = free_port()
    (tmp_path / "a-file").write_text("")
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        metrics_topic="nodir.m",
        deadletter_topic="nodir.d",
        partitions=2,
        spool_dir=str(tmp_path / "a-file" / "spool"),
    )
    with caplog.at_level(logging.WARNING):
        sink = KafkaSink(settings, probe_interval=0.2, max_probe_interval=0.5, confirm_group=None)
        for step in range(20):
            sink.write(_record("run-nodir", step))
    assert "cannot write the spool folder" in caplog.text and sink.spool_error
    deadline = time.monotonic() + 20
    while sink.spooled < 21 and time.monotonic() < deadline:  # the broker found away
        time.sleep(0.05)
    assert "FORESHOCK_KAFKA_SPOOL_DIR" in caplog.text
    broker = EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log").start()
    try:
        sink.close(timeout=30)
        sink.write(_record("run-nodir", 20))
        collector = Collector(settings)
        try:
            assert collector.wait_for(has_end("run-nodir"), 60)
        finally:
            collector.close()
    finally:
        broker.stop(timeout=1)  # Tansu lingers 5 s on SIGTERM
    assert sorted(m["seq"] for m in collector.messages) == list(range(22))
    assert sink.spooled in (21, 22) and (sink.dropped, sink.errors, sink.pending()) == (0, 0, 0)
    assert dict(sink.reasons) == {"closed": 1}


@pytest.mark.slow
def test_enospc_at_the_file_write_layer_never_reaches_the_training_loop(tmp_path, monkeypatch):
    """The spool's disk fills after 20 kB: every write below the spool (not the spool's own
    logic) fails with ENOSPC after a partial write, as a full filesystem does. No broker at
    all, so nothing can be delivered: the loop never sees an exception, ``close`` returns,
    the spool file holds only whole messages, and every message not in it is counted."""
    written = {"bytes": 0}
    real_write = spool_module.write_all

    def disk_of_20_kb(fd: int, data: bytes) -> None:
        room = 20_000 - written["bytes"]
        if len(data) > room:
            os.write(fd, data[: max(room, 0)])  # a full disk takes part of it, then refuses
            written["bytes"] += max(room, 0)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)
        written["bytes"] += len(data)

    monkeypatch.setattr(spool_module, "write_all", disk_of_20_kb)
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        metrics_topic="enospc.m",
        deadletter_topic="enospc.d",
        spool_dir=str(tmp_path / "spool"),
    )
    sink = KafkaSink(
        settings, probe_interval=0.5, queue_size=4, memory_bytes=60_000, confirm_group=None
    )
    for step in range(100):
        sink.write(_record("run-enospc", step, pad=1_000))  # ~1.1 kB each, 110 kB in all
    sink.close(timeout=0.5)
    lines = Path(sink.spool_path).read_text().splitlines()
    on_disk = [json.loads(json.loads(line)["v"])["seq"] for line in lines]  # all whole
    assert len(set(on_disk)) == len(on_disk) > 0
    assert sink.spool_error and "No space left on device" in sink.spool_error
    assert sink.reasons[DROPPED] > 0 and sink.reasons["unsent at close, spool unwritable"] > 0
    assert len(on_disk) + sink.dropped == 102 and sink.errors == 0  # start, 100 steps, end


def _mount_namespace() -> list[str] | None:
    """A command prefix that runs its command in a private mount namespace where it may mount
    a tmpfs (root: ``unshare --mount``; others: a user namespace), or None where it can't."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    probe = subprocess.run(
        [*prefix, "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /tmp"],
        capture_output=True,
        timeout=30,
    )
    return prefix if probe.returncode == 0 else None


@pytest.mark.slow
def test_a_spool_on_a_full_tmpfs_never_reaches_the_training_loop(tmp_path):
    """A real full filesystem: a 64 kB tmpfs as the spool folder, the broker away. A training
    loop of 200 records (~2 kB each) fills it, goes on in a 200 kB memory buffer, and drops
    (counting) what fits in neither; the broker then comes back and ``close`` delivers
    everything that was kept, start and end included: the run ends."""
    prefix = _mount_namespace()
    if prefix is None:
        pytest.skip(
            "cannot mount a tmpfs here (no unshare, or no mount namespaces); "
            "test_enospc_at_the_file_write_layer covers the same failure"
        )
    port, mount = free_port(), tmp_path / "tmpfs"
    mount.mkdir()
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        metrics_topic="full.m",
        deadletter_topic="full.d",
        partitions=2,
        spool_dir=str(mount / "spool"),
    )
    config = {
        "settings": {
            "bootstrap_servers": settings.bootstrap_servers,
            "metrics_topic": "full.m",
            "deadletter_topic": "full.d",
            "partitions": 2,
            "spool_dir": settings.spool_dir,
        },
        "run": "run-tmpfs",
        "steps": 200,
        "memory_bytes": 200_000,
    }
    child = subprocess.Popen(
        [
            *prefix,
            "sh",
            "-c",
            'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"',
            str(mount),
            sys.executable,
            __file__,
        ],
        env={**os.environ, "FORESHOCK_TEST_CHILD": json.dumps(config)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    broker = None
    try:
        assert child.stdout.readline().strip() == "written", child.communicate(timeout=30)
        broker = EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log").start()
        out, err = child.communicate("go\n", timeout=120)
        assert child.returncode == 0, err
        stats = json.loads(out.splitlines()[-1])
        collector = Collector(settings)
        try:
            assert collector.wait_for(
                lambda m: len({x["seq"] for x in m}) >= 202 - stats["dropped"], 60
            )
        finally:
            collector.close()
    finally:
        child.kill()
        if broker is not None:
            broker.stop(timeout=1)
    assert "Traceback" not in err and "No space left on device" in err
    assert err.count("cannot write the spool") == 1  # said loudly, once
    assert stats["errors"] == 0 and stats["pending"] == 0 and stats["spooled_to_disk"] > 10
    assert stats["dropped"] > 0 and stats["reasons"] == {DROPPED: stats["dropped"]}
    seqs = sorted({m["seq"] for m in collector.messages})
    assert len(seqs) + stats["dropped"] == 202 and seqs[0] == 0 and seqs[-1] == 201  # start, end
    assert next(m for m in collector.messages if m["kind"] == "end")["last_seq"] == 201


def _full_tmpfs_child() -> None:
    """The training process of the tmpfs test (run inside its mount namespace)."""
    config = json.loads(os.environ["FORESHOCK_TEST_CHILD"])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sink = KafkaSink(
        KafkaSettings(**config["settings"]),
        probe_interval=0.2,
        max_probe_interval=0.5,
        queue_size=8,
        memory_bytes=config["memory_bytes"],
        confirm_group=None,
    )
    for step in range(config["steps"]):
        sink.write(_record(config["run"], step, pad=2_000))
    on_disk = sink._spool.file.appended if sink._spool.file is not None else 0
    print("written", flush=True)
    sys.stdin.readline()  # the broker is up
    sink.close(timeout=30)
    print(
        json.dumps(
            {
                "dropped": sink.dropped,
                "errors": sink.errors,
                "pending": sink.pending(),
                "reasons": dict(sink.reasons),
                "spooled_to_disk": on_disk,
                "delivered": sink.delivered,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    _full_tmpfs_child()


def test_rejects_files_expire_after_their_keep_time(kafka_settings, tmp_path):
    """A rejects file (refused records, kept for a person to read) untouched for 30 days is
    removed by the next producer on that machine; a recent one stays. They used to pile up."""
    import dataclasses
    import os
    import time

    from foreshock.delivery.stranded import KEEP_DAYS as REJECTS_KEEP_DAYS

    spool = tmp_path / "spool"
    spool.mkdir()
    old, recent = spool / "old-host-1.rejects", spool / "new-host-2.rejects"
    old_stranded = spool / "old-host-3.stranded"
    for path in (old, recent, old_stranded):
        path.write_text('{"reason": "too big"}\n')
    stale = time.time() - (REJECTS_KEEP_DAYS + 10) * 86400
    os.utime(old, (stale, stale))
    os.utime(old_stranded, (stale, stale))
    settings = dataclasses.replace(kafka_settings, spool_dir=str(spool))
    sink = KafkaSink(settings, name="expiring", confirm_group=None)
    sink.close()
    assert sink.expired_rejects == 2 and not old.exists() and recent.exists()
    assert not old_stranded.exists()
