"""The store on real Parquet files and a real DuckDB: round trips, readers beside a writer,
compaction, retention, export, migrations and the dashboard's queries."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from foreshock.detectors.commands import default_config
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.storage import migrations, queries
from foreshock.storage.reader import open_history
from foreshock.storage.recorded import store_recorded_runs
from foreshock.storage.retention import export_query, export_run, prune
from foreshock.storage.rows import BatchBuilder, RecordError
from foreshock.storage.segments import SchemaVersionError, SegmentStore, StoreLockedError

RUNS = ["fa-lowprec-s1", "lr-high-s2", "healthy-s3", "gbs-small-s0"]


def _path(name: str):
    return next(p for p in shipped_runs() if p.name.startswith(name + "."))


def _live_run(store: SegmentStore, name: str, upto: int) -> None:
    """``name`` still training at step ``upto``: no end message, warnings so far."""
    from foreshock.detectors.engine import RunDetector

    run = load_run(_path(name))
    detector, b = RunDetector("live-" + name, default_config()), BatchBuilder()
    b.add_lifecycle({**run.start, "run_id": "live-" + name, "kind": "start", "seq": 0}, 0.0)
    for seq, record in enumerate([r for r in run.records if r["step"] <= upto], start=1):
        b.add_metrics({**record, "run_id": "live-" + name, "seq": seq}, time.time())
        for event in detector.update({**record, "kind": "metrics"}):
            b.add_warning(event.to_message(), time.time())
    store.write(b.take())


@pytest.fixture
def history_dir(tmp_path):
    with SegmentStore(tmp_path / "h") as store:
        store_recorded_runs(store, [_path(n) for n in RUNS], default_config())
        _live_run(store, "fa-lowprec-s1", upto=1100)  # warned at 1050, diverges at 1178
    return tmp_path / "h"


def test_a_stored_run_reads_back_as_the_messages_it_came_from(history_dir):
    run = load_run(_path("fa-lowprec-s1"))
    with open_history(history_dir) as history:
        start, records, end = queries.run_records(history, "fa-lowprec-s1")
        row = history.sql("SELECT * FROM runs WHERE run_id = ?", ["fa-lowprec-s1"]).to_pylist()[0]
    assert start["labels"] == run.start["labels"]
    assert [r["step"] for r in records] == [r["step"] for r in run.records]
    assert [r["values"] for r in records] == [r["values"] for r in run.records]
    assert end["divergence_step"] == run.end["divergence_step"] == row["divergence_step"]
    assert (row["scenario"], row["records"], row["status"]) == (
        "fa-lowprec", len(run.records), run.end["status"])  # fmt: skip


def test_fleet_statuses_and_urgency(history_dir):
    with open_history(history_dir) as history:
        rows = queries.fleet(history)
    status = {r["run_id"]: r["status"] for r in rows}
    # gbs-small (batch 16 → 2) ends with its ΔW spectra outside the healthy batch-16 band
    assert status == {"fa-lowprec-s1": "diverged", "lr-high-s2": "diverged",
                      "healthy-s3": "finished", "gbs-small-s0": "warning: attention-numerics",
                      "live-fa-lowprec-s1": "warning: attention-numerics"}  # fmt: skip
    # open warnings are the most urgent, then divergences
    assert {r["run_id"] for r in rows[:2]} == {"live-fa-lowprec-s1", "gbs-small-s0"}
    assert {r["run_id"] for r in rows[2:4]} == {"fa-lowprec-s1", "lr-high-s2"}
    live = next(r for r in rows if r["run_id"] == "live-fa-lowprec-s1")
    assert sorted(live["active"]) == ["attention-numerics @ h.0.attn",
                                         "attention-numerics @ h.1.attn"]  # fmt: skip
    gbs = next(r for r in rows if r["run_id"] == "gbs-small-s0")
    assert gbs["first_family"] == "router" and gbs["divergence_step"] is None
    fa = next(r for r in rows if r["run_id"] == "fa-lowprec-s1")
    report = replay_run(load_run(_path("fa-lowprec-s1")), default_config())
    first = min((a for a in report.alerts if a.family != "symptom"), key=lambda a: a.step)
    assert fa["lead_time"] == report.divergence_step - first.step > 0
    with open_history(history_dir) as history:
        warned = [r["run_id"] for r in queries.fleet(history, status="warning")]
        assert sorted(warned) == ["gbs-small-s0", "live-fa-lowprec-s1"]
        assert {r["run_id"] for r in queries.fleet(history, family="attention-numerics")} >= {
            "fa-lowprec-s1"}  # fmt: skip


def test_series_are_downsampled_in_the_query(history_dir):
    with open_history(history_dir) as history:
        full = queries.series(history, "fa-lowprec-s1", "loss", max_points=10_000)
        small = queries.series(history, "fa-lowprec-s1", "loss", max_points=8)
        across = queries.series_across_runs(history, RUNS[:2], "router.epsilon", max_points=5)
    run = load_run(_path("fa-lowprec-s1"))
    assert [p["value"] for p in full] == [r["values"]["loss"] for r in run.records]
    assert 1 < len(small) <= 8 and sum(p["points"] for p in small) == len(full)
    assert max(p["high"] for p in small) == max(p["value"] for p in full)
    assert {r["run_id"] for r in across} == set(RUNS[:2])
    assert all(sum(r["run_id"] == n for r in across) <= 5 for n in RUNS[:2])


def test_an_empty_store_answers_every_query(tmp_path):
    with open_history(tmp_path / "nothing-yet") as history:
        assert queries.fleet(history) == []
        assert queries.lead_table(history) == []
        assert queries.series(history, "r", "loss") == []
        assert queries.run_warnings(history, "r") == []
        assert queries.summary(history, "r") is None


def test_one_writer_per_store(tmp_path):
    with SegmentStore(tmp_path / "s"), pytest.raises(StoreLockedError, match="another process"):
        SegmentStore(tmp_path / "s")
    SegmentStore(tmp_path / "s").close()  # released on close


def test_a_batch_never_published_is_deleted_by_the_next_writer(tmp_path):
    with SegmentStore(tmp_path / "s") as store:
        b = BatchBuilder()
        b.add_metrics({"run_id": "r", "seq": 0, "step": 0, "values": {"loss": 1.0}}, 0.0)
        store.write(b.take())
        orphan = store.root / "data/steps/99999999-deadbeef.parquet"
        orphan.write_bytes(b"half a batch")  # as if the writer died before the manifest
    with SegmentStore(tmp_path / "s"):
        assert not orphan.exists()
    with open_history(tmp_path / "s") as history:
        assert history.sql("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 1}]


def test_a_bad_series_key_rejects_the_record_whole():
    b = BatchBuilder()
    with pytest.raises(RecordError, match="malformed series key"):
        b.add_metrics({"run_id": "r", "seq": 0, "step": 0,
                       "values": {"loss": 1.0, "bad key; DROP TABLE": 2.0}}, 0.0)  # fmt: skip
    assert len(b) == 0 and b.take()["metric_values"].num_rows == 0


def test_compaction_merges_and_keeps_old_snapshots_readable(tmp_path):
    with SegmentStore(tmp_path / "s", grace=3600) as store:
        for i in range(9):
            b = BatchBuilder()
            b.add_metrics({"run_id": f"r{i % 3}", "seq": i, "step": i,
                           "values": {"loss": float(i), "grad_norm": 1.0}}, 0.0)  # fmt: skip
            store.write(b.take())
        old = open_history(store.root)
        assert store.compact() == 2  # steps and metric_values: 9 segments each -> 1
        assert len(store.files("metric_values")) == 1
        new = open_history(store.root)
        q = "SELECT count(*) AS n, sum(value) AS s FROM metric_values"
        assert old.sql(q).to_pylist() == new.sql(q).to_pylist() == [{"n": 18, "s": 45.0}]
        assert store.delete_retired() == 0  # within the grace period
        assert store.delete_retired(now=time.time() + 7200) == 18


def test_merge_of_every_table_is_exact_sorted_and_out_of_core(history_dir, monkeypatch):
    """The DuckDB merge writes each table's own schema (no fallback to the in-memory sort),
    the same rows, sorted on the table's keys."""
    from foreshock.storage import segments

    with SegmentStore(history_dir, grace=3600) as store:
        for offset in (7, 3):
            b = BatchBuilder()
            b.add_dead_letter(b"\xff\x00 not json", "not JSON", "sink:metrics", 0, offset, 1.0)
            store.write(b.take())
        before = {t: pq.read_table(store.files(t)).sort_by(
            [(k, "ascending") for k in segments.SORT_KEYS[t]]) for t in segments.TABLES
            if store.files(t)}  # fmt: skip
        monkeypatch.setattr(store, "rewrite", lambda *a: pytest.fail("fell back to Arrow"))
        for table in before:
            store.merge(table, list(store.manifest["tables"][table]))
            (merged,) = store.files(table)
            after = pq.read_table(merged)
            assert after.schema.remove_metadata().equals(segments.TABLES[table])
            assert after.schema.metadata == {b"foreshock.schema_version": b"1"}
            keys = segments.SORT_KEYS[table]
            assert after.select(keys).to_pylist() == before[table].select(keys).to_pylist()
            assert sorted(map(repr, after.to_pylist())) == sorted(
                map(repr, before[table].to_pylist())), table  # fmt: skip
    assert sorted(before) == sorted(segments.TABLES)
    with open_history(history_dir) as history:
        assert [r["run_id"] for r in queries.fleet(history)]


