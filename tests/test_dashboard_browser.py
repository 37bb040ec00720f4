"""End to end in a real headless Chromium: `foreshock dashboard` serving a seeded history.

Screenshots of every page go to ``$FORESHOCK_ARTIFACTS`` (default ``artifacts/screenshots``).
A cold Streamlit start renders a blank page for its first seconds, so every check waits for
the element it needs rather than for a fixed time.

The history also holds a run whose labels, project, scenario, run id, module name and warning
text carry Markdown and HTML aimed at a recording HTTP server of the test's own: the pages must
show that text as text — no element made from it, no request to that server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import require_tool
from test_dashboard import _path, seed_history

from foreshock.detectors.engine import RunDetector
from foreshock.lab.recorded import load_run
from foreshock.operate.detect_commands import default_config
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore
from foreshock.transport.broker import free_port

ARTIFACTS = Path(os.environ.get("FORESHOCK_ARTIFACTS", "artifacts")) / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
INJECTED_RUN = "inj._em_:smile:www.example.test+a@b.test"  # as much Markdown as the wire allows


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dashboard exited: {process.communicate()[1]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


class _Record(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        self.send_response(204)
        self.end_headers()

    do_POST = do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def recorder():
    """An HTTP server on 127.0.0.1 that only records what it is asked for."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Record)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def injected_text(base: str) -> dict[str, str]:
    """Markdown and HTML in every free-text field, each aimed at ``base`` (the recorder)."""
    md = (
        f"**md-bold** _md-em_ [md-link]({base}/md-link) ![md-img]({base}/md-img.png) "
        f"{base}/autolink www.example.test mail@example.test :smile: :material/home: "
        "$x^2$ :red[md-red]"
    )
    tags = (
        f'<b>tag-bold</b> <a href="{base}/tag-link">tag-link</a> '
        f'<img src="{base}/tag-img.png" onerror="fetch(\'{base}/onerror\')"> '
        f"<script>fetch('{base}/script')</script> "
        f"<style>body {{background: url({base}/css.png)}}</style>"
    )
    return {
        "project": f"proj **md-bold** <b>tag-bold</b> & &amp; {base}/project",
        "scenario": f'scen\n\n![md-img]({base}/scenario.png)\n\n<img src="{base}/scen.png">'
        "\n\n**md-bold**",  # blank lines: out of any HTML block
        "note": f"{md} {tags}",
        "key": "**key** <i>k</i>",
        "module": f'h.0 **md-bold** <b>tag-bold</b> <img src="{base}/module.png"> '
        f"[md-link]({base}/module-link)\n\n![md-img]({base}/module-md.png) $x$",
        "check": f"check **md-bold** [md-link]({base}/check-link)\n\n"
        f'![md-img]({base}/check.png) <img src="{base}/check-tag.png">',
    }


def seed_injected(root: Path, text: dict[str, str]) -> None:
    """A run (warning open, still training) carrying ``text`` everywhere a producer or a
    detector can put free text, written the way the sink writes it."""
    run, b, now = load_run(_path("fa-lowprec-s1")), BatchBuilder(), time.time()
    labels = {
        **run.start["labels"],
        "project": text["project"],
        "scenario": text["scenario"],
        "note": text["note"],
        text["key"]: "v",
    }
    start = {**run.start, "run_id": INJECTED_RUN, "kind": "start", "seq": 0, "labels": labels}
    b.add_lifecycle(start, now)
    detector = RunDetector(INJECTED_RUN, default_config())
    detector.update(start)
    rename = lambda key: key.replace("@h.0.attn", "@" + text["module"])  # noqa: E731
    for seq, record in enumerate([r for r in run.records if r["step"] <= 1000], start=1):
        message = {**record, "run_id": INJECTED_RUN, "seq": seq}
        b.add_metrics(
            {**message, "values": {rename(k): v for k, v in record["values"].items()}}, now
        )
        for event in detector.update({**message, "kind": "metrics"}):  # calibrated names
            warning = event.to_message()
            if warning["module"] == "h.0.attn":
                warning["module"], warning["series"] = text["module"], rename(warning["series"])
            warning["evidence"] = {**(warning["evidence"] or {}), "check": text["check"]}
            b.add_warning(warning, now)
    with DeltaStore(root) as store:
        store.write(b.take())


