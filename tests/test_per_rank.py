"""Per-rank mode (``MonitorConfig(emit_ranks="all")``, how one bad GPU is caught): every rank
writes its own stream under the run id, through its own producer (its own attempt). A faulty
rank beside a healthy one is warned as if it ran alone — live through the real broker and
worker, offline, and in the store — and the healthy rank is not; no rank's records are
ignored because another rank exists, and no query merges two ranks' values at one step.

The run: the shipped ``fa-lowprec-s1`` (faulty) as rank 1 and ``healthy-s1`` as rank 0 of one
run id, ``world_size`` 2. Rank 1's producer started first (the lower attempt): one detector per
run followed rank 0's newer attempt and ignored all of rank 1 (0 warnings, 7 alone).
"""

from __future__ import annotations

import gzip
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _kafka import read_warnings

from foreshock.app.harness import recorded_run
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.replay import replay
from foreshock.operate.detect_commands import default_config
from foreshock.operate.tune import replay_messages
from foreshock.storage import queries
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.schema import TABLES
from foreshock.storage.store import DeltaStore
from foreshock.transport.topics import ensure_topics

RUN = "per-rank"
FAULTY, HEALTHY = "fa-lowprec-s1", "healthy-s1"
RANKS = {1: FAULTY, 0: HEALTHY}  # rank -> the shipped run it sends
ATTEMPTS = {1: 100, 0: 200}  # rank 1 started first


def _stream(rank: int) -> list[dict[str, Any]]:
    """One rank's messages as its Monitor (emit_ranks="all") and the lab would write them."""
    run = recorded_run(RANKS[rank])
    mine = {"run_id": RUN, "rank": rank}
    return [
        {**run.start, **mine, "kind": "start"},
        *({**r, **mine, "world_size": 2, "kind": "metrics"} for r in run.records),
        {**run.end, **mine, "kind": "end"},
    ]


def _lockstep() -> list[dict[str, Any]]:
    """Both ranks' messages in the order training makes them: step by step (rank 1 first)."""
    pairs = itertools.zip_longest(_stream(1), _stream(0))
    return [m for pair in pairs for m in pair if m is not None]


def _alone() -> set[tuple]:
    """(family, module, step) of each warning of the faulty run replayed alone."""
    run = recorded_run(FAULTY)
    detector = RunDetector(FAULTY, default_config())
    for message in [{**run.start, "kind": "start"}, *run.records, {**run.end, "kind": "end"}]:
        detector.update({"kind": "metrics", **message})
    return {(a.family, a.module, a.step) for a in detector.alerts}


def _opened(events, rank: int) -> set[tuple]:
    return {
        (e["family"], e["module"], e["step"])
        for e in events
        if e["event"] == "opened" and e.get("rank") == rank
    }


def test_one_detector_per_run_was_blind_to_the_faulty_rank():
    """The failure this fixes, pinned: the faulty run alone warns (5 warnings; 7 before
    warnings held open through a flap); fed to one detector beside a healthy rank with a
    newer attempt, its records are ignored and none of its warnings came."""
    alone = _alone()
    assert len(alone) == 5
    one = RunDetector(RUN, default_config())
    for message in _lockstep():
        one.update({**message, "attempt": ATTEMPTS[message["rank"]]})
    assert one.alerts == [] and one.ignored >= len(recorded_run(FAULTY).records) - 1 == 57


