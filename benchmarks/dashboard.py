"""Dashboard render time in a real browser, on a 200-run × 20,000-step history.

The history is :func:`benchmarks.storage.build_history` (``--runs``, ``--steps``, ``--every``;
or an existing store with ``--store``). ``foreshock dashboard`` serves it; headless Chromium
(Debian's, via Playwright) loads each page by URL — a full page load, the worst case — and the
clock stops when the page shows its data:

* fleet — every run's row is in the table;
* run page — the loss and the four default monitor charts are drawn (5 plotly SVGs).

Between repeats the benchmark waits past the data cache's lifetime, so every render queries
the store afresh. The first load after the server starts (Streamlit and plotly.js warming up)
is reported apart. Screenshots of the four pages go to ``--screenshots``.
Targets (issue 7): fleet ≤ 2 s, run page ≤ 3 s (medians).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from foreshock.storage.store import store_exists
from foreshock.transport.broker import free_port

from ._table import emit_json, format_table, median
from .storage import build_history

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PLOTS_DRAWN = "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 10"


def _serve(store: Path) -> tuple[subprocess.Popen, str]:
    import urllib.request

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "dashboard",
            "--store",
            str(store),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise TimeoutError("dashboard did not start")


def _load(page, url: str, ready: str) -> float:
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_function(ready, timeout=120_000, polling=50)
    return time.perf_counter() - start


def measure(url: str, runs: int, repeats: int, shots: Path) -> dict:
    from playwright.sync_api import sync_playwright

    from foreshock.dashboard.data import TTL  # streamlit's: not on importing this module

    run_id = f"fleet-{runs // 2:04d}"
    fleet_ready = f"document.querySelectorAll('table.fs-fleet tbody tr').length === {runs}"
    pages = {
        "fleet": (f"{url}/", fleet_ready),
        "run page": (f"{url}/run?run={run_id}", PLOTS_DRAWN),
    }
    times: dict[str, list[float]] = {name: [] for name in pages}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        cold = {name: _load(page, *target) for name, target in pages.items()}
        for _ in range(repeats):
            for name, target in pages.items():
                time.sleep(TTL + 0.5)
                times[name].append(_load(page, *target))
        shots.mkdir(parents=True, exist_ok=True)
        compare = "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2"
        extra = {"compare": (f"{url}/compare", compare), "tuning": (f"{url}/tuning", "true")}
        for name, (target, ready) in {**pages, **extra}.items():
            try:
                _load(page, target, ready)
                time.sleep(1.0)
                page.screenshot(path=shots / f"{name.replace(' ', '-')}.png", full_page=True)
            except Exception as exc:  # a missing screenshot must not lose the timings
                print(f"screenshot of {name} failed: {exc}", file=sys.stderr)
        browser.close()
    return {"cold": cold, "times": times}


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the fleet page's and the run page's render
    times in Chromium (medians) against their targets."""
    return [
        (
            f"fleet page in Chromium, {result['runs']} runs × {result['steps']:,} steps (median)",
            f"{result['fleet_median_s']:.2f} s (target ≤ 2 s)",
        ),
        ("run page in Chromium (median)", f"{result['run_page_median_s']:.2f} s (target ≤ 3 s)"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 runs × 5,000 steps, 3 repeats")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--store", type=Path, help="an existing history to serve instead")
    parser.add_argument("--screenshots", type=Path, default=Path("artifacts/screenshots"))
    args = parser.parse_args()
    if args.quick:
        args.runs, args.steps, args.repeats = 20, 5000, 3
    temp = None
    store = args.store
    if store is None or not store_exists(str(store)):
        store = store or Path(tempfile.mkdtemp(prefix="foreshock-dash-")) / "history"
        temp = None if args.store else store.parent
        build_history(store, args.runs, args.steps, args.every)
    process, url = _serve(store)
    try:
        result = measure(url, args.runs, args.repeats, args.screenshots)
    finally:
        process.terminate()
        process.wait(20)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    medians = {k: median(v) for k, v in result["times"].items()}
    print(
        f"history: {args.runs} runs × {args.steps} steps (every {args.every}); "
        f"screenshots in {args.screenshots}"
    )
    print(
        format_table(
            [
                "page (full load in Chromium)",
                "first load s",
                "median s",
                "min s",
                "max s",
                "target s",
            ],
            [
                [
                    k,
                    round(result["cold"][k], 2),
                    round(medians[k], 2),
                    round(min(v), 2),
                    round(max(v), 2),
                    {"fleet": 2, "run page": 3}[k],
                ]
                for k, v in result["times"].items()
            ],
        )
    )
    emit_json(
        {
            "runs": args.runs,
            "steps": args.steps,
            "every": args.every,
            "fleet_median_s": round(medians["fleet"], 3),
            "run_page_median_s": round(medians["run page"], 3),
            "first_load_s": {k: round(v, 3) for k, v in result["cold"].items()},
            "samples_s": {k: [round(x, 3) for x in v] for k, v in result["times"].items()},
            "targets_met": {
                "fleet": medians["fleet"] <= 2.0,
                "run_page": medians["run page"] <= 3.0,
            },
            "screenshots": str(args.screenshots),
        }
    )


if __name__ == "__main__":
    main()
