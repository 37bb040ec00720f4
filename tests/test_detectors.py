"""Detectors on real recorded lab runs: calibration, attribution, lead time, determinism."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest

from foreshock.detectors.bands import BAND_FLOOR, INFLATION_FLOOR
from foreshock.detectors.calibrate import (
    calibrate,
    calibrate_profile,
    leave_one_out_margin,
    uncalibrated,
)
from foreshock.detectors.config import BAND_RULES, DetectorConfig, SeriesRule
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.replay import replay, replay_run
from foreshock.lab.recorded import HELD_OUT_HEALTHY, load_run, seed_spans, shipped_runs


def _runs(prefix: str) -> list:
    return [p for p in shipped_runs() if p.name.startswith(prefix + "-s")]


def _seed(path) -> int:
    return int(path.name.split("-s")[-1].split(".")[0])


def _calibration_runs() -> list:
    """Healthy seeds 0-9, 15-24 and 40-59: what the shipped config is calibrated on; the rest
    (HELD_OUT_HEALTHY) are held out for benchmarks.detection_table."""
    held_out = seed_spans(HELD_OUT_HEALTHY["gpt-moe"])
    return [p for p in _runs("healthy") if _seed(p) not in held_out]


@pytest.fixture(scope="module")
def calibrated() -> DetectorConfig:
    runs = [load_run(p) for p in _calibration_runs()]
    return calibrate_profile(runs, DetectorConfig(BAND_RULES), replay_run)


@pytest.mark.slow
def test_shipped_config_is_this_calibration(calibrated):
    from foreshock.operate.detect_commands import default_config

    assert default_config().configs["gpt-moe"].version == calibrated.version


def test_calibration_puts_every_healthy_maximum_under_its_threshold(calibrated):
    assert set(calibrated.thresholds) == {r.metric for r in calibrated.rules}
    run_relative = {r.metric for r in calibrated.rules if r.kind != "band"}
    for report in replay(_calibration_runs(), uncalibrated(calibrated)):
        for metric, peak in report.peaks.items():
            assert peak < calibrated.thresholds[metric] or metric not in run_relative
    n = len(_calibration_runs())
    assert calibrated.false_alarm["router"] == pytest.approx(4 / (n + 1), abs=1e-4)


def test_leave_one_out_margin_keeps_every_left_out_run_quiet():
    healthy = replay(_calibration_runs(), uncalibrated(DetectorConfig()))
    margins = leave_one_out_margin(healthy, DetectorConfig())
    for i, left_out in enumerate(healthy):
        others = calibrate([*healthy[:i], *healthy[i + 1 :]], DetectorConfig(), margin=margins)
        for metric, h in others.thresholds.items():
            assert left_out.peaks.get(metric, 0.0) <= h, (left_out.run_id, metric)


def test_calibration_runs_raise_no_warning(calibrated):
    for report in replay(_calibration_runs(), calibrated):
        assert report.alerts == []


def _first_mechanism(report):
    before = report.divergence_step
    return next(a for a in report.alerts if a.family != "symptom" and a.step < before)


def test_numerics_fault_warns_attention_first_and_names_it_the_cause(calibrated):
    diverged = 0
    for report in replay(_runs("fa-lowprec"), calibrated):
        if report.divergence_step is None:  # the fault never took hold (s19, s27)
            assert not [a for a in report.alerts if a.family == "router"], report.run_id
            continue
        diverged += 1
        first = _first_mechanism(report)
        assert (first.family, first.role) == ("attention-numerics", "cause"), report.run_id
        assert first.lead_time == report.divergence_step - first.step > 0
        assert first.false_alarm_rate == calibrated.false_alarm["attention-numerics"]
        assert first.config_version == calibrated.version
        assert first.evidence["recent"] and first.module.endswith(".attn")
    assert diverged >= 19


@pytest.mark.slow
def test_learning_rate_fault_names_the_optimizer_because_the_weights_moved_first(calibrated):
    """A learning-rate ramp inflates every weight (its weight norm leaves the healthy band
    first), then both mechanism families: the cause named is the optimizer, never numerics."""
    for report in replay(_runs("lr-high"), calibrated):
        first = _first_mechanism(report)
        assert first.role == "optimizer", report.run_id
        assert first.evidence["cause"] == "optimizer" and "learning-rate" in first.evidence["check"]


def _two_families(drop_attention: int, drop_router: int) -> list[dict]:
    """A synthetic run: both mechanisms wobble, then each collapses from its own step."""
    records = []
    for i, step in enumerate(range(0, 1200, 25)):
        wobble = 0.01 * ((i * 7) % 5 - 2)
        attention = (
            3.0 + wobble - (0.2 * (step - drop_attention) / 25 if step >= drop_attention else 0)
        )
        router = 0.9 + wobble - (0.2 * (step - drop_router) / 25 if step >= drop_router else 0)
        records.append(
            {
                "kind": "metrics",
                "step": step,
                "values": {
                    "attn.dwq.entropy@h.0.attn": attention,
                    "router.epsilon@h.0.mlp.gate": router,
                },
            }
        )
    return records


@pytest.mark.parametrize(
    ("drop_attention", "drop_router", "roles"),
    [
        (600, 900, {"attention-numerics": "cause", "router": "secondary"}),
        (900, 600, {"attention-numerics": "secondary", "router": "cause"}),
        (600, 600, {"attention-numerics": "ambiguous", "router": "ambiguous"}),
    ],
)
def test_the_family_that_moves_first_is_the_cause_and_a_tie_is_ambiguous(
    drop_attention, drop_router, roles
):
    config = DetectorConfig(thresholds={"attn.dwq.entropy": 4.0, "router.epsilon": 4.0})
    detector = RunDetector("synthetic", config)
    for record in _two_families(drop_attention, drop_router):
        detector.update(record)
    assert {a.family: a.role for a in detector.alerts} == roles


def test_growing_attention_logits_warn_attention_numerics_upward():
    """The FA fault's feedback loop grows the logits: max_logit feeds its family, upward."""
    config = DetectorConfig(thresholds={"max_logit": 4.0})
    detector = RunDetector("logits", config)
    for i, step in enumerate(range(0, 1000, 25)):
        wobble = 0.1 * ((i * 7) % 5 - 2)
        grown = 1.5 ** ((step - 500) / 25) if step >= 500 else 0.0
        detector.update(
            {
                "kind": "metrics",
                "step": step,
                "values": {"max_logit@h.1.attn": 10.0 + wobble + grown},
            }
        )
    (alert,) = detector.alerts
    assert (alert.family, alert.module, alert.direction) == ("attention-numerics", "h.1.attn", "up")
    assert alert.evidence["detector"] == "cusum"
    assert 500 < alert.step <= 650


