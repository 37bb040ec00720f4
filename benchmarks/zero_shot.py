"""Zero-shot detection, leave one architecture out: judged on a model no rule was made on.

The zero-shot profile (:mod:`foreshock.detectors.zero_shot`) pools healthy runs of several
architectures. To see what it promises on a model it never saw, each architecture group of
the recorded lab runs (a folder of ``lab/runs``: the lab's GPT-MoE, its capacity-limited
dispatch, Mixtral, …) is held out in turn: the profile is calibrated on the *other* groups'
calibration healthy runs (``HELD_OUT_HEALTHY`` seeds excluded), then every run of the held-out
group is replayed under it. Per held-out group and scenario:

* healthy: runs with any mechanism warning (false warnings);
* fa-lowprec (diverged runs): attention-numerics named the cause, before divergence;
* lr-high (diverged runs): warned before divergence, and never named attention-numerics;
* lead: median steps from the first mechanism warning to the divergence.

``--groups`` picks folders under ``lab/runs`` (the top folder is ``gpt-moe``).

    python -m benchmarks.zero_shot                 # every group (~10 s)
    python -m benchmarks.zero_shot --save-profile  # also write the shipped zero-shot profile

``--save-profile`` writes ``detectors/calibrated/zero-shot.json``: the profile calibrated on
every group's calibration runs (``shipped_zero_shot``), what a run no profile fits gets.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from foreshock.detectors.replay import RunReport, replay_run
from foreshock.detectors.zero_shot import calibrate_zero_shot
from foreshock.lab.recorded import (
    HELD_OUT_HEALTHY,
    RECORDED_DIR,
    RecordedRun,
    load_run,
    seed_spans,
    shipped_runs,
)

from ._table import emit_json, format_table

GROUPS = {
    "gpt-moe": RECORDED_DIR,
    "gpt-moe+capacity-1": RECORDED_DIR / "gpt-moe+capacity-1",
    "mixtral": RECORDED_DIR / "mixtral",
}
SCENARIOS = ("healthy", "fa-lowprec", "lr-high")
PROFILE_FILE = Path(__file__).parents[1] / "detectors" / "calibrated" / "zero-shot.json"


def scenario_of(run: RecordedRun) -> str:
    return str(run.labels.get("scenario") or "")


def load_group(folder: Path) -> list[RecordedRun]:
    return [load_run(p) for p in shipped_runs(folder)]


def calibration_runs(name: str, runs: list[RecordedRun]) -> list[RecordedRun]:
    held = seed_spans(HELD_OUT_HEALTHY.get(name, "0-0"))
    return [r for r in runs if scenario_of(r) == "healthy" and r.labels.get("seed") not in held]


def shipped_zero_shot(names: list[str] | None = None) -> Any:
    """The zero-shot config calibrated on every group's calibration healthy runs."""
    groups = {n: calibration_runs(n, load_group(GROUPS[n])) for n in names or GROUPS}
    return calibrate_zero_shot(groups, replay_run)


def verdict(report: RunReport, scenario: str) -> dict[str, Any]:
    """What a run's warnings say against its scenario (mechanism warnings only)."""
    div = report.divergence_step
    mechanism = sorted((a for a in report.alerts if a.family != "symptom"), key=lambda a: a.step)
    before = [a for a in mechanism if div is None or a.step < div]
    first = before[0] if before else None
    cause = None if first is None else first.evidence.get("cause") or first.family
    return {
        "run": report.run_id,
        "scenario": scenario,
        "diverged": div is not None,
        "warned": bool(mechanism),
        "cause": cause,
        "lead": None if div is None or first is None else div - first.step,
        "named_attention": any(
            (a.evidence.get("cause") or a.family) == "attention-numerics" for a in mechanism
        ),
    }


def summarise(group: str, verdicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for scenario in SCENARIOS:
        mine = [v for v in verdicts if v["scenario"] == scenario]
        if not mine:
            continue
        diverged = [v for v in mine if v["diverged"]]
        leads = [v["lead"] for v in diverged if v["lead"] is not None]
        if scenario == "healthy":
            ok, of = sum(not v["warned"] for v in mine), len(mine)
        elif scenario == "fa-lowprec":
            ok, of = sum(v["cause"] == "attention-numerics" for v in diverged), len(diverged)
        else:
            ok = sum(v["lead"] is not None and not v["named_attention"] for v in diverged)
            of = len(diverged)
        rows.append(
            {
                "held out": group,
                "scenario": scenario,
                "runs": len(mine),
                "diverged": len(diverged),
                "right": f"{ok}/{of}",
                "rate": round(ok / of, 3) if of else None,
                "median lead": statistics.median(leads) if leads else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(GROUPS), help="groups to use")
    parser.add_argument("--save-profile", action="store_true", help="write zero-shot.json")
    args = parser.parse_args()
    names = args.groups.split(",")
    runs = {name: load_group(GROUPS[name]) for name in names}
    calibration = {name: calibration_runs(name, rs) for name, rs in runs.items()}
    rows, configs = [], {}
    for held in names:
        config = calibrate_zero_shot({g: calibration[g] for g in names if g != held}, replay_run)
        configs[held] = config.version
        ids = {r.run_id for r in calibration[held]}  # judged on its held-out runs too
        judged = [r for r in runs[held] if r.run_id not in ids and scenario_of(r) in SCENARIOS]
        verdicts = [verdict(replay_run(r, config), scenario_of(r)) for r in judged]
        rows += summarise(held, verdicts)
    headers = list(rows[0]) if rows else []
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    if args.save_profile:
        config = shipped_zero_shot(names)
        config.save(PROFILE_FILE)
        print(f"wrote {PROFILE_FILE} (version {config.version})")
    emit_json({"benchmark": "zero_shot", "groups": names, "configs": configs, "rows": rows})


if __name__ == "__main__":
    main()
