"""What a router collapse costs, per profile: the loss gap to healthy runs and the dropped tokens.

The ``router-collapse`` scenario ramps the routers' learning rate alone (×1 → ×100 over 1,000
steps from step 300). Per profile folder of recorded runs (``--runs``, repeatable), and per
scenario (healthy, router-mild, router-collapse):

* diverged: runs whose loss diverged (the lab's rule);
* loss at the horizon: each run's mean loss over its last 200 steps of records, median over
  runs, and its gap to the healthy median (nats per byte);
* token entropy: the routers' normalised per-token routing entropy H/ln E at the last record,
  median over runs and routers — where the collapse shows;
* dropped: ``router.dropped_fraction`` at the last record, median over runs and routers
  (capacity-limited profiles only): what a collapse costs in tokens that skip their experts.

``--quick`` reads at most 3 runs per scenario.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from foreshock.detectors.profiles import profile_of
from foreshock.lab.recorded import RECORDED_DIR, RecordedRun, load_run, shipped_runs
from foreshock.table import median

from ._table import emit_json, format_table

SCENARIOS = ("healthy", "router-mild", "router-collapse")
TAIL = 200  # steps of records averaged for the loss at the horizon


def _tail_loss(run: RecordedRun) -> float | None:
    last = run.records[-1]["step"]
    losses = [r["values"].get("loss") for r in run.records if r["step"] > last - TAIL]
    losses = [x for x in losses if x is not None]
    return statistics.fmean(losses) if losses else None


def _last(run: RecordedRun, metric: str) -> list[float]:
    values = run.records[-1]["values"]
    return [v for k, v in values.items() if k.startswith(metric + "@") and v is not None]


def _rounded_median(values: list[float]) -> float | None:
    found = median(values)
    return None if found is None else round(found, 4)


def _summary(runs: list[RecordedRun]) -> dict:
    losses = [x for x in map(_tail_loss, runs) if x is not None]
    entropy = [x for run in runs for x in _last(run, "router.token_entropy_norm")]
    dropped = [x for run in runs for x in _last(run, "router.dropped_fraction")]
    return {
        "runs": len(runs),
        "diverged": sum(r.divergence_step is not None for r in runs),
        "loss": _rounded_median(losses),
        "token_entropy": _rounded_median(entropy),
        "dropped": _rounded_median(dropped),
    }


def profile_figures(folder: Path, quick: bool) -> tuple[str, dict[str, dict]]:
    by_scenario: dict[str, list[RecordedRun]] = defaultdict(list)
    profile = None
    for path in shipped_runs(folder):
        run = load_run(path)
        profile = profile or profile_of(run.labels)
        scenario = run.labels.get("scenario")
        wanted = scenario in SCENARIOS and run.end is not None
        if wanted and (not quick or len(by_scenario[scenario]) < 3):
            by_scenario[scenario].append(run)
    figures = {s: _summary(by_scenario[s]) for s in SCENARIOS if by_scenario[s]}
    healthy = figures.get("healthy", {}).get("loss")
    for entry in figures.values():
        gap = None if healthy is None or entry["loss"] is None else entry["loss"] - healthy
        entry["loss_gap"] = None if gap is None else round(gap, 4)
    return profile or "?", figures


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per profile and scenario: runs and
    diverged ones, the loss at the horizon and its gap to the profile's healthy runs, the token
    entropy, and the dropped fraction where the dispatch drops tokens."""
    rows = []
    for profile, by_scenario in result["profiles"].items():
        for scenario, f in by_scenario.items():
            dropped = "" if f["dropped"] is None else f", dropped fraction {f['dropped']}"
            rows.append(
                (
                    f"{profile}, {scenario} ({f['runs']} runs, {f['diverged']} diverged)",
                    f"loss {f['loss']} (gap {f['loss_gap']:+}), token entropy "
                    f"{f['token_entropy']}{dropped}",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        type=Path,
        action="append",
        help="a profile's folder of runs (repeatable; default: the shipped "
        "Mixtral and capacity-limited GPT-MoE folders)",
    )
    parser.add_argument("--quick", action="store_true", help="at most 3 runs per scenario")
    args = parser.parse_args()
    folders = args.runs or [RECORDED_DIR / "gpt-moe+capacity-1", RECORDED_DIR / "mixtral"]
    rows, out = [], {}
    for folder in folders:
        profile, figures = profile_figures(folder, args.quick)
        out[profile] = figures
        for scenario, f in figures.items():
            rows.append(
                [
                    profile,
                    f"{scenario} ({f['runs']})",
                    f["diverged"],
                    f["loss"],
                    f["loss_gap"],
                    f["token_entropy"],
                    f["dropped"],
                ]
            )
    print(
        f"loss = mean of the last {TAIL} steps' records, median over runs (nats/byte); "
        "gap = minus the healthy median; token entropy H/ln E and dropped fraction at the "
        "last record, median over runs and routers"
    )
    print(
        format_table(
            [
                "profile",
                "scenario (runs)",
                "diverged",
                "loss at horizon",
                "gap",
                "token entropy",
                "dropped",
            ],
            rows,
        )
    )
    emit_json({"tail_steps": TAIL, "profiles": out})


if __name__ == "__main__":
    main()