def seed_collision(root: Path, run_id: str) -> None:
    """The collision warning the detectors raise when another job wrote under ``run_id``."""
    from foreshock.detectors.collisions import Collisions

    stray = {"attempt": 7, "kind": "metrics", "step": 0}
    (event,) = Collisions(run_id, None).stray(stray, 3, 500)
    b = BatchBuilder()
    b.add_warning(event.to_message(), time.time())
    with DeltaStore(root) as store:
        store.write(b.take())


@pytest.fixture(scope="module")
def url(tmp_path_factory, recorder):
    root = tmp_path_factory.mktemp("browser") / "history"
    seed_history(root)
    seed_injected(root, injected_text(f"http://127.0.0.1:{recorder.server_port}"))
    seed_collision(root, "healthy-s3")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "dashboard",
            "--store",
            str(root),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(address, process)
        yield address
    finally:
        process.terminate()
        process.wait(20)
        with socket.socket() as s:  # streamlit itself got the signal: nobody listens there
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


@pytest.fixture(scope="module")
def page(url):
    chromium = require_tool("chromium")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield tab
        browser.close()


def test_fleet_page_lists_runs_with_their_statuses(url, page):
    page.goto(f"{url}/")
    page.wait_for_selector('tr[data-run="live-fa"]', timeout=90_000)
    status = {
        row.get_attribute("data-run"): row.locator(".fs-status").inner_text()
        for row in page.locator("table.fs-fleet tbody tr").all()
    }
    assert status == {
        "live-fa": "warning: attention-numerics",
        "fa-lowprec-s1": "diverged",
        "lr-high-s2": "diverged",
        "healthy-s3": "finished",
        INJECTED_RUN: "warning: attention-numerics",
    }
    badged = [
        row.get_attribute("data-run")
        for row in page.locator("table.fs-fleet tbody tr").all()
        if row.locator(".fs-collision").count()
    ]
    assert badged == ["healthy-s3"]  # another job wrote under it: flagged, status its own
    lead = page.locator('tr[data-run="fa-lowprec-s1"] td').nth(9).inner_text()
    assert lead.isdigit() and int(lead) > 0  # the lead of its first warning, in steps
    page.screenshot(path=ARTIFACTS / "fleet.png", full_page=True)


def test_run_page_shows_the_loss_and_a_warning_marker(url, page):
    page.goto(f"{url}/run?run=fa-lowprec-s1")
    page.wait_for_selector(".js-plotly-plot", timeout=90_000)
    page.wait_for_function(
        "document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=60_000
    )
    loss = page.locator(".js-plotly-plot").first
    assert "loss" in loss.inner_text()
    assert loss.locator("text=⚠ attention-numerics").count() == 1  # the marker's legend
    assert loss.locator("text=/lead \\d+ steps/").count() == 1  # the lead span
    assert page.locator("text=/divergence @ \\d+/").count() >= 1
    page.screenshot(path=ARTIFACTS / "run.png", full_page=True)


def test_compare_and_tuning_pages_render(url, page):
    page.goto(f"{url}/compare")
    page.wait_for_selector(".js-plotly-plot", timeout=90_000)
    page.wait_for_selector("text=lead", timeout=30_000)
    shown = page.locator("body").inner_text()
    known = ("live-fa", "fa-lowprec-s1", "lr-high-s2", "healthy-s3", INJECTED_RUN)
    assert sum(run in shown for run in known) >= 2  # the runs compared, by name
    page.screenshot(path=ARTIFACTS / "compare.png", full_page=True)
    page.goto(f"{url}/tuning")
    page.wait_for_selector("text=live detector config", timeout=90_000)
    page.screenshot(path=ARTIFACTS / "tuning.png", full_page=True)


