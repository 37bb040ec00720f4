"""Per-profile calibration: each architecture and dispatch gets the thresholds and healthy bands
of its own healthy runs, and a run is judged by the config its start labels call for."""

from __future__ import annotations

import pytest

from foreshock.detectors.calibrate import calibrate_profile
from foreshock.detectors.commands import default_config
from foreshock.detectors.config import BAND_RULES, DetectorConfig
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.profiles import ProfileConfigs, profile_of
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import (
    HELD_OUT_HEALTHY,
    RECORDED_DIR,
    load_run,
    seed_spans,
    shipped_runs,
)

FOLDERS = {
    "gpt-moe": RECORDED_DIR,
    "mixtral": RECORDED_DIR / "mixtral",
    "gpt-moe+capacity-1": RECORDED_DIR / "gpt-moe+capacity-1",
}


def _runs(profile: str, scenario: str) -> list:
    runs = [load_run(p) for p in shipped_runs(FOLDERS[profile])]
    return [r for r in runs if r.labels.get("scenario") == scenario]


def _calibration_runs(profile: str) -> list:
    held = seed_spans(HELD_OUT_HEALTHY[profile])
    return [r for r in _runs(profile, "healthy") if r.labels["seed"] not in held]


@pytest.mark.parametrize("profile", sorted(FOLDERS))
def test_every_shipped_run_is_in_its_profiles_folder(profile):
    runs = [load_run(p) for p in shipped_runs(FOLDERS[profile])]
    assert runs and {profile_of(r.labels) for r in runs} == {profile}


@pytest.mark.parametrize("profile", sorted(FOLDERS))
def test_shipped_config_of_each_profile_is_its_calibration(profile):
    calibrated = calibrate_profile(
        _calibration_runs(profile), DetectorConfig(BAND_RULES), replay_run
    )
    assert default_config().configs[profile].version == calibrated.version
    assert calibrated.calibration["bands"]["runs"] == len(_calibration_runs(profile))


@pytest.mark.parametrize("profile", sorted(FOLDERS))
def test_calibration_runs_raise_no_warning_under_their_profile(profile):
    configs = default_config()
    for run in _calibration_runs(profile):
        assert replay_run(run, configs).alerts == [], run.run_id


def test_a_run_is_judged_by_the_config_its_start_labels_call_for():
    a, b = DetectorConfig(thresholds={"loss": 1.0}), DetectorConfig(thresholds={"loss": 2.0})
    configs = ProfileConfigs({"gpt-moe": a, "mixtral": b})
    detector = RunDetector("r", configs)
    assert detector.config is a
    detector.update({"kind": "start", "labels": {"arch": "mixtral", "dispatch": "dropless"}})
    assert detector.config is b
    assert configs.for_labels({"arch": "unknown-arch"}) is a  # no calibration: the default's
    with pytest.raises(ValueError, match="default profile"):
        ProfileConfigs({"mixtral": b})


def test_docs_detection_table_is_the_stored_results():
    """The docs' detection figures are generated from benchmarks/results, never typed."""
    from benchmarks.readme import DETECTION_MARKERS, DETECTION_PAGE, between, detection_summary

    section = between(DETECTION_PAGE.read_text(), DETECTION_MARKERS)
    assert section == detection_summary().strip()
    assert (
        "| mixtral | fa-lowprec" in section and "| gpt-moe+capacity-1 | router-collapse" in section
    )


def _first_mechanism(report):
    div = report.divergence_step
    return next(
        (a for a in report.alerts if a.family != "symptom" and (div is None or a.step < div)), None
    )


@pytest.mark.parametrize("profile", ["mixtral", "gpt-moe+capacity-1"])
def test_a_router_collapse_is_named_by_the_router_before_any_symptom(profile):
    """The silent fault: the loss never diverges, the router family names it first."""
    configs = default_config()
    for run in _runs(profile, "router-collapse"):
        report = replay_run(run, configs)
        first, symptom = _first_mechanism(report), report.first("symptom")
        assert first is not None and (first.family, first.role) == ("router", "cause"), run.run_id
        assert symptom is None or first.step < symptom.step, run.run_id
        assert first.config_version == configs.configs[profile].version


@pytest.mark.parametrize("profile", ["mixtral", "gpt-moe+capacity-1"])
def test_the_mild_control_and_held_out_healthy_runs_stay_quiet(profile):
    held = seed_spans(HELD_OUT_HEALTHY[profile])
    runs = _runs(profile, "router-mild") + [
        r for r in _runs(profile, "healthy") if r.labels["seed"] in held
    ]
    assert runs
    for run in runs:
        assert _first_mechanism(replay_run(run, default_config())) is None, run.run_id


def test_on_mixtral_numerics_name_attention_and_a_learning_rate_ramp_never_does():
    configs = default_config()
    for run in _runs("mixtral", "fa-lowprec"):
        first = _first_mechanism(replay_run(run, configs))
        assert (first.family, first.role) == ("attention-numerics", "cause"), run.run_id
    for run in _runs("mixtral", "lr-high"):
        first = _first_mechanism(replay_run(run, configs))
        assert first.role == "optimizer", run.run_id
