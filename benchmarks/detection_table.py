"""Detection on recorded lab runs: calibrate on some healthy seeds, judge on the rest.

Thresholds come from the healthy runs outside ``--held-out`` (by default
``foreshock.lab.recorded.HELD_OUT_HEALTHY``: seeds 10–14, 25–39 and 60–64;
:mod:`foreshock.detectors.calibrate`); every other run is held out. Per scenario:

* warned: runs with a warning of the fault's own family before divergence (fa-lowprec →
  attention-numerics, lr-high and gbs-small → router; combined: either); for healthy and
  fa-noise runs, any mechanism warning at all — a false alarm;
* attribution: the role of the run's first mechanism warning — cause of the right family
  (correct), of the wrong family (wrong), or ambiguous;
* lead: divergence step − first warning step, for the mechanism families and for the symptom
  family (loss, grad norm, weight norm: the baseline foreshock must beat);
* own family before symptom: diverged runs whose own-family warning came before any symptom
  warning (or with none) — the per-run version of the lead comparison.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from foreshock.detectors.calibrate import calibrate, leave_one_out_margin, uncalibrated
from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.replay import RunReport, replay
from foreshock.lab.recorded import HELD_OUT_HEALTHY, RECORDED_DIR, seed_spans

from ._table import emit_json, format_table

# gbs-small feeds the router's stable-winner loop too (noisier margins): its family is router
OWN = {"fa-lowprec": {"attention-numerics"}, "lr-high": {"router"}, "gbs-small": {"router"},
       "combined": {"attention-numerics", "router"}}  # fmt: skip


def _seed(path: Path) -> int:
    return int(path.name.split("-s")[-1].split(".")[0])


def _judge(report: RunReport, scenario: str) -> dict:
    div = report.divergence_step
    mechanism = [
        a for a in report.alerts if a.family != "symptom" and (div is None or a.step < div)
    ]
    symptom = report.first("symptom", before=div)
    first = mechanism[0] if mechanism else None
    own = OWN.get(scenario, set())
    own_first = next((a for a in mechanism if a.family in own), None)
    detected = any(a.family in own for a in mechanism) if own else bool(mechanism)
    if first is None:
        attribution = "none"
    elif first.role == "ambiguous":
        attribution = "ambiguous"
    else:
        attribution = "correct" if first.family in own else "wrong"
    return {"run": report.run_id, "divergence": div, "detected": detected,
            "attribution": attribution,
            "first": first and (first.family, first.module, first.step),
            "mechanism_lead": None if div is None or first is None else div - first.step,
            "before_symptom": div is not None and own_first is not None and (
                symptom is None or own_first.step < symptom.step),
            "symptom_lead": None if div is None or symptom is None else div - symptom.step,
            }  # fmt: skip


def _without(config: DetectorConfig, metrics: list[str]) -> DetectorConfig:
    known = {rule.metric for rule in config.rules}
    if unknown := set(metrics) - known:
        raise SystemExit(f"--without: no rule reads {sorted(unknown)}; rules read {sorted(known)}")
    return replace(config, rules=tuple(r for r in config.rules if r.metric not in metrics))


def _median(values: list[int]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RECORDED_DIR)
    parser.add_argument(
        "--held-out",
        default=HELD_OUT_HEALTHY,
        help="healthy seeds held out (FIRST-LAST[,FIRST-LAST...]); the other healthy calibrate",
    )
    parser.add_argument(
        "--margin",
        type=float,
        help="threshold margin (default: leave-one-out on the calibration runs)",
    )
    parser.add_argument("--quick", action="store_true", help="same runs (replay is fast)")
    parser.add_argument("--save-config", type=Path, help="write the calibrated config here")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="METRIC",
        help="drop a metric's rule, e.g. max_logit: what a model that can't report it gets",
    )
    args = parser.parse_args()
    paths = sorted(args.runs.glob("*.jsonl.gz"))
    scenario_of = {p: p.name.rsplit("-s", 1)[0] for p in paths}
    held_seeds = seed_spans(args.held_out)
    calib = [p for p in paths
             if scenario_of[p] == "healthy" and _seed(p) not in held_seeds]  # fmt: skip
    held = [p for p in paths if p not in calib]
    base = _without(DetectorConfig(), args.without)
    healthy = replay(calib, uncalibrated(base))
    margin = leave_one_out_margin(healthy, base) if args.margin is None else args.margin
    config = calibrate(healthy, base, margin=margin)
    if args.save_config:
        config.save(args.save_config)
    verdicts: dict[str, list[dict]] = {}
    for path, report in zip(held, replay(held, config), strict=True):
        verdicts.setdefault(scenario_of[path], []).append(_judge(report, scenario_of[path]))
    rows, figures = [], {}
    for scenario, runs in sorted(verdicts.items()):
        n = len(runs)
        mech = [r["mechanism_lead"] for r in runs if r["mechanism_lead"] is not None]
        sym = [r["symptom_lead"] for r in runs if r["symptom_lead"] is not None]
        count = {k: sum(r["attribution"] == k for r in runs) for k in
                 ("correct", "wrong", "ambiguous", "none")}  # fmt: skip
        detected = sum(r["detected"] for r in runs)
        diverged = sum(r["divergence"] is not None for r in runs)
        earlier = sum(r["before_symptom"] for r in runs)
        rows.append([f"{scenario} ({n})", f"{detected}/{n}", diverged, count["correct"],
                     count["wrong"], count["ambiguous"], _median(mech), _median(sym),
                     f"{earlier}/{diverged}" if scenario in OWN and diverged else "-"])  # fmt: skip
        figures[scenario] = {"runs": n, "detected": detected, "attribution": count,
                             "diverged": diverged, "own_family_before_symptom": earlier,
                             "mechanism_lead_median": _median(mech),
                             "symptom_lead_median": _median(sym), "verdicts": runs}  # fmt: skip
    dropped = f"; without {', '.join(args.without)}" if args.without else ""
    print(f"calibrated on {len(calib)} healthy runs (held out: seeds {args.held_out}), "
          f"margin {margin}; "
          f"false-alarm bound per run: {config.false_alarm}; config {config.version}"
          f"{dropped}")  # fmt: skip
    header = ["scenario (held out)", "warned", "diverged", "attribution ok", "wrong",
              "ambiguous", "lead: mechanism", "lead: symptom",
              "own family before symptom"]  # fmt: skip
    print(format_table(header, rows))
    emit_json({"config_version": config.version, "calibration_runs": len(calib),
               "without": args.without,
               "false_alarm_bound": config.false_alarm, "scenarios": figures})  # fmt: skip


if __name__ == "__main__":
    main()
