"""Every dashboard page under Streamlit's AppTest, on a small real history and on none."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from foreshock.detectors import registry
from foreshock.detectors.commands import default_config
from foreshock.detectors.engine import RunDetector
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.storage.recorded import store_recorded_runs
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.segments import SegmentStore

VIEWS = Path(__file__).resolve().parents[1] / "dashboard" / "views"
RUNS = ["fa-lowprec-s1", "lr-high-s2", "healthy-s3"]


def _path(name: str) -> Path:
    return next(p for p in shipped_runs() if p.name.startswith(name + "."))


def seed_history(root: Path) -> None:
    """Three finished runs and one still training with an open attention warning."""
    with SegmentStore(root) as store:
        store_recorded_runs(store, [_path(n) for n in RUNS], default_config())
        run, b = load_run(_path("fa-lowprec-s2")), BatchBuilder()
        detector = RunDetector("live-fa", default_config())
        b.add_lifecycle({**run.start, "run_id": "live-fa", "kind": "start", "seq": 0},
                        time.time())  # fmt: skip
        for seq, record in enumerate([r for r in run.records if r["step"] <= 825], start=1):
            b.add_metrics({**record, "run_id": "live-fa", "seq": seq}, time.time())
            for event in detector.update({**record, "kind": "metrics"}):
                b.add_warning(event.to_message(), time.time())
        store.write(b.take())


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dash") / "history"
    seed_history(root)
    return root


def _page(name: str, store: Path, monkeypatch, **query: str) -> AppTest:
    monkeypatch.setenv("FORESHOCK_STORE", str(store))
    app = AppTest.from_file(str(VIEWS / f"{name}.py"), default_timeout=60)
    for key, value in query.items():
        app.query_params[key] = value
    app.run()
    assert not app.exception, app.exception
    return app


def _html(app: AppTest) -> str:
    return "\n".join(m.value for m in app.markdown)


def test_fleet_lists_runs_with_status_most_urgent_first(history, monkeypatch):
    app = _page("fleet", history, monkeypatch)
    page = _html(app)
    order = [page.index(f'data-run="{r}"') for r in ["live-fa", *RUNS]]
    assert order[0] == min(order)  # the open warning first
    assert "warning: attention-numerics" in page and page.count(">diverged<") == 2
    assert ">finished<" in page
    assert {m.label: m.value for m in app.metric}["runs"] == "4"


def test_fleet_filters(history, monkeypatch):
    app = _page("fleet", history, monkeypatch)
    app.selectbox[1].set_value("diverged").run()
    page = _html(app)
    assert 'data-run="fa-lowprec-s1"' in page and 'data-run="healthy-s3"' not in page
    app.selectbox[1].set_value("all").run()
    app.selectbox[2].set_value("router").run()
    assert 'data-run="lr-high-s2"' in _html(app) and 'data-run="healthy-s3"' not in _html(app)


def test_run_page_draws_loss_monitors_and_explains_warnings(history, monkeypatch):
    app = _page("run", history, monkeypatch, run="fa-lowprec-s1")
    charts = app.get("plotly_chart")
    assert len(charts) == 5  # loss + the four default monitors
    titles = [e.label for e in app.expander]
    assert any("attention-numerics" in t and "cause" in t for t in titles)
    texts = [m.value for m in app.markdown]
    assert any("healthy runs' band at the same step" in t for t in texts)  # a band warning
    assert any("its CUSUM statistic" in t for t in texts)  # a symptom (trend) warning
    assert any("What to check:" in t and "FlashAttention" in t for t in texts)
    assert {m.label: m.value for m in app.metric}["divergence step"] == str(
        load_run(_path("fa-lowprec-s1")).end["divergence_step"])  # fmt: skip
    app.checkbox[0].check().run()  # per-head detail
    assert not app.exception


def test_compare_and_tuning_pages(history, monkeypatch):
    app = _page("compare", history, monkeypatch)
    assert len(app.get("plotly_chart")) == 1
    assert "lead: mechanism" in app.code[0].value
    app = _page("tuning", history, monkeypatch)
    assert "No tune report yet" in app.info[0].value
    report = {"rule": "test rule", "chosen": {"index": 0}, "points": [
        {"params": {"k": 0.5}, "families": [
            {"family": "router", "runs": 3, "detected": 3, "detection_rate": 1.0,
             "false_warnings_per_run": 0.0, "lead_median": 400.0, "lead_p10": 300.0,
             "lead_p90": 500.0}]}]}  # fmt: skip
    version = registry.publish(
        history, default_config().configs["gpt-moe"], report, note="from a test"
    )
    app = _page("tuning", history, monkeypatch)
    assert {m.label: m.value for m in app.metric}["live detector config"] == version
    assert len(app.get("plotly_chart")) == 1 and "from a test" in app.code[-1].value


@pytest.mark.parametrize("page", ["fleet", "run", "compare", "tuning"])
def test_every_page_has_a_friendly_empty_state(page, tmp_path, monkeypatch):
    app = _page(page, tmp_path / "no-history-here", monkeypatch)
    assert app.info, "an empty history says so"