def test_prune_and_export(history_dir, tmp_path):
    with SegmentStore(history_dir, grace=0) as store:
        b = BatchBuilder()
        b.add_metrics({"run_id": "fresh", "seq": 0, "step": 0, "values": {"loss": 1.0}},
                      time.time() + 10 * 86400)  # fmt: skip
        store.write(b.take())
        gone = prune(store, days=1, now=time.time() + 5 * 86400)
    assert sorted(gone) == sorted([*RUNS, "live-fa-lowprec-s1"])
    with open_history(history_dir) as history:
        assert [r["run_id"] for r in queries.fleet(history)] == ["fresh"]
        assert history.sql("SELECT count(*) AS n FROM warnings").to_pylist() == [{"n": 0}]
    counts = export_run(history_dir, "fresh", tmp_path / "export")
    assert counts["metric_values"] == 1
    assert pq.read_table(tmp_path / "export" / "steps.parquet").num_rows == 1
    n = export_query(history_dir, "SELECT run_id, step FROM steps", tmp_path / "q.parquet")
    assert n == 1 and pq.read_table(tmp_path / "q.parquet").column_names == ["run_id", "step"]


def test_schema_versions_and_migration(history_dir, monkeypatch):
    manifest = history_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(SchemaVersionError, match="upgrade foreshock"):
        open_history(history_dir)
    manifest.write_text(json.dumps({**data, "schema_version": 0}))
    with pytest.raises(SchemaVersionError, match="foreshock store migrate"):
        open_history(history_dir)
    with pytest.raises(SchemaVersionError, match="no migration"):
        migrations.migrate(history_dir)

    def v0_to_v1(table, rows):  # a synthetic old schema: values were stored halved
        if table == "metric_values":
            return rows.set_column(6, "value", pc.multiply(rows["value"], 2.0))
        return rows

    monkeypatch.setitem(migrations.MIGRATIONS, 0, v0_to_v1)
    files = [history_dir / e["file"] for e in data["tables"]["metric_values"]]
    total = sum(pc.sum(pq.read_table(f)["value"]).as_py() for f in files)
    assert migrations.migrate(history_dir) == 0
    with open_history(history_dir) as history:
        after = history.sql("SELECT sum(value) AS s FROM metric_values").to_pylist()[0]["s"]
        runs = history.sql("SELECT count(*) AS n FROM runs").to_pylist()[0]["n"]
    assert after == pytest.approx(2 * total) and runs == len(RUNS) + 1


