"""Every dashboard page under Streamlit's AppTest, on a small real history and on none."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from foreshock.dashboard import charts
from foreshock.dashboard.text import WORD_JOINER, block, html_text, md_code, md_text, plot_text
from foreshock.detectors import registry
from foreshock.detectors.engine import RunDetector
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.operate.store_runs import store_recorded_runs
from foreshock.storage import queries
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore

VIEWS = Path(__file__).resolve().parents[1] / "dashboard" / "views"
RUNS = ["fa-lowprec-s1", "lr-high-s2", "healthy-s3"]


def _path(name: str) -> Path:
    return next(p for p in shipped_runs() if p.name.startswith(name + "."))


def seed_history(root: Path) -> None:
    """Three finished runs and one still training with an open attention warning."""
    with DeltaStore(root) as store:
        store_recorded_runs(store, [_path(n) for n in RUNS], default_config())
        run, b = load_run(_path("fa-lowprec-s2")), BatchBuilder()
        detector = RunDetector("live-fa", default_config())
        b.add_lifecycle({**run.start, "run_id": "live-fa", "kind": "start", "seq": 0}, time.time())
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
    """The page's Markdown/HTML sources, character references resolved (as a browser shows
    them: the pages write every stored string as references, see dashboard/text.py)."""
    return html.unescape("\n".join(m.value for m in app.markdown))


def _shown(markdown: str) -> str:
    """What a Markdown label written with :func:`md_text` shows: escapes resolved."""
    return re.sub(r"\\(.)", r"\1", markdown.replace(WORD_JOINER, ""))


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


@pytest.mark.slow
def test_run_page_draws_loss_monitors_and_explains_warnings(history, monkeypatch):
    app = _page("run", history, monkeypatch, run="fa-lowprec-s1")
    charts = app.get("plotly_chart")
    assert len(charts) == 5  # loss + the four default monitors
    titles = [_shown(e.label) for e in app.expander]
    assert any("attention-numerics" in t and "cause" in t for t in titles)
    texts = [m.value for m in app.markdown]
    assert any("healthy runs' band at the same step" in t for t in texts)  # a band warning
    assert any("its CUSUM statistic" in t for t in texts)  # a symptom (trend) warning
    assert any("What to check:" in t and "FlashAttention" in t for t in texts)
    assert any("profile <b>gpt-moe</b>" in t for t in texts)  # the profile that judged it
    assert {m.label: m.value for m in app.metric}["divergence step"] == str(
        load_run(_path("fa-lowprec-s1")).end["divergence_step"]
    )
    app.checkbox[0].check().run()  # per-head detail
    assert not app.exception


@pytest.mark.slow
def test_compare_and_tuning_pages(history, monkeypatch):
    app = _page("compare", history, monkeypatch)
    assert len(app.get("plotly_chart")) == 1
    assert "lead: mechanism" in app.code[0].value
    app = _page("tuning", history, monkeypatch)
    assert "No tune report yet" in app.info[0].value
    report = {
        "rule": "test rule",
        "chosen": {"index": 0},
        "points": [
            {
                "params": {"k": 0.5},
                "families": [
                    {
                        "family": "router",
                        "runs": 3,
                        "detected": 3,
                        "detection_rate": 1.0,
                        "false_warnings_per_run": 0.0,
                        "lead_median": 400.0,
                        "lead_p10": 300.0,
                        "lead_p90": 500.0,
                    }
                ],
            }
        ],
    }
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


NASTY = (
    "**b** _e_ [l](http://127.0.0.1:9/l) ![i](http://127.0.0.1:9/i.png) www.x.test a@b.test "
    ':smile: :material/home: $x$ :red[r] <b>t</b> <img src="http://127.0.0.1:9/t.png"> '
    "&amp; `c` \\\n\n# h\n- li\n    code"
)


def test_text_helpers_leave_nothing_to_parse():
    escaped = html_text(NASTY)
    assert not set(escaped) & set("<>\"'`:\n\r$[]()*!\\")
    assert html.unescape(escaped) == NASTY
    assert block(escaped).startswith("<div") and "\n" not in block(escaped)
    with pytest.raises(ValueError):
        block("a\n\nb")
    label = md_text(NASTY)
    assert "\n" not in label and _shown(label) == NASTY.replace("\n", " ")
    resolved = re.sub(r"\\(.)", r"\1", label)  # the text GFM autolinks and emoji look at
    assert not any(s in resolved for s in ("www.", "a@b", "http:", ":smile:"))
    assert ":material/" not in label  # Streamlit rewrites that in the raw source
    assert md_code("a `b` c") == "`` a `b` c ``"
    assert plot_text(NASTY).count("<") == 0 and "$" not in plot_text(NASTY)


def test_charts_show_names_as_text():
    warning = {
        "family": "attention-numerics",
        "module": "<a href='x'>m</a>",
        "step": 5,
        "role": "<b>cause</b>",
    }
    points = [{"step": 5, "value": 1.0, "module": "<b>m</b>", "head": None}]
    fig = charts.monitor_figure("$t$", points, [warning], "attention-numerics")
    names = [t.name for t in fig.data]
    assert "&lt;b&gt;m&lt;/b&gt;" in names and fig.layout.title.text == "&#36;t&#36;"
    hover = fig.data[-1].hovertext[0]
    assert "<" not in hover and "&lt;a href='x'&gt;m&lt;/a&gt;" in hover
    fig = charts.compare_figure(
        "m",
        [{"run_id": "r<b>", "step": 1, "value": 1.0}],
        [{"run_id": "r<b>", "divergence_step": 1}],
    )
    assert fig.data[0].name == "r&lt;b&gt;"
    assert fig.layout.annotations[0].text == "r&lt;b&gt; diverges"


def _huge_run(root: Path) -> None:
    """A run at steps 0 and 2**63-1, the wire's bounds."""
    now = time.time()
    with DeltaStore(root) as store:
        b = BatchBuilder()
        b.add_lifecycle({"run_id": "huge", "kind": "start", "seq": 0, "labels": {}}, now)
        for seq, step in enumerate([0, 2**63 - 1], start=1):
            values = {"loss": 1.0, "attn.d2.entropy_mean@h.0.attn": 0.5}
            b.add_metrics({"run_id": "huge", "seq": seq, "step": step, "values": values}, now)
        store.write(b.take())


