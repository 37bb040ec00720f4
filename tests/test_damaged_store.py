"""Damage never stops reading: with the newest commit of ``steps`` torn, every read path (the
warnings commands, the report, the export, the dashboard) reads the table at its last readable
version and says so — no traceback while people need the history most — and a writer that
failed on the torn log resumes by itself once ``foreshock store repair`` has run."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from foreshock.app.cli import main
from foreshock.dashboard.text import WORD_JOINER
from foreshock.lab.recorded import shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.operate.store_runs import store_recorded_runs
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore

VIEWS = Path(__file__).resolve().parents[1] / "dashboard" / "views"


def _run(name: str) -> Path:
    return next(p for p in shipped_runs() if p.name.startswith(name + "."))


def _torn_store(root: Path, live: list[DeltaStore] | None = None) -> tuple[Path, int]:
    """Two runs stored, then a third batch of steps whose commit is cut in half (``live``:
    a writer opened before the tear is appended to it)."""
    with DeltaStore(root) as store:
        store_recorded_runs(store, [_run("fa-lowprec-s1"), _run("healthy-s3")], default_config())
        if live is not None:
            live.append(DeltaStore(root))
        builder = BatchBuilder()
        builder.add_metrics({"run_id": "late", "seq": 1, "step": 0, "values": {"loss": 2.0}}, 0.0)
        store.write({"steps": builder.take()["steps"]})
    newest = max((root / "steps" / "_delta_log").glob("*.json"))
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    return newest, int(newest.stem)


def test_every_read_path_reads_the_last_readable_version_and_says_so(tmp_path, capsys, caplog):
    root = tmp_path / "history"
    newest, version = _torn_store(root)
    with open_history(root) as history:
        assert history.versions["steps"] == version - 1
        assert newest.name in history.damaged["steps"]
        runs = {r["run_id"] for r in history.sql("SELECT run_id FROM steps").to_pylist()}
    assert runs == {"fa-lowprec-s1", "healthy-s3"}
    store = ["--store", str(root)]
    assert main(["warnings", "list", "--all", *store]) == 0
    assert "fa-lowprec-s1" in capsys.readouterr().out
    assert main(["report", *store]) == 0
    out = tmp_path / "q.parquet"
    assert (
        main(
            ["store", "export", *store, "--query", "SELECT count(*) FROM steps", "--out", str(out)]
        )
        == 0
    )
    assert out.exists()
    said = caplog.text + capsys.readouterr().err
    assert (
        f"commit {version}" in said and "foreshock store repair" in said and "Traceback" not in said
    )


@pytest.mark.parametrize("page", ["fleet", "run"])
def test_the_dashboard_shows_a_damaged_store_as_of_its_last_good_commit(
    tmp_path, monkeypatch, page
):
    root = tmp_path / "history"
    newest, _ = _torn_store(root)
    monkeypatch.setenv("FORESHOCK_STORE", str(root))
    app = AppTest.from_file(str(VIEWS / f"{page}.py"), default_timeout=60)
    app.run()
    assert not app.exception, app.exception
    shown = [re.sub(r"\\(.)", r"\1", w.value.replace(WORD_JOINER, "")) for w in app.warning]
    assert any(newest.name in text and "last good commit" in text for text in shown), shown


def test_a_writer_resumes_by_itself_once_the_store_is_repaired(tmp_path):
    root = tmp_path / "history"
    live: list[DeltaStore] = []
    _torn_store(root, live)
    (writer,) = live  # a live sink's store: its tables opened before the tear
    rows = BatchBuilder()
    rows.add_metrics({"run_id": "after", "seq": 1, "step": 0, "values": {"loss": 1.0}}, time.time())
    batch = rows.take()
    number = writer.next_batch()
    with pytest.raises(Exception):  # noqa: B017 - delta-rs's own error for the torn log
        writer.write({"steps": batch["steps"]}, number)
    assert main(["store", "repair", "--store", str(root)]) == 0
    writer.write({"steps": batch["steps"]}, number)  # the same writer, no restart
    with open_history(root) as history:
        assert history.damaged == {}
        after = history.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'after'").to_pylist()
    assert after == [{"n": 1}]
