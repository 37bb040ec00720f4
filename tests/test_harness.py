"""The harness the demo, the benchmarks and the reliability tests share: what a replay sends, in
which order and at what pace, and the command lines and environment a pipeline starts its
services with — without a broker (the demo and reliability tests run it end to end)."""

from __future__ import annotations

import time
from pathlib import Path

from foreshock.app import harness
from foreshock.lab.recorded import shipped_runs
from foreshock.transport.settings import KafkaSettings, load_settings


class _Sink:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.closed = False

    def write(self, record: dict) -> None:
        self.records.append(record)

    def close(self, timeout: float | None = None) -> None:
        self.closed = True

    def pending(self) -> int:
        return 0


def test_a_replay_sends_start_records_and_end_under_its_own_run_id():
    run = harness.recorded_run("lr-high-s0")
    replay = harness.Replay(
        run, "copy-1", interval=0.0, labels={"source": "replayed"}, restamp=True
    )
    before = time.time()
    messages = [replay.message(j) for j in range(len(replay))]
    assert len(messages) == len(run.records) + 2
    assert {m["run_id"] for m in messages} == {"copy-1"}
    assert messages[0]["kind"] == "start" and messages[-1]["kind"] == "end"
    assert messages[0]["labels"] == {**run.labels, "source": "replayed"}
    assert [m["values"] for m in messages[1:-1]] == [r["values"] for r in run.records]
    assert all(m["time"] >= before for m in messages[1:-1])  # stamped now
    assert messages[-1]["divergence_step"] == run.divergence_step
    assert run.start["run_id"] != "copy-1"  # the recorded run itself is untouched
    as_recorded = harness.Replay(run, "copy-2", interval=0.0)
    assert as_recorded.message(1)["time"] == run.records[0]["time"]
    assert as_recorded.message(0)["labels"] == run.labels


def test_a_replayer_interleaves_its_runs_by_due_time_and_closes_the_sink_it_owns():
    runs = [harness.recorded_run(0), harness.recorded_run(1)]
    sink = _Sink()
    replayer = harness.Replayer(
        sink,
        [
            harness.Replay(runs[0], "a", interval=0.002),
            harness.Replay(runs[1], "b", interval=0.002, offset=0.5),
        ],
        close_timeout=1,
    )
    replayer.start()
    replayer.join(30)
    assert replayer.done.is_set() and sink.closed and replayer.pending == 0
    total = len(runs[0].records) + len(runs[1].records) + 4
    assert replayer.written == len(sink.records) == total
    ids = [m["run_id"] for m in sink.records]
    assert ids[: len(runs[0].records) + 2] == ["a"] * (len(runs[0].records) + 2)  # b is later


def test_a_stopped_replayer_sends_nothing_more_and_leaves_the_sink_to_its_owner():
    sink = _Sink()
    replayer = harness.Replayer(
        sink, [harness.Replay(harness.recorded_run(0), "slow", interval=60)]
    )
    replayer.start()
    time.sleep(0.2)
    replayer.stop_event.set()
    replayer.join(5)
    assert not replayer.is_alive() and replayer.done.is_set()
    assert len(sink.records) == 1 and not sink.closed


def test_paced_keeps_the_rate_and_synthetic_runs_renumber_recorded_records():
    tick = time.monotonic()
    assert list(harness.paced(5, rate=50)) == [0, 1, 2, 3, 4]
    assert time.monotonic() - tick >= 4 / 50
    assert list(harness.paced(3, rate=0)) == [0, 1, 2]  # 0: as fast as possible
    run = harness.recorded_run(3)
    n = len(run.records) + 1  # past the end: cycles
    record = harness.renumbered(run, n, "fleet-7", step=n * 25)
    assert record["values"] == run.records[1]["values"]
    assert (record["run_id"], record["step"]) == ("fleet-7", n * 25)
    assert harness.finished("fleet-7") == {
        "schema": "foreshock.run/1",
        "kind": "end",
        "run_id": "fleet-7",
        "status": "finished",
        "divergence_step": None,
    }
    assert 0 < harness.recorded_interval(run) < 60


def test_recorded_runs_by_name_and_by_index():
    paths = shipped_runs()
    assert harness.recorded_run("healthy-s0").path.name.startswith("healthy-s0.")
    assert harness.recorded_run(len(paths) + 2).path == paths[2]


def test_the_services_get_the_settings_through_their_environment():
    settings = harness.scoped(KafkaSettings(partitions=3, spool_dir="/tmp/s"), "case")
    env = harness.service_env(settings, FORESHOCK_KAFKA_SPOOL_DIR="/tmp/other")
    assert load_settings(env=env) == KafkaSettings(
        bootstrap_servers=settings.bootstrap_servers,
        metrics_topic="case.metrics",
        warnings_topic="case.warnings",
        deadletter_topic="case.dead",
        control_topic="case.control",
        partitions=3,
        spool_dir="/tmp/other",
    )


def test_a_pipeline_starts_each_service_with_its_group_store_and_port(tmp_path: Path):
    pipeline = harness.Pipeline(
        KafkaSettings(spool_dir=str(tmp_path / "spool")),
        store=tmp_path / "history",
        log_dir=tmp_path / "logs",
        parts={"worker": harness.DETECT, "sink": harness.SINK, "dashboard": harness.DASHBOARD},
        groups={harness.SINK: "sink", harness.DETECT: "detectors"},
        ports={"dashboard": 8765},
    )
    store = str(tmp_path / "history")
    worker, sink, dashboard = (pipeline.command(n)[3:] for n in pipeline.parts)
    port = str(pipeline.port("worker"))
    assert worker == ["detect", "--group", "detectors", "--metrics-port", port]
    assert sink[:5] == ["sink", "--store", store, "--group", "sink"]
    assert sink[5] == "--metrics-port" and sink[6] not in (port, "8765")
    assert dashboard == ["dashboard", "--store", store, "--port", "8765"]
    assert pipeline.url() == "http://127.0.0.1:8765"
    assert pipeline.metrics_url("worker") == f"http://127.0.0.1:{port}/metrics"
    bare = harness.Pipeline(KafkaSettings(spool_dir="s"), tmp_path, tmp_path, metrics=False)
    assert [bare.command(n)[3:] for n in bare.parts][:2] == [
        ["sink", "--store", str(tmp_path)],
        ["detect"],
    ]
    pipeline.stop()  # nothing started: nothing to stop, no error