WRITER = textwrap.dedent("""
    import sys, time
    from foreshock.storage.rows import BatchBuilder
    from foreshock.storage.segments import SegmentStore
    with SegmentStore(sys.argv[1], grace=2.0) as store:
        deadline, i = time.monotonic() + float(sys.argv[2]), 0
        while time.monotonic() < deadline:
            b = BatchBuilder()
            for k in range(50):
                b.add_metrics({"run_id": f"r{i % 7}", "seq": i * 50 + k, "step": i * 50 + k,
                               "values": {"loss": 1.0, "grad_norm": 2.0}}, time.time())
            store.write(b.take())
            i += 1
            if i % 10 == 0:
                store.compact()
    print(i)
""")


def test_readers_query_while_another_process_writes_and_compacts(tmp_path):
    root = tmp_path / "live"
    SegmentStore(root).close()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), "6"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    queries_run, errors, counts = 0, [], []
    while writer.poll() is None:
        try:
            with open_history(root) as history:
                n = history.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"]
                m = history.sql("SELECT count(*) AS n FROM metric_values").to_pylist()[0]["n"]
                queries.fleet(history)
            counts.append(n)
            assert m == 2 * n and n % 50 == 0  # whole batches only
            queries_run += 1
        except Exception as exc:
            errors.append(repr(exc))
    batches = int(writer.communicate()[0])
    assert errors == []
    assert queries_run > 20 and counts == sorted(counts)
    with open_history(root) as history:
        assert history.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] == 50 * batches
