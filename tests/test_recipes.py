"""Recipes: the lab trains them, the records carry the schedule, the detectors wait for its
peak, and a profile judges only runs of the recipes it was calibrated on."""

from __future__ import annotations

import itertools
import math

import pytest

from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.profiles import ZERO_SHOT, ProfileConfigs, shipped_profiles
from foreshock.recipe import SCHEDULES, Recipe, recipe_mismatch

CONSTANT = Recipe("constant", 1e-3, 0, 1600)
SIGNATURE = {"model_type": "toy", "layers": 1, "hidden": 8, "dispatch": "dropless"}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_warms_up_to_its_peak_and_ends_at_its_final_fraction(schedule):
    recipe = Recipe(schedule, lr=2e-3, warmup=100, horizon=1000, final=0.1)
    rates = [recipe.lr_at(t) for t in range(1001)]
    assert all(b > a for a, b in itertools.pairwise(rates[:100]))  # warming up
    assert math.isclose(rates[100], 2e-3)
    assert max(rates) == pytest.approx(2e-3)
    end = 2e-3 if schedule == "constant" else 2e-4
    assert rates[-1] == pytest.approx(end)
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(rates[100:]))


@pytest.mark.parametrize(
    "bad",
    [
        {"schedule": "step"},
        {"lr": 0.0},
        {"lr": math.nan},
        {"warmup": 1600},
        {"final": 1.5},
        {"decay_start": 100},  # not wsd
        {"schedule": "wsd", "decay_start": 5000},
    ],
)
def test_a_recipe_that_cannot_be_trained_is_refused_by_name(bad):
    with pytest.raises(ValueError):
        Recipe(**bad)


def test_recipes_round_trip_through_labels_and_junk_is_no_recipe():
    recipe = Recipe("wsd", 5e-4, 50, 4000, decay_start=3000)
    assert Recipe.from_labels(recipe.to_labels()) == recipe
    assert Recipe.from_labels({"schedule": "nonsense"}) is None
    assert Recipe.from_labels("cosine") is None


@pytest.mark.parametrize(
    ("run", "fits"),
    [
        (CONSTANT, True),
        (Recipe("constant", 1.05e-3, 0, 1000), True),  # within 10 %, a shorter horizon
        (Recipe("constant", 5e-4, 0, 1600), False),  # 0.5x
        (Recipe("constant", 2e-3, 0, 1600), False),  # 2x
        (Recipe("constant", 1e-3, 0, 10_000), False),  # past the calibrated horizon
        (Recipe("cosine", 1e-3, 100, 1600), False),
    ],
)
def test_a_profile_recipe_fits_only_its_own_kind_peak_and_horizon(run, fits):
    assert (recipe_mismatch(run, [CONSTANT]) is None) is fits


def _configs() -> tuple[ProfileConfigs, DetectorConfig, DetectorConfig]:
    own, zero = DetectorConfig(thresholds={"loss": 1.0}), DetectorConfig(thresholds={"loss": 2.0})
    configs = ProfileConfigs(
        {"toy": own, ZERO_SHOT: zero},
        {"toy": [SIGNATURE]},
        recipes={"toy": [CONSTANT.to_labels()]},
    )
    return configs, own, zero


def _start(recipe: Recipe | None) -> dict:
    labels = {} if recipe is None else {"recipe": recipe.to_labels()}
    return {"kind": "start", "labels": labels, "monitor": {"signature": SIGNATURE}}


def test_a_run_of_another_recipe_falls_back_and_is_told_why():
    configs, own, zero = _configs()
    assert configs.choose(_start(CONSTANT)).config is own
    choice = configs.choose(_start(Recipe("cosine", 1e-3, 100, 2000)))
    assert choice.config is zero
    assert "toy fits the model, but cosine lr 0.001, warm-up 100" in choice.reason


def test_a_run_that_declares_no_recipe_is_checked_by_its_learning_rates():
    configs, own, zero = _configs()
    detector = RunDetector("r", configs)
    detector.update(_start(None))
    assert detector.config is own
    detector.update({"kind": "metrics", "step": 0, "values": {"loss": 3.0, "lr": 1e-3}})
    assert detector.config is own  # the profile's recipe so far
    detector.update({"kind": "metrics", "step": 25, "values": {"loss": 3.0, "lr": 2e-5}})
    assert detector.config is zero  # a warm-up: not the recipe the profile was made on
    assert "learning rate 2e-05 at step 25" in detector.profile.reason


def test_a_learning_rate_fault_after_the_warm_up_window_keeps_the_runs_profile():
    configs, own, _ = _configs()
    detector = RunDetector("r", configs)
    detector.update(_start(CONSTANT))
    for step, lr in [(0, 1e-3), (300, 1e-3), (500, 1e-2), (1000, 1e-1)]:  # a ramp from 400
        detector.update({"kind": "metrics", "step": step, "values": {"loss": 3.0, "lr": lr}})
    assert detector.config is own


def _series_run(lrs: list[float], values: list[float]) -> RunDetector:
    """A run of one level-ruled router series, fed with its learning rates."""
    config = DetectorConfig(thresholds={"router.load_entropy": 0.2}, warmup_records=3)
    detector = RunDetector("r", config)
    for i, (lr, x) in enumerate(zip(lrs, values, strict=True)):
        step = 25 * i
        record = {"lr": lr, "router.load_entropy@h.0.mlp.gate": x}
        detector.update({"kind": "metrics", "step": step, "values": record})
    return detector


def test_the_warm_up_window_waits_for_the_schedules_peak():
    # load entropy high while the learning rate warms up (to step 300), settled lower after
    warm = [1e-4 * (i + 1) for i in range(12)] + [1.2e-3] * 12
    entropy = [2.0] * 12 + [1.5] * 12
    assert _series_run(warm, entropy).alerts == []  # measured from the peak: no slide
    blind = _series_run([1.2e-3] * 24, entropy)  # the same values without a schedule
    assert [a.family for a in blind.alerts] == ["router"]


def test_the_shipped_profiles_say_which_recipe_they_were_calibrated_on():
    profiles = shipped_profiles()
    for name in ("gpt-moe", "gpt-moe+capacity-1", "mixtral"):
        assert profiles.recipes_of(name) == (CONSTANT,), name


def test_a_users_profile_records_the_recipes_of_its_calibration_runs(tmp_path):
    from types import SimpleNamespace

    from foreshock.detectors.make_profile import recipes_of
    from foreshock.detectors.profiles import load_profiles, save_profile

    cosine = Recipe("cosine", 5e-4, 100, 2000)
    runs = [SimpleNamespace(start={"labels": {"recipe": cosine.to_labels()}}, records=[])] * 3
    assert recipes_of(runs) == [cosine.to_labels()]
    unknown = SimpleNamespace(start={}, records=[{"step": 0, "values": {"lr": 1e-4}},
                                                 {"step": 9, "values": {"lr": 2e-4}}])  # fmt: skip
    assert recipes_of([*runs, unknown]) == []  # one run's recipe unknown: claim none
    save_profile(tmp_path, "mine", DetectorConfig(), [SIGNATURE], recipes_of(runs))
    assert load_profiles(tmp_path).recipes_of("mine") == (cosine,)
    save_profile(tmp_path, "mine", DetectorConfig(), [SIGNATURE], [])  # made again: none
    assert load_profiles(tmp_path).recipes_of("mine") == ()
