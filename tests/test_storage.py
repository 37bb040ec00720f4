"""The store on real Delta tables and a real DuckDB: round trips, many writers, idempotent
retries, readers beside writers, compaction and vacuum, time travel, retention, export,
migrations (from the segment store too) and the dashboard's queries."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _delta import commit_lands_then_fails_once, records_batch

from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.operate.store_runs import store_recorded_runs
from foreshock.storage import migrations, queries, stream_queries
from foreshock.storage.reader import open_history
from foreshock.storage.retention import export_query, export_run, prune
from foreshock.storage.rows import BatchBuilder, RecordError
from foreshock.storage.store import DeltaStore, SchemaVersionError

RUNS = ["fa-lowprec-s1", "lr-high-s2", "healthy-s3", "gbs-small-s0"]


def _path(name: str):
    return next(p for p in shipped_runs() if p.name.startswith(name + "."))


def _live_run(store: DeltaStore | None, name: str, upto: int) -> set[str]:
    """``name`` still training at step ``upto``: no end message, warnings so far (stored
    unless ``store`` is None); returns the warnings open then, as the fleet names them."""
    from foreshock.detectors.engine import RunDetector

    run = load_run(_path(name))
    detector, b = RunDetector("live-" + name, default_config()), BatchBuilder()
    b.add_lifecycle({**run.start, "run_id": "live-" + name, "kind": "start", "seq": 0}, 0.0)
    opened: dict[str, str] = {}
    for seq, record in enumerate([r for r in run.records if r["step"] <= upto], start=1):
        b.add_metrics({**record, "run_id": "live-" + name, "seq": seq}, time.time())
        for event in detector.update({**record, "kind": "metrics"}):
            b.add_warning(event.to_message(), time.time())
            if event.event == "opened":
                opened[event.id] = f"{event.family} @ {event.module}"
            elif event.event == "cleared":
                opened.pop(event.id, None)
    if store is not None:
        store.write(b.take())
    return set(opened.values())


@pytest.fixture
def history_dir(tmp_path):
    with DeltaStore(tmp_path / "h") as store:
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
        "fa-lowprec",
        len(run.records),
        run.end["status"],
    )


def test_fleet_statuses_and_urgency(history_dir):
    with open_history(history_dir) as history:
        rows = queries.fleet(history)
    status = {r["run_id"]: r["status"] for r in rows}
    # gbs-small (batch 16 → 2) ended with its ΔW spectra outside the healthy batch-16 band:
    # its end resolved the warnings (a run that ended has nothing left to watch)
    assert status == {
        "fa-lowprec-s1": "diverged",
        "lr-high-s2": "diverged",
        "healthy-s3": "finished",
        "gbs-small-s0": "finished",
        "live-fa-lowprec-s1": "warning: attention-numerics",
    }
    # open warnings are the most urgent, then divergences
    assert rows[0]["run_id"] == "live-fa-lowprec-s1"
    assert {r["run_id"] for r in rows[1:3]} == {"fa-lowprec-s1", "lr-high-s2"}
    live = next(r for r in rows if r["run_id"] == "live-fa-lowprec-s1")
    expected = _live_run(None, "fa-lowprec-s1", upto=1100)  # what the detectors left open
    assert {a for a in expected if a.startswith("attention-numerics")}
    assert sorted(live["active"]) == sorted(a for a in expected if not a.startswith("symptom"))
    gbs = next(r for r in rows if r["run_id"] == "gbs-small-s0")
    assert gbs["first_family"] == "router" and gbs["divergence_step"] is None
    fa = next(r for r in rows if r["run_id"] == "fa-lowprec-s1")
    report = replay_run(load_run(_path("fa-lowprec-s1")), default_config())
    first = min((a for a in report.alerts if a.family != "symptom"), key=lambda a: a.step)
    assert fa["lead_time"] == report.divergence_step - first.step > 0
    with open_history(history_dir) as history:
        warned = [r["run_id"] for r in queries.fleet(history, status="warning")]
        assert warned == ["live-fa-lowprec-s1"]
        assert {r["run_id"] for r in queries.fleet(history, family="attention-numerics")} >= {
            "fa-lowprec-s1"
        }


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


_records = records_batch


def _count(root, table: str = "steps", versions=None) -> int:
    with open_history(root, versions) as history:
        return history.sql(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]


def test_a_retried_batch_is_stored_once_even_when_its_commit_landed(tmp_path, monkeypatch):
    """A failure after some tables committed (the disk filled, a reply was lost): the retry
    under the same batch number appends only the tables that had not committed."""
    calls = commit_lands_then_fails_once(monkeypatch, OSError("No space left on device"))
    store = DeltaStore(tmp_path / "s")
    number = store.next_batch()
    with pytest.raises(OSError):
        store.write(_records("r", range(10)), number)
    store.write(_records("r", range(10)), number)  # the sink's retry
    assert calls == [20, 10]  # values once, steps once: nothing appended twice
    assert (_count(tmp_path / "s"), _count(tmp_path / "s", "metric_values")) == (10, 20)
    store.write(_records("r", range(10, 12)))  # the next batch is a new number
    assert _count(tmp_path / "s") == 12


def test_two_writers_append_to_one_store_at_once(tmp_path):
    """No lock: two handles (two sinks) interleave commits on the same tables."""
    a, b = DeltaStore(tmp_path / "s"), DeltaStore(tmp_path / "s")
    assert a.app_id != b.app_id
    for i in range(5):
        a.write(_records("ra", range(i * 10, i * 10 + 10)))
        b.write(_records("rb", range(i * 10, i * 10 + 10)))
    with open_history(tmp_path / "s") as history:
        per_run = history.sql("SELECT run_id, count(*) AS n FROM steps GROUP BY ALL ORDER BY 1")
        assert per_run.to_pylist() == [{"run_id": "ra", "n": 50}, {"run_id": "rb", "n": 50}]
        assert stream_queries.duplicate_records(history) == []
        assert stream_queries.value_count_mismatches(history) == []


def test_maintenance_compacts_keeps_pinned_versions_and_time_travels(tmp_path):
    store = DeltaStore(tmp_path / "s")
    for i in range(9):
        store.write(_records(f"r{i % 3}", [i]))
    old = open_history(tmp_path / "s")
    assert old.files["metric_values"] == 9
    report = store.maintain(retain_hours=168)
    assert report["metric_values"]["files_removed"] == 9
    assert report["metric_values"]["files_added"] == 1
    new = open_history(tmp_path / "s")
    q = "SELECT count(*) AS n, sum(value) AS s FROM metric_values"
    assert new.files["metric_values"] == 1
    assert old.sql(q).to_pylist() == new.sql(q).to_pylist() == [{"n": 18, "s": 72.0}]
    assert report["metric_values"]["vacuumed"] == 0  # within the retention: old files stay
    store.write(_records("r9", [9]))
    assert _count(tmp_path / "s", versions=old.versions) == 9  # time travel to a snapshot
    # compacting again merges the two live files; vacuum then takes those two and the nine
    assert store.maintain(retain_hours=0)["metric_values"]["vacuumed"] == 9 + 2
    assert _count(tmp_path / "s") == 10


def test_a_bad_series_key_rejects_the_record_whole():
    b = BatchBuilder()
    with pytest.raises(RecordError, match="malformed series key"):
        b.add_metrics(
            {
                "run_id": "r",
                "seq": 0,
                "step": 0,
                "values": {"loss": 1.0, "bad key; DROP TABLE": 2.0},
            },
            0.0,
        )
    assert len(b) == 0 and b.take()["metric_values"].num_rows == 0


def test_prune_and_export(history_dir, tmp_path):
    with DeltaStore(history_dir) as store:
        b = BatchBuilder()
        b.add_metrics(
            {"run_id": "fresh", "seq": 0, "step": 0, "values": {"loss": 1.0}},
            time.time() + 10 * 86400,
        )
        b.add_dead_letter(b"old", "not JSON", "sink:metrics", 0, 1, time.time())
        store.write(b.take())
        gone = prune(store, days=1, now=time.time() + 5 * 86400)
    assert sorted(gone) == sorted([*RUNS, "live-fa-lowprec-s1"])
    with open_history(history_dir) as history:
        assert [r["run_id"] for r in queries.fleet(history)] == ["fresh"]
        assert history.sql("SELECT count(*) AS n FROM warnings").to_pylist() == [{"n": 0}]
        assert history.sql("SELECT count(*) AS n FROM dead_letters").to_pylist() == [{"n": 0}]
    counts = export_run(history_dir, "fresh", tmp_path / "export")
    assert counts["metric_values"] == 1
    assert pq.read_table(tmp_path / "export" / "steps.parquet").num_rows == 1
    n = export_query(history_dir, "SELECT run_id, step FROM steps", tmp_path / "q.parquet")
    assert n == 1 and pq.read_table(tmp_path / "q.parquet").column_names == ["run_id", "step"]


def test_schema_versions_and_migration(tmp_path, monkeypatch):
    from deltalake import DeltaTable

    from foreshock.storage.store import VERSION_PREFIX

    root = tmp_path / "s"
    v1 = migrations.TABLES["metric_values"]
    v1 = v1.remove(v1.get_field_index("attempt"))  # versions 0 and 1 had no attempt
    DeltaTable.create(str(root / "metric_values"), schema=v1, description=f"{VERSION_PREFIX}0")
    with pytest.raises(SchemaVersionError, match="foreshock store migrate"):
        open_history(root)
    DeltaTable.create(
        str(root / "steps"), schema=migrations.TABLES["steps"], description=f"{VERSION_PREFIX}99"
    )
    with pytest.raises(SchemaVersionError, match="upgrade foreshock"):
        open_history(root)
    with pytest.raises(SchemaVersionError, match="newer than"):
        migrations.migrate(str(root))
    DeltaTable(str(root / "steps")).alter.set_table_description(f"{VERSION_PREFIX}2")
    with pytest.raises(SchemaVersionError, match="no migration"):
        migrations.migrate(str(root))

    def v0_to_v1(table, rows):  # a synthetic old schema: values were stored halved
        if table == "metric_values":
            return rows.set_column(6, "value", pc.multiply(rows["value"], 2.0))
        return rows

    from deltalake import write_deltalake

    write_deltalake(
        str(root / "metric_values"),
        _records("r", range(3))["metric_values"].drop_columns(["attempt"]),
        mode="append",
    )
    monkeypatch.setitem(migrations.MIGRATIONS, 0, v0_to_v1)
    assert migrations.migrate(str(root))["metric_values"] == 0
    with DeltaStore(root):  # every table at version 2 now, attempt 0 for the old rows
        pass
    with open_history(root) as history:
        assert history.sql("SELECT sum(value) AS s FROM metric_values").to_pylist() == [
            {"s": 2 * 2 * (0 + 1 + 2)}
        ]


def _segment_store(root, tables) -> None:
    """A store as foreshock <= 0.1 wrote it: ``manifest.json`` + ``data/<table>/*.parquet``."""
    manifest = {
        "format": "foreshock-store",
        "schema_version": 1,
        "generation": 2,
        "tables": {t: [] for t in migrations.TABLES},
        "retired": [],
    }
    for table, parts in tables.items():
        (root / "data" / table).mkdir(parents=True, exist_ok=True)
        for i, rows in enumerate(parts):
            name = f"data/{table}/0000000{i}-x.parquet"
            pq.write_table(rows, root / name)
            manifest["tables"][table].append({"file": name, "rows": rows.num_rows})
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_segment_store_migrates_to_delta_without_loss(history_dir, tmp_path):
    with open_history(history_dir) as history:  # as version 1 wrote them: no attempt
        tables = {
            t: [
                history.sql(f"SELECT * EXCLUDE (attempt) FROM {t}")
                if "attempt" in migrations.TABLES[t].names
                else history.sql(f"SELECT * FROM {t}")
            ]
            for t in migrations.TABLES
        }
        fleet = queries.fleet(history)
    old = tmp_path / "old"
    _segment_store(old, tables)
    cli = [sys.executable, "-m", "foreshock.app.cli", "store", "migrate", "--store", str(old)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "(checked)" in done.stdout
    assert (old / "manifest.json.migrated").exists() and not (old / "manifest.json").exists()
    with open_history(old) as history:
        key = lambda row: row["run_id"]  # noqa: E731
        assert sorted(queries.fleet(history), key=key) == sorted(fleet, key=key)
        for table, (rows,) in tables.items():
            assert _count(old, table) == rows.num_rows


WRITER = textwrap.dedent("""
    import sys, time
    from foreshock.storage.rows import BatchBuilder
    from foreshock.storage.store import DeltaStore
    with DeltaStore(sys.argv[1]) as store:
        deadline, i = time.monotonic() + float(sys.argv[2]), 0
        while time.monotonic() < deadline:
            b = BatchBuilder()
            for k in range(50):
                b.add_metrics({"run_id": f"r{i % 7}", "seq": i * 50 + k, "step": i * 50 + k,
                               "values": {"loss": 1.0, "grad_norm": 2.0}}, time.time())
            store.write(b.take())
            i += 1
            if i % 10 == 0:
                store.maintain(retain_hours=1)  # compaction and vacuum under the readers
    print(i)
""")


@pytest.mark.slow
def test_readers_query_while_another_process_writes_and_compacts(tmp_path):
    root = tmp_path / "live"
    DeltaStore(root).close()
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), "6"], stdout=subprocess.PIPE, text=True
    )
    queries_run, errors, counts = 0, [], []
    while writer.poll() is None:
        try:
            with open_history(root) as history:
                n = history.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"]
                m = history.sql("SELECT count(*) AS n FROM metric_values").to_pylist()[0]["n"]
                partial = history.sql(
                    "SELECT count(*) AS n FROM steps LEFT JOIN (SELECT run_id, rank, step, "
                    "count(*) AS c FROM metric_values GROUP BY ALL) USING (run_id, rank, step) "
                    "WHERE coalesce(c, 0) <> n_values"
                ).to_pylist()[0]["n"]
                queries.fleet(history)
            counts.append(n)
            # whole batches only, in each table; every visible record has all its values
            assert n % 50 == 0 and m % 100 == 0 and m >= 2 * n and partial == 0
            queries_run += 1
        except Exception as exc:
            errors.append(repr(exc))
    batches = int(writer.communicate()[0])
    assert errors == []
    # the reads' count follows the machine's load (the writer's work is fixed): under the full
    # suite on two cores it came to exactly 20 once; ten reads still interleave with its commits
    assert queries_run >= 10 and counts == sorted(counts)
    with open_history(root) as history:
        assert history.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] == 50 * batches


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("COPY (SELECT * FROM steps) TO '{out}/leak.csv'", "one SELECT statement"),
        ("SELECT 1; SELECT 2", "one SELECT statement"),
        ("ATTACH '{out}/other.db'", "one SELECT statement"),
        ("SELECT * FROM read_csv('{secret}')", "file system operations are disabled"),
        ("SELECT * FROM read_text('{secret}')", "file system operations are disabled"),
    ],
    ids=["copy-to", "two-statements", "attach", "read-csv", "read-text"],
)
def test_export_query_is_read_only(history_dir, tmp_path, capsys, query, why):
    """``store export --query`` runs one SELECT over the store and reads no file outside it:
    no COPY … TO, no second statement, no local file (a refusal, exit 2, nothing written)."""
    from foreshock.app.cli import main

    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    sql = query.format(out=tmp_path, secret=secret)
    out = tmp_path / "q.parquet"
    assert (
        main(["store", "export", "--store", str(history_dir), "--query", sql, "--out", str(out)])
        == 2
    )
    assert why in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "leak.csv").exists()
    assert export_query(history_dir, "SELECT count(*) AS n FROM steps", out) == 1  # still works