def _sliding_router(final_ratio: float) -> list[dict]:
    """A router token entropy that slides steadily from 0.9 to final_ratio × 0.9 after step 300."""
    records = []
    for i, step in enumerate(range(0, 1600, 25)):
        wobble = 0.005 * ((i * 7) % 5 - 2)
        slide = min(1.0, max(0.0, (step - 300) / 1000)) * (1 - final_ratio)
        records.append(
            {
                "kind": "metrics",
                "step": step,
                "values": {"router.token_entropy_norm@h.0.mlp.gate": 0.9 * (1 - slide) + wobble},
            }
        )
    return records


@pytest.mark.parametrize(("final_ratio", "fires"), [(0.3, True), (0.75, False)])
def test_a_router_entropy_sliding_too_far_warns_as_a_level(final_ratio, fires):
    """Level rules judge the log ratio to the run's own warm-up: a slide to 30 % fires once it
    passes ln(1/0.6) below; a healthy-like slide to 75 % never does, however long it lasts."""
    config = DetectorConfig(thresholds={"router.token_entropy_norm": math.log(1 / 0.6)})
    detector = RunDetector("slide", config)
    for record in _sliding_router(final_ratio):
        detector.update(record)
    assert bool(detector.alerts) is fires
    if fires:
        (alert,) = detector.alerts
        assert (alert.family, alert.direction, alert.role) == ("router", "down", "cause")
        assert alert.evidence["detector"] == "level"
        ratio = math.exp(-alert.statistic)
        assert ratio < 0.6 and alert.evidence["warmup_mean"] == pytest.approx(0.9, abs=0.01)
        assert alert.step == 900  # 1 − 0.7·(step − 300)/1000 < 0.6 from 875, confirmed at 900
        assert detector.divergence_step is None  # records without a loss say nothing of it


def test_a_null_loss_is_a_divergence_and_a_missing_one_is_not():
    detector = RunDetector("losses", DetectorConfig())
    for step in range(0, 300, 25):
        detector.update({"kind": "metrics", "step": step, "values": {"grad_norm": 1.0}})
    assert detector.divergence_step is None
    detector.update({"kind": "metrics", "step": 300, "values": {"loss": None}})
    assert detector.divergence_step == 300