@pytest.mark.slow
def test_a_run_at_the_largest_step_is_drawn(tmp_path, monkeypatch):
    _huge_run(tmp_path / "history")
    app = _page("run", tmp_path / "history", monkeypatch, run="huge")  # no exception
    assert len(app.get("plotly_chart")) == 5 and not app.error
    app = _page("compare", tmp_path / "history", monkeypatch)
    assert len(app.get("plotly_chart")) == 1 and not app.error


def test_a_failing_query_is_a_message_not_a_traceback(tmp_path, monkeypatch):
    def overflow(*args, **kwargs):
        raise duckdb.OutOfRangeException("Overflow in addition of INT64 (<b>x</b> + 1)!")

    _huge_run(tmp_path / "history")
    monkeypatch.setattr(queries, "series_many", overflow)
    monkeypatch.setattr(queries, "series_across_runs", overflow)
    for name, query in (("run", {"run": "huge"}), ("compare", {})):
        app = _page(name, tmp_path / "history", monkeypatch, **query)  # no exception
        assert not app.get("plotly_chart") and "query failed" in app.error[0].value
        assert "Overflow in addition of INT64" in _shown(app.error[0].value)


@pytest.mark.slow
def test_run_page_says_what_each_rule_takes_to_fire(history, monkeypatch):
    """The run's stored records replayed through its profile: each rule's firing point in
    the run's own units (a level rule's factor on its warm-up, a CUSUM's drift)."""
    app = _page("run", history, monkeypatch, run="fa-lowprec-s1")
    (reach,) = [e for e in app.expander if "What each rule takes to fire" in _shown(e.label)]
    assert "profile gpt-moe" in _shown(reach.label)
    lines = [_shown(m.value) for m in reach.markdown]
    assert lines and any("fires" in line for line in lines)


def test_run_page_shows_the_recipe_why_its_profile_and_who_acted(tmp_path, monkeypatch):
    """A run trained with a cosine recipe: its recipe in the header, the profile's reason in
    its warnings (a recipe no calibrated profile was made on), and the actions people asked
    for: the approver of the applied one, the reason of the refused one."""
    import gzip
    import json

    from foreshock.lab.recorded import RECORDED_DIR
    from foreshock.remediation.remedy import Action, action_record

    source = RECORDED_DIR / "recipes-calibration" / "gpt-moe-fa-lowprec-cosine-at400-s110.jsonl.gz"
    lines = [json.loads(line) for line in gzip.decompress(source.read_bytes()).splitlines()]
    run_id = lines[0]["run_id"]
    ana = {"key_id": "0b742816f52c7054", "name": "ana"}
    asked = {"source": "approved", "family": "attention-numerics", "warning_id": "w-x"}
    acted = Action("hold-lr", **asked, module="h.1.attn", step=800, applied=True,
                   request_id="q1", approver=ana)  # fmt: skip
    refused = Action("stop", **asked, module=None, step=810, applied=False, request_id="q2",
                     error="refused: unsigned", detail={"refused": "unsigned"})  # fmt: skip
    path = tmp_path / "run.jsonl"
    actions = [action_record(run_id, 0, a) for a in (acted, refused)]
    path.write_text("".join(json.dumps(x) + "\n" for x in [*lines[:-1], *actions, lines[-1]]))
    with DeltaStore(tmp_path / "history") as store:
        store_recorded_runs(store, [path], default_config())
    app = _page("run", tmp_path / "history", monkeypatch, run=run_id)
    captions = html.unescape("\n".join(c.value for c in app.caption))
    assert "recipe: cosine lr 0.001, warm-up 100, 2000 steps" in captions
    assert "gpt-moe fits the model, but cosine lr 0.001" in _html(app)
    table = app.dataframe[0].value
    assert list(table["approver"]) == ["ana (key 0b742816f52c7054)", "an unverified sender"]
    assert list(table["outcome"]) == ["applied", "refused: unsigned"]