def test_a_faulty_rank_beside_a_healthy_one_is_warned_through_the_broker_and_worker(
    kafka_settings, tmp_path
):
    """Each rank through its own KafkaSink (as ``emit_ranks="all"`` does), the real worker and
    the storage sink: rank 1 gets the warnings it gets alone, each naming rank 1; rank 0
    none; the store keeps both ranks' series apart and the warnings' rank."""
    from foreshock.delivery.kafka_sink import KafkaSink
    from foreshock.detectors.worker import DetectorWorker
    from foreshock.storage.sink import StorageSink

    ensure_topics(kafka_settings)
    sinks = {
        rank: KafkaSink(
            kafka_settings, name=f"rank-{rank}", confirm_group=None, attempt=ATTEMPTS[rank]
        )
        for rank in (1, 0)
    }
    for message in _lockstep():
        sinks[message["rank"]].write(message)
    for sink in sinks.values():
        sink.close()
        assert sink.pending() == 0
    worker = DetectorWorker(kafka_settings, default_config(), group_id="det-per-rank")
    worker.run(threading.Event(), idle_exit=5)
    events = read_warnings(kafka_settings)

    alone = _alone()
    assert _opened(events, 1) == alone  # every warning of the faulty run, on its rank
    assert _opened(events, 0) == set()  # the healthy rank: none
    assert {e.get("rank") for e in events} == {1}
    assert len({e["id"] for e in events if e["event"] == "opened"}) == len(alone)
    assert worker.runs == {}  # both ranks ended: the run is forgotten

    store = tmp_path / "store"
    StorageSink(kafka_settings, store, group_id="sink-per-rank").run(threading.Event(), idle_exit=4)
    with open_history(store) as history:
        assert queries.run_ranks(history, RUN) == [0, 1]
        stored = queries.run_warnings(history, RUN)
        losses = {
            rank: queries.series(history, RUN, "loss", max_points=10_000, rank=rank)
            for rank in (0, 1)
        }
        lowest = queries.series(history, RUN, "loss", max_points=10_000)
    assert {(w["family"], w["module"], w["step"]) for w in stored} == alone
    assert {w["rank"] for w in stored} == {1}
    for rank, name in RANKS.items():
        run = recorded_run(name)
        assert [p["step"] for p in losses[rank]] == [r["step"] for r in run.records]
        expected = [r["values"]["loss"] for r in run.records]
        assert [p["value"] for p in losses[rank]] == pytest.approx(expected, rel=1e-12)
    assert lowest == losses[0]  # no rank asked for: the lowest, never a mean of the two


def _store(path, attempts: dict[int, int]) -> list[dict[str, Any]]:
    """Both ranks' messages (and the warnings the detectors make of them) stored at ``path``
    as the storage sink would; returns the messages."""
    from foreshock.detectors.streams import RunStreams

    messages = [{**m, "attempt": attempts[m["rank"]]} for m in _lockstep()]
    builder, seqs = BatchBuilder(), dict.fromkeys(RANKS, 0)
    detectors = RunStreams(RUN, default_config())
    for message in messages:
        seq = seqs[message["rank"]]
        seqs[message["rank"]] += 1
        if message["kind"] == "metrics":
            builder.add_metrics({**message, "seq": seq}, 0.0)
        else:
            builder.add_lifecycle({**message, "seq": seq}, 0.0)
        for event in detectors.update(message):
            builder.add_warning(event.to_message(), 0.0)
    DeltaStore(path).write(builder.take())
    return messages


@pytest.mark.parametrize("attempts", [{0: 0, 1: 0}, ATTEMPTS], ids=["one-file", "two-producers"])
def test_a_faulty_rank_is_warned_offline(tmp_path, attempts):
    """The same two ranks replayed offline: from one recording holding both ranks (what a
    JSON Lines sink shared by the ranks writes: no attempts) and from the store (each rank its
    own producer's attempt, read back for ``foreshock tune``)."""
    messages = [{**m, "attempt": attempts[m["rank"]]} for m in _lockstep()]
    path = tmp_path / f"{RUN}.jsonl.gz"
    with gzip.open(path, "wt") as file:
        for message in messages:
            if message["kind"] != "end" or message["rank"] == 1:  # a recording keeps one end
                file.write(json.dumps(message) + "\n")
    (report,) = replay([path], default_config())
    events = [e.to_message() for e in report.events]
    alone = _alone()
    assert _opened(events, 1) == alone and _opened(events, 0) == set()

    _store(tmp_path / "s", attempts)
    with open_history(tmp_path / "s") as history:
        start, records, end = queries.run_records(history, RUN)
    assert {r["rank"] for r in records} == {0, 1} and len(records) == len(messages) - 4
    stored = replay_messages(RUN, start, records, end, default_config())
    assert _opened([a.to_message() for a in stored.alerts], 1) == alone
    assert all(a.rank == 1 for a in stored.alerts)


def test_a_single_process_run_keeps_its_warnings_as_they_were():
    """Rank 0 of one process: no rank on its warnings, ids as before ranks were named."""
    run = recorded_run(FAULTY)
    (report,) = replay([run.path], default_config())
    plain = RunDetector(FAULTY, default_config())
    for message in [{**run.start, "kind": "start"}, *run.records, {**run.end, "kind": "end"}]:
        plain.update({"kind": "metrics", **message})
    assert [(a.id, a.rank) for a in report.alerts] == [(a.id, None) for a in plain.alerts]


