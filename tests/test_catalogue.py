"""One catalogue of series, families and scenarios; one divergence rule for lab and detectors."""

from __future__ import annotations

import math
import random

import pytest

from foreshock import catalogue
from foreshock.detectors.config import BAND_RULES, DEFAULT_RULES
from foreshock.detectors.divergence import DivergenceRule, LossDivergence, divergence_step
from foreshock.lab.scenarios import SCENARIOS


def test_every_rule_reads_a_catalogue_series_with_its_family_and_direction():
    for rule in (*DEFAULT_RULES, *BAND_RULES):
        entry = catalogue.series(rule.metric)
        assert (rule.family, rule.direction) == (entry.family, entry.direction)
    assert {r.metric for r in BAND_RULES} == {s.metric for s in catalogue.SERIES}


def test_the_lab_runs_exactly_the_catalogue_scenarios():
    faults = pytest.importorskip("foreshock.lab.faults")  # torch
    assert set(faults.DEFAULTS) == set(SCENARIOS)
    for s in catalogue.SCENARIOS:
        assert set(s.own) <= set(catalogue.MECHANISMS)
        assert s.quiet == (not s.right_causes)


def test_unknown_names_are_refused_not_guessed():
    with pytest.raises(KeyError):
        catalogue.series("no.such.metric")
    with pytest.raises(KeyError):
        catalogue.scenario("no-such-scenario")
    assert catalogue.family_of("attn.new_signal") == "attention-numerics"


def test_a_nan_loss_diverges_at_its_step_under_both_the_lab_and_the_detectors():
    """The two used to disagree: the detectors ignored a NaN before their warm-up."""
    losses = [2.0] * 50 + [math.nan] + [2.0] * 100
    assert divergence_step(losses) == 50
    online = LossDivergence()
    for step in range(0, 151, 25):
        online.update(step, losses[step] if math.isfinite(losses[step]) else None)
    assert online.divergence_step == 50


def test_every_step_the_online_rule_is_the_lab_rule():
    """Fed one loss per step, the detectors' rule gives the lab's divergence step."""
    rng = random.Random(7)
    rule = DivergenceRule(margin=0.3, patience=10, ema=0.2, warmup=20)
    for _ in range(200):
        losses = [2.0 + rng.gauss(0, 0.2) for _ in range(200)]
        jump = rng.randrange(200)
        losses[jump:] = [x + rng.uniform(0, 2) for x in losses[jump:]]
        online = LossDivergence.of(rule)
        for step, loss in enumerate(losses):
            online.update(step, loss)
        assert online.divergence_step == divergence_step(losses, rule)


def test_an_invalid_rule_is_refused():
    with pytest.raises(ValueError, match="invalid divergence rule"):
        LossDivergence(margin=0)