def test_rule_kind_round_trips_and_is_checked(tmp_path):
    config = DetectorConfig(thresholds={"router.load_entropy": 0.2})
    config.save(tmp_path / "c.json")
    again = DetectorConfig.load(tmp_path / "c.json")
    assert again.rule_for("router.load_entropy").kind == "level"
    assert again.rule_for("max_logit").kind == "cusum"
    assert again.version == config.version
    with pytest.raises(ValueError, match="kind"):
        SeriesRule("loss", "symptom", "up", kind="ewma")


def _one_spike(confirm: int | None) -> list:
    """Warnings of a band rule on max_logit that sees one record beyond h, then none."""
    rule = SeriesRule("max_logit", "attention-numerics", "up", "band", confirm=confirm)
    config = DetectorConfig(
        rules=(rule,),
        warmup_start=0,
        thresholds={"max_logit": 1.0},
        bands={"max_logit@h.0.attn": {"steps": [0], "lo": [0.0], "hi": [1.0]}},
    )
    detector = RunDetector("spike", config)
    for step, x in [(0, 0.5), (25, 0.5), (50, 3.0), (75, 0.5), (100, 0.5)]:
        detector.update({"kind": "metrics", "step": step, "values": {"max_logit@h.0.attn": x}})
    return detector.alerts


def test_a_rule_confirms_on_its_own_count_of_records(tmp_path):
    """A rule's own ``confirm`` overrides the config's (2): one record 2 widths beyond the band
    warns a one-record rule and not a two-record one."""
    assert [a.step for a in _one_spike(confirm=1)] == [50]
    assert _one_spike(confirm=None) == []
    assert {r.metric for r in BAND_RULES if r.confirm == 1} == {"max_logit"}
    assert all(r.confirm is None for r in BAND_RULES if r.metric != "max_logit")
    config = DetectorConfig(BAND_RULES)
    config.save(tmp_path / "c.json")
    assert DetectorConfig.load(tmp_path / "c.json").rule_for("max_logit").confirm == 1
    with pytest.raises(ValueError, match="confirm"):
        SeriesRule("loss", "symptom", "up", confirm=0)


def test_the_optimizer_test_is_the_weights_excursion_without_the_floor(calibrated):
    """The weight norm's band names a cause and raises no warning: its threshold is the
    calibrated excursion with the margin, not floored at the warning rules' one width."""
    bands = calibrated.calibration["bands"]
    expected = max(INFLATION_FLOOR, (1 + bands["margin"]) * bands["peaks"]["weight_norm"])
    assert calibrated.inflation_h == pytest.approx(expected, abs=1e-3)
    assert calibrated.inflation_h < BAND_FLOOR


def test_ids_are_deterministic_and_one_warning_is_open_per_module(calibrated):
    path = _runs("fa-lowprec")[0]
    first, again = replay([path, path], calibrated)
    assert [a.id for a in first.alerts] == [a.id for a in again.alerts]
    opened = [e for e in first.events if e.event == "opened"]
    cleared = [e for e in first.events if e.event == "cleared"]
    for key in {(e.family, e.module) for e in opened}:
        sequence = sorted(
            [(e.step, "o") for e in opened if (e.family, e.module) == key]
            + [(e.cleared_step, "c") for e in cleared if (e.family, e.module) == key]
        )
        kinds = [k for _, k in sequence]
        assert all(a != b for a, b in itertools.pairwise(kinds)), key


def test_no_threshold_means_no_warning_only_peaks():
    run = load_run(_runs("fa-lowprec")[0])
    detector = RunDetector("r", uncalibrated(DetectorConfig()))
    events = [e for record in run.records for e in detector.update(record)]
    events += detector.update({"kind": "end", "status": "diverged"})
    assert events == [] and detector.alerts == []  # nothing opened, so nothing to update or clear
    assert detector.divergence_step is not None  # the run did diverge: no warning despite that
    assert detector.peaks and all(math.isfinite(v) for v in detector.peaks.values())


def test_detect_replay_cli_prints_json_per_run(tmp_path, calibrated):
    config = tmp_path / "config.json"
    calibrated.save(config)
    paths = [str(_runs("fa-lowprec")[0]), str(_runs("healthy")[0])]
    command = [
        sys.executable,
        "-m",
        "foreshock.app.cli",
        "detect",
        "--json",
        "--detector-config",
        str(config),
        "--replay",
        *paths,
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["scenario"] for line in lines] == ["fa-lowprec", "healthy"]
    assert lines[0]["warnings"] and lines[1]["warnings"] == []
    assert lines[0]["config_version"] == calibrated.version
