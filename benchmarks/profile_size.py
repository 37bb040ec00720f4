"""How many healthy runs a user's profile needs, against the zero-shot profile.

``foreshock calibrate --name`` makes a profile from a user's healthy runs
(:mod:`foreshock.detectors.make_profile`). Here, per architecture group of the recorded lab
runs, profiles are made from the first N of the group's calibration healthy runs (``N`` in
``--sizes``; ``--draws`` disjoint-as-possible draws of N, rotated through the calibration
seeds) exactly as the command makes them, and judged on the group's held-out runs — healthy
(``HELD_OUT_HEALTHY`` seeds), fa-lowprec and lr-high — with the one judge
(:func:`foreshock.detectors.judge.judge`), beside the zero-shot profile calibrated without
the group's architecture (what the same user gets with no healthy runs at all):

* quiet: held-out healthy runs with no mechanism warning;
* fa-lowprec: diverged runs whose first mechanism warning names attention-numerics;
* lr-high: diverged runs warned before divergence and never named attention-numerics;
* lead: median steps from the first mechanism warning to the divergence (fa-lowprec).

    python -m benchmarks.profile_size                      # mixtral and gpt-moe (~2 min)
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from foreshock.detectors.make_profile import make_profile
from foreshock.detectors.replay import replay_run
from foreshock.detectors.zero_shot import calibrate_zero_shot

from ._table import emit_json, format_table
from .zero_shot import (
    GROUPS,
    architecture,
    by_architecture,
    calibration_runs,
    floors_without,
    load_group,
    right,
    verdict,
)

SCENARIOS = ("healthy", "fa-lowprec", "lr-high")


def judged_runs(name: str, runs: list) -> list:
    """The group's runs no profile of it is made from: held-out healthy, and the faults."""
    calibration = {r.run_id for r in calibration_runs(name, runs)}
    return [r for r in runs if r.scenario in SCENARIOS and r.run_id not in calibration]


def profile_row(label: str, group: str, config: Any, runs: list) -> dict[str, Any]:
    """One profile's row: right of judged per scenario, and the fa-lowprec median lead."""
    verdicts = [verdict(replay_run(r, config), r.scenario) for r in runs]
    row: dict[str, Any] = {"group": group, "profile": label}
    for scenario in SCENARIOS:
        mine = [v for v in verdicts if v["scenario"] == scenario]
        judged = mine if scenario == "healthy" else [v for v in mine if v["diverged"]]
        row[scenario] = f"{sum(right(v) for v in judged)}/{len(judged)}"
    leads = [v["lead"] for v in verdicts if v["scenario"] == "fa-lowprec" and v["lead"]]
    row["fa lead"] = statistics.median(leads) if leads else None
    return row


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per group and profile: healthy runs
    kept quiet, fa-lowprec runs with attention named, lr-high runs warned, fa-lowprec's
    lead."""
    return [
        (
            f"{row['group']}: {row['profile']}",
            f"healthy quiet {row['healthy']}; fa-lowprec named {row['fa-lowprec']}; "
            f"lr-high warned {row['lr-high']}; fa lead {row['fa lead']}",
        )
        for row in result["rows"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="mixtral,gpt-moe", help="groups to measure")
    parser.add_argument("--sizes", default="3,5,7,10", help="healthy runs per profile")
    parser.add_argument("--draws", type=int, default=2, help="draws of each size")
    args = parser.parse_args()
    everything = {n: load_group(GROUPS[n]) for n in GROUPS if load_group(GROUPS[n])}
    rows = []
    for group in args.groups.split(","):
        runs = everything[group]
        judged = judged_runs(group, runs)
        others = {
            g: calibration_runs(g, rs)
            for g, rs in everything.items()
            if architecture(g) != architecture(group)
        }
        floors = floors_without(architecture(group))
        zero = calibrate_zero_shot(by_architecture(others), replay_run, floors=floors)
        rows.append(profile_row("zero-shot (0 of its runs)", group, zero, judged))
        pool = calibration_runs(group, runs)
        for size in (int(s) for s in args.sizes.split(",")):
            for draw in range(args.draws):
                first = (draw * size) % len(pool)
                healthy = (pool[first:] + pool[:first])[:size]
                config, _ = make_profile(healthy, replay_run, allow_few=True)
                rows.append(
                    profile_row(f"{size} healthy runs (draw {draw + 1})", group, config, judged)
                )
    headers = list(rows[0])
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    emit_json({"benchmark": "profile_size", "rows": rows})


if __name__ == "__main__":
    main()