def test_profiles_page_shows_each_model_its_profile_and_rules(url, page):
    """The seeded lab runs are the GPT-MoE the shipped ``gpt-moe`` profile was calibrated
    on: the page names the model, that profile (shipped) and its rules' thresholds."""
    page.goto(f"{url}/profiles")
    page.wait_for_selector("text=profile in force", timeout=90_000)
    shown = _plain(page.locator("body").inner_text())
    assert "gpt-moe L2 d128" in shown and "gpt-moe (shipped)" in shown
    assert "policy: approve" in shown and "fires when" in shown and "stated" in shown
    assert "band widths outside the healthy band" in shown
    page.screenshot(path=ARTIFACTS / "profiles.png", full_page=True)


# elements the injected text must not have made: anything pointing at the recorder or at the
# autolinkable names, and bold/italic/emoji/maths/icons made from its Markdown or HTML
MADE = """([port, markers]) => {
  const made = [];
  for (const el of document.querySelectorAll('img, image, a, script, style, link, iframe')) {
    const url = ['src', 'href', 'xlink:href'].map(a => el.getAttribute(a) || '').join(' ');
    const text = ['SCRIPT', 'STYLE'].includes(el.tagName) ? el.textContent : '';
    if ((url + text).includes(port) || /(^| )(https?:\\/\\/[^ /]*example\\.test|mailto:)/.test(url))
      made.push(el.outerHTML.slice(0, 200));
  }
  for (const el of document.querySelectorAll('b, strong, em, i, tspan, span, a'))
    if (markers.includes(el.textContent.trim())) made.push(el.outerHTML.slice(0, 200));
  for (const el of document.querySelectorAll('.katex, [aria-label="home icon"]'))
    made.push(el.outerHTML.slice(0, 200));
  if (document.body.innerText.includes('\\u{1F604}')) made.push('an emoji from :smile:');
  return made;
}"""
MARKERS = ["md-bold", "md-em", "md-link", "md-img", "tag-bold", "tag-link", "md-red", "k", "key"]


def _plain(text: str) -> str:
    """Whitespace collapsed, and no word joiner (what the dashboard puts in Markdown labels
    to keep autolinks out: invisible)."""
    return " ".join(text.replace("\u2060", "").split())


def _shown(page, selector: str) -> str:
    return _plain(" ".join(e.text_content() or "" for e in page.locator(selector).all()))


def test_injected_markdown_and_html_stay_text(url, page, recorder):
    port = str(recorder.server_port)
    text = injected_text(f"http://127.0.0.1:{port}")
    page.goto(f"{url}/")
    row = page.locator(f'tr[data-run="{INJECTED_RUN}"]')
    row.wait_for(timeout=90_000)
    cells = [_plain(c.inner_text()) for c in row.locator("td").all()]
    assert cells[0] == INJECTED_RUN and cells[2] == _plain(text["scenario"])
    assert cells[3] == _plain(text["project"]) and _plain(text["module"]) in cells[6]
    assert page.evaluate(MADE, [port, MARKERS]) == []
    page.screenshot(path=ARTIFACTS / "injected-fleet.png", full_page=True)

    page.goto(f"{url}/run?run={quote(INJECTED_RUN, safe='')}")
    page.wait_for_function(
        "document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=90_000
    )
    for summary in page.locator('[data-testid="stExpander"] summary').all():
        summary.click()  # every warning open: its explanation and evidence in view
    page.wait_for_selector("text=What to check:", timeout=30_000)
    body = _plain(page.locator("body").inner_text())
    for field in ("project", "scenario", "note", "key", "check"):
        assert _plain(text[field]) in body, field
    titles = _shown(page, '[data-testid="stExpander"] summary')
    assert f"{_plain(text['module'])} · step 925" in titles
    legends = _shown(page, ".js-plotly-plot .legendtext")
    assert _plain(text["module"]) in legends
    assert page.evaluate(MADE, [port, MARKERS]) == []
    page.screenshot(path=ARTIFACTS / "injected-run.png", full_page=True)
    time.sleep(1)  # anything the pages asked for has reached the recorder by now
    assert recorder.requests == []
