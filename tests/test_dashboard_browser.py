"""End to end in a real headless Chromium: `foreshock dashboard` serving a seeded history.

Screenshots of every page go to ``$FORESHOCK_ARTIFACTS`` (default ``artifacts/screenshots``).
A cold Streamlit start renders a blank page for its first seconds, so every check waits for
the element it needs rather than for a fixed time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import require_tool
from test_dashboard import seed_history

from foreshock.transport.broker import free_port

ARTIFACTS = Path(os.environ.get("FORESHOCK_ARTIFACTS", "artifacts")) / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


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


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser") / "history"
    seed_history(root)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli", "dashboard", "--store", str(root),
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
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
    status = {row.get_attribute("data-run"): row.locator(".fs-status").inner_text()
              for row in page.locator("table.fs-fleet tbody tr").all()}  # fmt: skip
    assert status == {"live-fa": "warning: attention-numerics", "fa-lowprec-s1": "diverged",
                      "lr-high-s2": "diverged", "healthy-s3": "finished"}  # fmt: skip
    page.screenshot(path=ARTIFACTS / "fleet.png", full_page=True)


def test_run_page_shows_the_loss_and_a_warning_marker(url, page):
    page.goto(f"{url}/run?run=fa-lowprec-s1")
    page.wait_for_selector(".js-plotly-plot", timeout=90_000)
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 5",
                           timeout=60_000)  # fmt: skip
    loss = page.locator(".js-plotly-plot").first
    assert "loss" in loss.inner_text()
    assert loss.locator("text=⚠ attention-numerics").count() == 1  # the marker's legend
    assert loss.locator("text=/lead \\d+ steps/").count() == 1  # the lead span
    assert page.locator("text=/divergence @ \\d+/").count() >= 1
    page.screenshot(path=ARTIFACTS / "run.png", full_page=True)


def test_compare_and_tuning_pages_render(url, page):
    page.goto(f"{url}/compare")
    page.wait_for_selector(".js-plotly-plot", timeout=90_000)
    page.screenshot(path=ARTIFACTS / "compare.png", full_page=True)
    page.goto(f"{url}/tuning")
    page.wait_for_selector("text=live detector config", timeout=90_000)
    page.screenshot(path=ARTIFACTS / "tuning.png", full_page=True)
