"""Which actions may run unasked where the profile is uncertain: the zero-shot profile, and a
default bound on the rules' stated false-alarm rates.

Every recorded lab run of each architecture is judged by the zero-shot profile calibrated
without that architecture (as :mod:`benchmarks.zero_shot` holds it out: the profile a model
no one calibrated gets), and the default remediation policy decides on its warnings in order,
acting on nothing (``dry_run``). For each candidate bound on ``max_false_alarm_rate`` (the
policy acts unasked only on a warning whose rule states a per-run false-alarm rate at most
this), per action:

* healthy runs it would have acted on (a false action; the run's cost is what
  ``benchmarks.action_cost`` measures for that action);
* diverging fa-lowprec and lr-high runs whose first action is the right one (the remedy of
  the scenario's cause) before the divergence — the runs it could save.

    python -m benchmarks.unasked_actions        # every group (~1 min)
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from typing import Any

from foreshock.catalogue import scenario as catalogue_scenario
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import shipped_runs
from foreshock.remediation.remedy import DEFAULT_ACTIONS, Remediator, RemedyPolicy

from ._table import emit_json, format_table
from .zero_shot import GROUPS, calibration_runs, load_group, zero_shot_without

BOUNDS = (None, 0.1, 0.07, 0.05)  # per-run false-alarm rates (None: no bound)
DIVERGING = ("fa-lowprec", "lr-high")


def first_action(alerts: list[Any], policy: RemedyPolicy) -> tuple[str, int] | None:
    """The first action ``policy`` takes on these warnings in order: (kind, step)."""
    remediator = Remediator(policy, None)
    for alert in sorted(alerts, key=lambda a: a.step):
        for decision in remediator.decide(alert.step, [alert]):
            return decision["kind"], alert.step
    return None


def held_out_reports() -> list[tuple[str, Any]]:
    """(scenario, replay report) of every recorded run under the zero-shot profile that
    left its architecture out."""
    names = [n for n in GROUPS if any(shipped_runs(GROUPS[n]))]
    runs = {name: load_group(GROUPS[name]) for name in names}
    calibration = {name: calibration_runs(name, rs) for name, rs in runs.items()}
    reports = []
    for held in names:
        config = zero_shot_without(held, calibration)
        reports += [(r.scenario, replay_run(r, config)) for r in runs[held]]
    return reports


def judge_bound(reports: list[tuple[str, Any]], bound: float | None) -> dict[str, Any]:
    policy = RemedyPolicy(max_false_alarm_rate=bound)
    false: Counter[str] = Counter()
    right, diverging = 0, 0
    for scenario, report in reports:
        action = first_action(report.alerts, policy)
        if scenario == "healthy" and action is not None:
            false[action[0]] += 1
        if scenario in DIVERGING and report.divergence_step is not None:
            diverging += 1
            wanted = DEFAULT_ACTIONS[catalogue_scenario(scenario).right_causes[0]]
            right += (
                action is not None and action[0] == wanted and action[1] < report.divergence_step
            )
    healthy = sum(1 for scenario, _ in reports if scenario == "healthy")
    return {
        "bound": "none" if bound is None else bound,
        "healthy runs acted on": f"{sum(false.values())}/{healthy}",
        "false actions by kind": dict(sorted(false.items())),
        "diverging runs, right action first": f"{right}/{diverging}",
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for row in result["rows"]:
        kinds = ", ".join(f"{k} {v}" for k, v in row["false actions by kind"].items()) or "-"
        value = (
            f"healthy runs acted on {row['healthy runs acted on']} ({kinds}); diverging runs "
            f"with the right action first {row['diverging runs, right action first']}"
        )
        rows.append((f"bound {row['bound']} on the stated false-alarm rate", value))
    return rows


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    logging.getLogger("foreshock.remedy").setLevel(logging.ERROR)  # one line per decision
    reports = held_out_reports()
    rows = [judge_bound(reports, bound) for bound in BOUNDS]
    print("Zero-shot profile, each architecture held out: the default policy's first action")
    print(format_table(list(rows[0]), [[str(v) for v in r.values()] for r in rows]))
    emit_json({"benchmark": "unasked_actions", "rows": rows})


if __name__ == "__main__":
    main()
