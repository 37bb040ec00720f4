"""Per-profile calibration: each architecture and dispatch gets the thresholds and healthy bands
of its own healthy runs, and a run is judged by the config its start labels call for."""

from __future__ import annotations

import pytest

from foreshock.detectors.calibrate import calibrate_profile
from foreshock.detectors.config import BAND_RULES, DetectorConfig
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.profiles import ZERO_SHOT, ProfileConfigs
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import (
    HELD_OUT_HEALTHY,
    RECORDED_DIR,
    load_run,
    seed_spans,
    shipped_runs,
)
from foreshock.operate.detect_commands import default_config

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
def test_every_shipped_run_is_judged_by_its_folders_profile(profile):
    runs = [load_run(p) for p in shipped_runs(FOLDERS[profile])]
    configs = default_config()
    assert runs and {configs.choose(r.start).name for r in runs} == {profile}


@pytest.mark.parametrize("profile", sorted(FOLDERS))
@pytest.mark.slow
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


MIXTRAL = {
    "model_type": "mixtral",
    "layers": 2,
    "hidden": 128,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 32,
    "experts": 8,
    "top_k": 2,
    "qk_norm": False,
    "attention": "gqa",
    "dispatch": None,
}


def _start(signature: dict | None, **labels: str) -> dict:
    return {"kind": "start", "labels": labels, "monitor": {"signature": signature}}


def test_a_run_is_judged_by_the_profile_calibrated_on_its_architecture():
    a, b = DetectorConfig(thresholds={"loss": 1.0}), DetectorConfig(thresholds={"loss": 2.0})
    zero = DetectorConfig(thresholds={"loss": 3.0})
    configs = ProfileConfigs(
        {"gpt-moe": a, "mixtral": b, ZERO_SHOT: zero},
        {"mixtral": [{**MIXTRAL, "dispatch": "dropless"}]},
    )
    detector = RunDetector("r", configs)
    assert detector.config is zero  # no start record yet: nothing says which model
    detector.update(_start(MIXTRAL))  # no labels at all: the signature alone
    assert (detector.config, detector.profile.name) == (b, "mixtral")
    wider = configs.choose(_start({**MIXTRAL, "hidden": 192}, arch="mixtral"))
    assert (wider.name, wider.config) == (ZERO_SHOT, zero)  # labelled, but another size
    assert "calibrated on mixtral L2 d128" in wider.reason and "zero-shot" in wider.reason
    unknown = configs.choose(_start(None, arch="unknown-arch"))
    assert unknown.name == ZERO_SHOT and "no config here has" in unknown.reason
    assert configs.choose(_start(None, arch="mixtral")).config is b  # no signature: the label


def test_without_a_zero_shot_config_a_run_no_profile_fits_gets_no_rule():
    choice = ProfileConfigs({"mixtral": DetectorConfig()}).choose(_start(MIXTRAL))
    assert choice.name == ZERO_SHOT and "no rule" in choice.reason
    assert choice.config.thresholds == {}


def test_docs_detection_table_is_the_stored_results():
    """The docs' detection figures are generated from benchmarks/results, never typed."""
    from benchmarks.detection_table import detection_summary
    from benchmarks.readme import DETECTION_MARKERS, DETECTION_PAGE, between

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


@pytest.mark.slow
def test_on_mixtral_numerics_name_attention_and_a_learning_rate_ramp_never_does():
    configs = default_config()
    for run in _runs("mixtral", "fa-lowprec"):
        first = _first_mechanism(replay_run(run, configs))
        assert (first.family, first.role) == ("attention-numerics", "cause"), run.run_id
    for run in _runs("mixtral", "lr-high"):
        first = _first_mechanism(replay_run(run, configs))
        assert first.role == "optimizer", run.run_id


@pytest.mark.slow
def test_the_shipped_zero_shot_profile_is_its_calibration():
    """Calibrated on every group's calibration runs, margins leaving one group out."""
    from benchmarks.zero_shot import shipped_zero_shot

    config = shipped_zero_shot()
    assert default_config().configs[ZERO_SHOT].version == config.version
    assert all(rule.kind != "band" for rule in config.rules) and config.bands == {}
    assert config.inflation_h is not None and config.inflation_h >= 0.05


def test_a_users_moe_of_a_size_no_profile_knows_gets_the_zero_shot_profile(tmp_path):
    """A tiny Qwen3-MoE, no labels: its Monitor's start record names the architecture, and
    the detectors say which profile judges it and why."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from foreshock.producers import JsonlSink, Monitor

    config = transformers.Qwen3MoeConfig(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        num_hidden_layers=2,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=64,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config)
    with Monitor(model, JsonlSink(tmp_path / "r.jsonl"), run_id="r") as monitor:
        start = {"kind": "start", "labels": {}, "monitor": monitor.describe()}
    signature = start["monitor"]["signature"]
    assert signature["model_type"] == "qwen3_moe" and signature["qk_norm"] is True
    assert (signature["hidden"], signature["heads"], signature["experts"]) == (48, 4, 8)
    choice = default_config().choose(start)
    assert choice.name == ZERO_SHOT
    assert "no profile was calibrated on qwen3_moe L2 d48 h4/2 E8k2 qk-norm" in choice.reason
    detector = RunDetector("r", default_config())
    detector.update(start)
    assert detector.profile.name == ZERO_SHOT and detector.config.thresholds


def test_a_wrappers_module_names_find_the_bands_by_position():
    """The same Mixtral run with a wrapper's prefix on every module (as PEFT's
    ``base_model.model.``) is judged by the same bands and warns at the same steps."""
    run = load_run(FOLDERS["mixtral"] / "mixtral-fa-lowprec-s0.jsonl.gz")

    def prefixed(key: str) -> str:
        return key.replace("@model.", "@base_model.model.model.")

    wrapped = type(run)(
        run.path,
        run.start,
        [{**r, "values": {prefixed(k): v for k, v in r["values"].items()}} for r in run.records],
        run.end,
    )
    want = replay_run(run, default_config())
    got = replay_run(wrapped, default_config())
    assert want.alerts and got.profile == "mixtral"
    assert [(a.family, a.step) for a in got.alerts] == [(a.family, a.step) for a in want.alerts]
    assert "no healthy band" not in " ".join(got.unruled.values())
