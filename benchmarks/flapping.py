"""Warnings that don't flap: how many records a warning's statistics must stay below h before
it resolves (``DetectorConfig.release``), chosen on calibration runs, judged on held-out ones.

A warning resolved the first record its statistic dipped under h, and reopened under a new id
when it crossed again: over the shipped fault runs most of the warnings resolved by their
statistic reopened a few records later — a page each for whoever is on call. Hysteresis keeps
a warning open until its statistics have stayed under h for ``release`` records in a row;
warnings open exactly when they did, so leads cannot change (checked: every run's first
warning, its step and family, is the same under each release).

The release is chosen on the fault runs (fa-lowprec, lr-high) of the calibration seeds of each
profile's folder (``CALIBRATION``): the smallest in ``RELEASES`` under which reopened warnings
are at most ``TARGET`` of the warnings opened. Reported on the held-out seeds: warnings opened,
reopened and resolved by their statistic, per profile, at release 1 (no hysteresis) and at
the chosen one.

    python -m benchmarks.flapping            # ~1 min
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from foreshock.detectors.profiles import choose_profile
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import RECORDED_DIR, RecordedRun, load_run, shipped_runs
from foreshock.operate.detect_commands import default_config

from ._table import emit_json, format_table

FOLDERS = {
    "gpt-moe": RECORDED_DIR,
    "gpt-moe+capacity-1": RECORDED_DIR / "gpt-moe+capacity-1",
    "mixtral": RECORDED_DIR / "mixtral",
}
FAULTS = ("fa-lowprec", "lr-high")
CALIBRATION = {"gpt-moe": range(0, 25), "mixtral": range(0, 12)}  # fault seeds that choose
RELEASES = (1, 2, 3, 4, 6, 8, 12, 16, 24)
TARGET = 0.05  # reopened / opened


def fault_runs(folder: Path) -> list[RecordedRun]:
    return [r for r in map(load_run, shipped_runs(folder)) if r.scenario in FAULTS]


def counts(runs: list[RecordedRun], release: int) -> dict[str, Any]:
    """Warnings opened, reopened (a (family, module) opened again after a statistic resolved
    it) and resolved by their statistic; and each run's first warning (step, family)."""
    opened = reopened = by_statistic = 0
    firsts = []
    profiles = default_config()
    for run in runs:
        config = choose_profile(profiles, {**run.start, "kind": "start"}).config
        report = replay_run(run, replace(config, release=release))
        resolved: set[tuple] = set()
        for event in report.events:
            key = (event.family, event.module)
            if event.event == "opened":
                opened += 1
                reopened += key in resolved
            elif event.event == "cleared" and event.evidence.get("resolved_by") == "statistic":
                by_statistic += 1
                resolved.add(key)
        first = min(report.alerts, key=lambda a: a.step, default=None)
        firsts.append(None if first is None else (first.step, first.family))
    return {
        "runs": len(runs),
        "opened": opened,
        "reopened": reopened,
        "resolved_by_statistic": by_statistic,
        "firsts": firsts,
    }


def choose(calibration: list[RecordedRun]) -> tuple[int, list[dict]]:
    """The smallest release whose reopened share on the calibration runs is ≤ TARGET."""
    tried = []
    for release in RELEASES:
        c = counts(calibration, release)
        tried.append({"release": release, **{k: v for k, v in c.items() if k != "firsts"}})
        if c["reopened"] <= TARGET * max(c["opened"], 1):
            return release, tried
    return RELEASES[-1], tried


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the release chosen, then one per
    profile's held-out fault runs: warnings opened and reopened at release 1 and at the chosen
    release, and whether every run's first warning stayed the same."""
    rows = [("release (records below h before a warning resolves)", str(result["release"]))]
    for row in result["rows"]:
        before = f"{row['opened (release 1)']} opened, {row['reopened (release 1)']} reopened"
        chosen = f"release {result['release']}"
        after = f"{row[f'opened ({chosen})']} opened, {row[f'reopened ({chosen})']} reopened"
        same = "same" if row["first warnings unchanged"] else "CHANGED"
        rows.append(
            (
                f"{row['profile']}: {row['held-out runs']} held-out fault runs",
                f"release 1: {before}; {chosen}: {after}; first warnings {same}",
            )
        )
    return rows


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    runs = {name: fault_runs(folder) for name, folder in FOLDERS.items()}
    calibrating = {
        name: [r for r in rs if r.seed in CALIBRATION.get(name, ())] for name, rs in runs.items()
    }
    chosen, tried = choose([r for rs in calibrating.values() for r in rs])
    rows, table = [], []
    for name, rs in runs.items():
        held = [r for r in rs if r not in calibrating[name]]
        if not held:
            continue
        before, after = counts(held, 1), counts(held, chosen)
        row = {
            "profile": name,
            "held-out runs": len(held),
            "opened (release 1)": before["opened"],
            "reopened (release 1)": before["reopened"],
            f"opened (release {chosen})": after["opened"],
            f"reopened (release {chosen})": after["reopened"],
            "first warnings unchanged": before["firsts"] == after["firsts"],
        }
        rows.append(row)
        table.append(list(row.values()))
    print(format_table(list(rows[0]), table))
    print(f"release chosen on {sum(map(len, calibrating.values()))} calibration runs: {chosen}")
    emit_json({"benchmark": "flapping", "release": chosen, "target": TARGET, "tried": tried,
               "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
