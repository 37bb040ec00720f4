"""Detection on recorded lab runs: calibrate on some healthy seeds, judge on the rest.

One profile (architecture and dispatch) at a time: ``--runs`` is its folder of recorded runs
(``lab/runs`` for the lab's GPT-MoE, ``lab/runs/mixtral``, ``lab/runs/gpt-moe+capacity-1``).
Thresholds and healthy bands come from its healthy runs outside ``--held-out`` (by default the
profile's ``foreshock.lab.recorded.HELD_OUT_HEALTHY`` seeds;
:func:`foreshock.detectors.calibrate.calibrate_profile`); every other run is held out. Per
scenario:

* warned: runs with a warning of the fault's own family before divergence (fa-lowprec →
  attention-numerics, lr-high and gbs-small → router, router-collapse → router; combined:
  either); for healthy, fa-noise and router-mild runs, any mechanism warning at all — a false
  alarm;
* attribution: the cause the run's first mechanism warning names — the right one (correct:
  fa-lowprec → attention-numerics; router-* and gbs-small → router; lr-high → optimizer or
  router: the catalogue's right causes), a wrong one, or ambiguous;
* lead: divergence step − first warning step, for the mechanism families and for the symptom
  family (loss, grad norm, weight norm: the baseline foreshock must beat);
* own family before symptom: diverged runs whose own-family warning came before any symptom
  warning (or with none) — the per-run version of the lead comparison.

A second table sets, per fault scenario and family, the detectors' lead (median over diverged
runs of divergence − the family's first warning) against the envelope lead
(:mod:`foreshock.lab.envelope`: how early a series leaves the [min, max] of *all* healthy runs in
``--runs`` for good; it peeks at the future, a reference ceiling and not a detector): the
family-best median (each run's best series in the family, median over runs) and the best single
series (largest median lead).
``--trained-after TIME`` judges only the runs that started training at or after TIME: a clean
batch trained after a rule was frozen, on its own (calibration and envelope unchanged).
A run's scenario is its ``scenario`` label (the file name before ``-s<seed>`` when it has
none); ``--runs`` is read flat (``*.jsonl.gz`` directly in it, not in sub-folders). Each run is
judged by :mod:`foreshock.detectors.judge`, the judge ``foreshock tune`` uses too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from foreshock import catalogue
from foreshock.detectors.calibrate import calibrate_profile
from foreshock.detectors.config import BAND_RULES, DEFAULT_RULES, DetectorConfig
from foreshock.detectors.judge import judge, own_families
from foreshock.detectors.profiles import profile_of
from foreshock.detectors.replay import RunReport, replay_run
from foreshock.lab.envelope import Envelope, healthy_envelope, scenario_envelope
from foreshock.lab.recorded import (
    HELD_OUT_HEALTHY,
    RECORDED_DIR,
    RecordedRun,
    calibration_healthy,
    load_run,
    shipped_runs,
)
from foreshock.table import median
from foreshock.transport.records import parse_series_key

from ._table import emit_json, format_table

HEALTHY = "healthy"
SCENARIO_HEADER = [
    "scenario (held out)",
    "warned",
    "diverged",
    "attribution ok",
    "wrong",
    "ambiguous",
    "lead: mechanism",
    "lead: symptom",
    "own family before symptom",
]
ENVELOPE_HEADER = [
    "scenario (diverged)",
    "family",
    "envelope: family best",
    "best series",
    "its lead",
    "lead: detectors",
    "lead: symptom",
]


def _started(run: RecordedRun) -> float:
    """When the run started training (its ``start`` record's time; 0 if it has none)."""
    return float(run.start.get("time") or 0.0)


def _utc(text: str) -> float:
    """An ISO 8601 time (UTC unless it says otherwise) as Unix seconds."""
    when = datetime.fromisoformat(text)
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _load(directory: Path) -> tuple[dict[Path, RecordedRun], dict[Path, str]]:
    """The runs in ``directory`` (``*.jsonl.gz`` directly in it, not in sub-folders), and
    each one's scenario."""
    loaded = {path: load_run(path) for path in shipped_runs(directory)}
    return loaded, {path: run.scenario for path, run in loaded.items()}


def _judge(report: RunReport, scenario: str) -> dict:
    """The run's verdict (:func:`~foreshock.detectors.judge.judge`) as the tables' figures."""
    div = report.divergence_step
    verdict = judge(scenario, div, report.alerts)
    first = verdict.first
    return {
        "run": report.run_id,
        "divergence": div,
        "detected": verdict.detected,
        "attribution": verdict.attribution,
        "first": first and (first.family, first.module, first.step),
        "cause": verdict.cause,
        "mechanism_lead": verdict.lead(),
        "before_symptom": div is not None and verdict.own_before_symptom,
        "before_any_symptom": verdict.own_before_symptom,
        "symptom_lead": verdict.lead("symptom"),
        "family_leads": verdict.family_leads,
    }


def _without(config: DetectorConfig, metrics: list[str]) -> DetectorConfig:
    known = {rule.metric for rule in config.rules}
    if unknown := set(metrics) - known:
        raise SystemExit(f"--without: no rule reads {sorted(unknown)}; rules read {sorted(known)}")
    return replace(config, rules=tuple(r for r in config.rules if r.metric not in metrics))


def _family_by_rules(config: DetectorConfig) -> Callable[[str], str | None]:
    """Series key -> the family of the rule reading its metric (None: no rule reads it)."""

    def family_of(key: str) -> str | None:
        rule = config.rule_for(parse_series_key(key).metric)
        return None if rule is None else rule.family

    return family_of


def _envelope_figures(
    runs: list[RecordedRun], verdicts: list[dict], envelope: Envelope, config: DetectorConfig
) -> dict[str, dict]:
    """Per family, the envelope summary next to the detectors' median lead."""
    figures = scenario_envelope(runs, envelope, _family_by_rules(config))
    for family, entry in figures.items():
        leads = [v["family_leads"][family] for v in verdicts]
        leads = [lead for lead in leads if lead is not None]
        entry.update(detector_lead_median=median(leads), detector_lead_runs=len(leads))
    return figures


def _with_n(value: float | None, n: int | str) -> str:
    return f"{'-' if value is None else value} ({n})"


def _envelope_rows(scenario: str, figures: dict) -> list[list]:
    """One row per family: envelope (family best, best series) | detectors | symptoms."""
    rows = []
    for family, e in figures["envelope"].items():
        family_best = _with_n(e["family_best_median"], f"{e['runs']}/{e['diverged']}")
        best = _with_n(e["best_series_median"], e["best_series_n"] or 0)
        detector = _with_n(e["detector_lead_median"], e["detector_lead_runs"])
        symptom = figures["symptom_lead_median"]
        rows.append([scenario, family, family_best, e["best_series"], best, detector, symptom])
    return rows


def _scenario_row(scenario: str, runs: list[dict]) -> tuple[list, dict]:
    """The first table's row for one scenario's verdicts, and its figures."""
    n = len(runs)
    mech = [r["mechanism_lead"] for r in runs if r["mechanism_lead"] is not None]
    sym = [r["symptom_lead"] for r in runs if r["symptom_lead"] is not None]
    count = {
        k: sum(r["attribution"] == k for r in runs)
        for k in ("correct", "wrong", "ambiguous", "none")
    }
    detected = sum(r["detected"] for r in runs)
    diverged = sum(r["divergence"] is not None for r in runs)
    earlier = sum(r["before_symptom"] for r in runs)
    if not diverged:  # a silent fault: its own warning before any symptom, over all runs
        earlier = sum(r["before_any_symptom"] for r in runs)
    row = [
        f"{scenario} ({n})",
        f"{detected}/{n}",
        diverged,
        count["correct"],
        count["wrong"],
        count["ambiguous"],
        median(mech),
        median(sym),
        f"{earlier}/{diverged or n}" if own_families(scenario) else "-",
    ]
    figures = {
        "runs": n,
        "detected": detected,
        "attribution": count,
        "diverged": diverged,
        "own_family_before_symptom": earlier,
        "mechanism_lead_median": median(mech),
        "symptom_lead_median": median(sym),
        "verdicts": runs,
    }
    return row, figures


def split_profile(
    directory: Path, held_out: str | None = None
) -> tuple[dict[Path, RecordedRun], dict[Path, str], str, str, list[Path]]:
    """``directory``'s runs, their scenarios, the profile, the held-out healthy seeds (default:
    the profile's ``HELD_OUT_HEALTHY``) and the healthy runs that calibrate (all the others)."""
    loaded, scenario_of = _load(directory)
    if not loaded:
        raise SystemExit(f"no recorded runs in {directory}")
    profile = profile_of(next(iter(loaded.values())).labels)
    held_out = held_out or HELD_OUT_HEALTHY.get(profile, "")
    calibrating = {id(r) for r in calibration_healthy(list(loaded.values()), held_out)}
    calib = [p for p, run in loaded.items() if id(run) in calibrating]
    return loaded, scenario_of, profile, held_out, calib


def judge_profile(
    directory: Path,
    held_out: str | None = None,
    base: DetectorConfig | None = None,
    band_margin: float = 0.5,
    band_floor: float | None = None,
    trained_after: float | None = None,
) -> dict:
    """Calibrate on ``directory``'s healthy runs outside ``held_out`` (default: the profile's
    ``HELD_OUT_HEALTHY``), replay every other run (only those started at or after
    ``trained_after``, Unix seconds, when given), and judge it: the figures behind both tables
    (``rows``, ``envelope_rows``, ``figures``) with the profile, config and split."""
    loaded, scenario_of, profile, held_out, calib = split_profile(directory, held_out)
    held = [
        p
        for p in loaded
        if p not in calib and (trained_after is None or _started(loaded[p]) >= trained_after)
    ]
    base = base or DetectorConfig(BAND_RULES)
    config = calibrate_profile(
        [loaded[p] for p in calib], base, replay_run, band_margin, band_floor
    )
    verdicts: dict[str, list[dict]] = {}
    for path in held:
        report = replay_run(loaded[path], config)
        verdicts.setdefault(scenario_of[path], []).append(_judge(report, scenario_of[path]))
    envelope = healthy_envelope(loaded[p] for p in loaded if scenario_of[p] == HEALTHY)
    rows, figures, envelope_rows = [], {}, []
    for scenario, runs in sorted(verdicts.items()):
        row, figures[scenario] = _scenario_row(scenario, runs)
        rows.append(row)
        if scenario != HEALTHY:
            fault_runs = [loaded[p] for p in held if scenario_of[p] == scenario]
            figures[scenario]["envelope"] = _envelope_figures(fault_runs, runs, envelope, base)
            if diverged := figures[scenario]["diverged"]:
                envelope_rows += _envelope_rows(f"{scenario} ({diverged})", figures[scenario])
    return {
        "profile": profile,
        "config": config,
        "held_out": held_out,
        "calibration_runs": len(calib),
        "healthy_runs": sum(s == HEALTHY for s in scenario_of.values()),
        "rows": rows,
        "envelope_rows": envelope_rows,
        "figures": figures,
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the profile, calibration runs and config;
    per quiet scenario (healthy, fa-noise, router-mild) its false warnings; per fault scenario
    the runs its own family warned before divergence, the attribution (right, wrong,
    ambiguous), the median leads (mechanism vs symptom) and own family before symptom, then each
    mechanism family's envelope lead beside the detectors' (:func:`_envelope_leads`)."""
    rows = [
        (
            "profile; calibration runs; config",
            f"{result.get('profile', 'gpt-moe')}; "
            f"{result['calibration_runs']} healthy; `{result['config_version']}`",
        )
    ]
    for scenario, s in result["scenarios"].items():
        if scenario in ("healthy", "fa-noise", "router-mild"):
            rows.append(
                (
                    f"false warnings on held-out {scenario} runs",
                    f"{s['detected']} of {s['runs']} runs",
                )
            )
            continue
        a = s["attribution"]
        symptom = s["symptom_lead_median"] if s["symptom_lead_median"] is not None else "–"
        lead = (
            f"; median lead {s['mechanism_lead_median']} steps (mechanism) vs "
            f"{symptom} (symptom: loss, grad norm, weight norm)"
            if s["mechanism_lead_median"] is not None
            else ""
        )
        earlier = (
            f"; own family before any symptom warning in "
            f"{s['own_family_before_symptom']}/{s['diverged']} diverged runs"
            if s.get("diverged")
            else ""
        )
        rows.append(
            (
                f"{scenario}: warned by its own family before divergence",
                f"{s['detected']}/{s['runs']}; attribution right {a['correct']}, wrong "
                f"{a['wrong']}, ambiguous {a['ambiguous']}{lead}{earlier}",
            )
        )
        rows += _envelope_leads(scenario, s.get("envelope", {}))
    return rows


def _envelope_leads(scenario: str, envelope: dict) -> list[tuple[str, str]]:
    """The own family's envelope lead (a ceiling) beside the detectors' lead."""
    rows = []
    for family, e in envelope.items():
        if family == "symptom" or not e.get("family_best_median") or not e.get("diverged"):
            continue
        detectors = e.get("detector_lead_median")
        share = f" ({detectors / e['family_best_median']:.0%})" if detectors else ""
        rows.append(
            (
                f"{scenario}: {family} envelope lead (family best, median)",
                f"{e['family_best_median']} steps; detectors {detectors}{share}",
            )
        )
    return rows


# The docs' detection table (docs/detectors.md) reads these stored results, one profile each.
DETECTION_RESULTS = ("detection_table", "detection_table_capacity", "detection_table_mixtral")
RESULTS = Path(__file__).parent / "results"  # where benchmarks.readme stores each result


def detection_summary() -> str:
    """The docs' detection table (``docs/detectors.md``): one row per (profile, held-out
    scenario), from the stored detection_table results."""
    header = (
        "| profile | scenario (held out) | warned | cause right / wrong / ambiguous "
        "| lead: mechanism | lead: symptom | own family before symptom "
        "| envelope lead (best mechanism family) |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for name in DETECTION_RESULTS:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())["result"]
        for scenario, s in r["scenarios"].items():
            lines.append(_detection_row(r.get("profile", "gpt-moe"), scenario, s))
    return "\n".join(lines)


def _detection_row(profile: str, scenario: str, s: dict) -> str:
    """One row of :func:`detection_summary`: a quiet scenario's runs warned are false ones."""
    a, dash = s["attribution"], "–"
    quiet = catalogue.scenario(scenario).quiet
    warned = f"{s['detected']}/{s['runs']}" + (" false" if quiet else "")
    cause = dash if quiet else f"{a['correct']} / {a['wrong']} / {a['ambiguous']}"
    own = dash if quiet else f"{s['own_family_before_symptom']}/{s['diverged'] or s['runs']}"
    envelope = [
        e
        for f, e in (s.get("envelope") or {}).items()
        if f != "symptom" and e.get("family_best_median") is not None
    ]
    best = max(envelope, key=lambda e: e["family_best_median"], default=None)
    env = dash if best is None or quiet else f"{best['family_best_median']}"
    lead = s["mechanism_lead_median"] if s["mechanism_lead_median"] is not None else dash
    sym = s["symptom_lead_median"] if s["symptom_lead_median"] is not None else dash
    return (
        f"| {profile} | {scenario} ({s['runs']}, {s['diverged']} diverged) | {warned} "
        f"| {cause} | {lead} | {sym} | {own} | {env} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RECORDED_DIR)
    parser.add_argument(
        "--held-out",
        help="healthy seeds held out (FIRST-LAST[,FIRST-LAST...]); the other healthy calibrate "
        "(default: the profile's, foreshock.lab.recorded.HELD_OUT_HEALTHY)",
    )
    parser.add_argument("--quick", action="store_true", help="same runs (replay is fast)")
    parser.add_argument(
        "--trained-after",
        metavar="ISO_TIME",
        help="judge only the runs that started training at or after this time (UTC), e.g. a "
        "clean batch trained after a rule was frozen; calibration and envelope are unchanged",
    )
    parser.add_argument("--save-config", type=Path, help="write the calibrated config here")
    parser.add_argument(
        "--run-relative",
        action="store_true",
        help="the run-relative rules only (no healthy bands): what an uncalibrated profile gets",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="METRIC",
        help="drop a metric's rule, e.g. max_logit: what a model that can't report it gets",
    )
    args = parser.parse_args()
    base = _without(
        DetectorConfig(DEFAULT_RULES if args.run_relative else BAND_RULES), args.without
    )
    after = _utc(args.trained_after) if args.trained_after else None
    judged = judge_profile(args.runs, args.held_out, base, trained_after=after)
    config, figures = judged["config"], judged["figures"]
    if args.save_config:
        config.save(args.save_config)
    dropped = f"; without {', '.join(args.without)}" if args.without else ""
    print(
        f"profile {judged['profile']}: calibrated on {judged['calibration_runs']} healthy runs "
        f"(held out: seeds {judged['held_out']}), "
        f"margin {config.calibration['margin']}; "
        f"false-alarm bound per run: {config.false_alarm}; config {config.version}"
        f"{dropped}"
    )
    print(format_table(SCENARIO_HEADER, judged["rows"]))
    print(
        f"\nenvelope lead (a ceiling: [min, max] of all {judged['healthy_runs']} healthy runs, "
        "exit held to divergence); median over diverged runs (n)"
    )
    envelope_rows = judged["envelope_rows"]
    print(
        format_table(ENVELOPE_HEADER, envelope_rows) if envelope_rows else "(no fault run diverged)"
    )
    if calm := [s for s, f in figures.items() if s != HEALTHY and not f["diverged"]]:
        print(f"no diverged run, no lead: {', '.join(calm)}")
    emit_json(
        {
            "profile": judged["profile"],
            "config_version": config.version,
            "calibration_runs": judged["calibration_runs"],
            "without": args.without,
            "false_alarm_bound": config.false_alarm,
            **({"trained_after": args.trained_after} if args.trained_after else {}),
            "scenarios": figures,
        }
    )


if __name__ == "__main__":
    main()