def test_a_store_written_before_warnings_had_a_rank_still_reads_and_takes_new_ones(tmp_path):
    """Old ``warnings`` files have no ``rank`` column: read as null; a new writer adds the
    column (no new schema version) and its per-rank warnings read back with their rank."""
    from deltalake import write_deltalake

    from foreshock.storage.store import VERSION_PREFIX

    old = pa.schema([f for f in TABLES["warnings"] if f.name != "rank"])
    row = {f.name: None for f in old} | {"id": "w0", "event": "opened", "run_id": "r"}
    row |= {"family": "router", "step": 5, "received_at": 1.0}
    write_deltalake(
        str(tmp_path / "s" / "warnings"),
        pa.Table.from_pylist([row], schema=old),
        description=f"{VERSION_PREFIX}2",
    )
    with open_history(tmp_path / "s") as history:
        assert [(w["id"], w["rank"]) for w in queries.run_warnings(history, "r")] == [("w0", None)]
    builder = BatchBuilder()
    new = {**row, "schema": "foreshock.warning/1", "id": "w1", "step": 6, "rank": 1}
    builder.add_warning(new, 2.0)
    DeltaStore(tmp_path / "s").write(builder.take())
    with open_history(tmp_path / "s") as history:
        rows = queries.run_warnings(history, "r")
    assert [(w["id"], w["rank"]) for w in rows] == [("w0", None), ("w1", 1)]


def test_the_run_page_draws_one_rank_at_a_time(tmp_path, monkeypatch):
    """A per-rank run: a rank picker; each rank's loss its own line; every warning names its
    rank, and the charts mark the drawn rank's."""
    from streamlit.testing.v1 import AppTest

    from foreshock.dashboard import views

    _store(tmp_path / "s", ATTEMPTS)
    monkeypatch.setenv("FORESHOCK_STORE", str(tmp_path / "s"))
    page = Path(views.__file__).parent / "run.py"
    app = AppTest.from_file(str(page), default_timeout=60)
    app.query_params["run"] = RUN
    app.run()
    assert not app.exception, app.exception
    picker = next(s for s in app.selectbox if s.label == "rank")
    assert picker.options == ["0", "1"] and picker.value == 0
    titles = [e.label for e in app.expander if "What each rule" not in e.label]  # warnings
    assert len(titles) == len(_alone()) and all("rank 1" in t for t in titles)
    for rank in (0, 1):
        if rank:
            picker.set_value(1).run()
            assert not app.exception, app.exception
        traces = json.loads(app.get("plotly_chart")[0].proto.spec)["data"]  # the loss chart
        loss = next(t for t in traces if t.get("name") == "loss")
        assert len(loss["x"]) == len(recorded_run(RANKS[rank]).records)  # this rank's alone
        marked = [t for t in traces if t.get("name", "").startswith("⚠")]
        assert bool(marked) == (rank == 1)
    assert app.query_params["rank"] == "1"


def test_a_segment_store_without_warning_ranks_migrates(tmp_path):
    """foreshock <= 0.1's segment store: its warnings had no rank; they migrate as null."""
    import pyarrow.parquet as pq

    from foreshock.storage.migrations import migrate_segments

    old = pa.schema([f for f in TABLES["warnings"] if f.name != "rank"])
    rows = pa.Table.from_pylist(
        [{"id": "w0", "event": "opened", "run_id": "r", "family": "router", "step": 5}],
        schema=old,
    )
    (tmp_path / "data" / "warnings").mkdir(parents=True)
    pq.write_table(rows, tmp_path / "data" / "warnings" / "0-x.parquet")
    segment = {"file": "data/warnings/0-x.parquet", "rows": 1}
    tables = {t: [] for t in TABLES} | {"warnings": [segment]}
    manifest = {"schema_version": 1, "tables": tables}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert migrate_segments(tmp_path)["warnings"] == 1
    with open_history(tmp_path) as history:
        assert [(w["id"], w["rank"]) for w in queries.run_warnings(history, "r")] == [("w0", None)]


def test_a_ranks_warning_is_its_own_alert_and_names_its_rank() -> None:
    from foreshock.notify.payloads import alertmanager_alert, slack_payload, summary
    from foreshock.transport.warning import WarningEvent

    message = {
        "id": "a1",
        "event": "opened",
        "run_id": "r1",
        "family": "router",
        "module": "m",
        "step": 5,
        "role": "cause",
        "false_alarm_rate": None,
        "evidence": {},
        "time": 0,
    }
    event = WarningEvent.from_message(message)
    rank0, rank1 = (WarningEvent.from_message({**message, "rank": r}) for r in (0, 1))
    assert (
        alertmanager_alert(rank0, "", 0.0)["labels"] != alertmanager_alert(rank1, "", 0.0)["labels"]
    )
    assert "rank" not in alertmanager_alert(event, "", 0.0)["labels"]
    assert "rank 1" in summary(rank1) and "rank 1" in str(slack_payload(rank1, ""))
