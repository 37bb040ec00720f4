"""Where a run's learning-rate schedule stands: the detectors' warm-up waits for its peak.

Every run-relative rule measures a series against the run's own early level (its warm-up
window, :mod:`~foreshock.detectors.standardize`). Under a learning-rate warm-up that window
falls before the routers have started to specialise: at the peak they sharpen, their load
and token entropies fall, and a level rule calls it a collapse. Measured on a transformers
Mixtral (3 layers, hidden 160, 6 experts) with 200 warm-up steps then cosine decay: 3 of 3
healthy runs got a router *cause* warning at steps 275–325, just after the warm-up
(``docs/recipes.md``). So no series is read until the schedule has reached its peak.

The schedule is the ``lr`` series of the records (:mod:`foreshock.producers.learning_rates`).
The peak is the last record before the first whose ``lr`` is not above its predecessor's:
the warm-up is over (latched: a later rise — a learning-rate fault — does not undo it). From
then on the detectors count steps *since the peak*: the warm-up window opens
``warmup_start`` steps after it, as it opened ``warmup_start`` steps after the start of the
constant-rate runs every profile was calibrated on (their peak is their first step). Taking
the window at the peak itself was tried first: right after the warm-up the ΔW entropies
have settled, so their window σ came out smaller than the calibration runs' (whose window
still saw them rise) and healthy cosine runs crossed the ΔW CUSUMs in the decay (2 of 5
calibration runs; ``docs/recipes.md``). A rate still rising ``MAX_WAIT_STEPS`` after the
first record is no warm-up: the rules read from there (waiting longer would leave a learning
rate that climbs to a too-high peak unjudged). A run
with no ``lr`` series is taken as past its peak from its first record, which is what every
run was before the schedule was recorded: constant-rate runs are judged exactly as before
(their peak is their first record: steps since it are their steps).

The same records check a run against the recipes its calibrated profile was made on
(:func:`departure`): a run that declared no recipe but trains with another is moved to the
profile's fallback (:meth:`~foreshock.detectors.engine.RunDetector`), saying why.

>>> clock = ScheduleClock()
>>> [clock.update(step, lr) for step, lr in [(0, 1e-4), (25, 5e-4), (50, 1e-3), (75, 9e-4)]]
[None, None, None, 25]
>>> clock.peak_step, clock.update(100, 2e-3)
(50, 50)
>>> constant = ScheduleClock()
>>> constant.update(0, 1e-3), constant.update(25, 1e-3), constant.update(250, None)
(None, 25, 250)
>>> ScheduleClock().update(500, None)
500
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from foreshock.recipe import LR_TOLERANCE, Recipe

__all__ = ["EARLY_STEPS", "MAX_WAIT_STEPS", "ScheduleClock", "departure"]

# The longest warm-up waited for (steps): real warm-ups run 1-10 % of a horizon, 2,000-5,000
# steps at the longest in published recipes (Llama, OLMo).
MAX_WAIT_STEPS = 5_000


class ScheduleClock:
    """``update(step, lr)``: the steps since the schedule's peak, None while it warms up."""

    def __init__(self) -> None:
        self.peak_step: int | None = None  # the step of the peak (0: no schedule recorded)
        self._last: tuple[int, float] | None = None  # the previous record's (step, lr)
        self.saw_lr = False  # the run records its learning rate
        self._first: int | None = None  # the first record's step

    def update(self, step: int, lr: Any) -> int | None:
        if self.peak_step is None:
            self._find_peak(step, _rate(lr))
        return None if self.peak_step is None else step - self.peak_step

    def _find_peak(self, step: int, rate: float | None) -> None:
        self._first = step if self._first is None else self._first
        if rate is None:
            if not self.saw_lr:
                self.peak_step = 0  # no schedule recorded: steps count as they always did
            return
        self.saw_lr = True
        if self._last is not None and rate <= self._last[1]:
            self.peak_step = self._last[0]  # the previous record was the peak
        elif step - self._first >= MAX_WAIT_STEPS:
            self.peak_step = step
        self._last = (step, rate)


def _rate(lr: Any) -> float | None:
    try:
        rate = float(lr)
    except (TypeError, ValueError):
        return None
    return rate if math.isfinite(rate) and rate >= 0 else None  # a warm-up may start at 0


# Records past which a run that declared no recipe is no longer checked against its profile's:
# by then its warm-up window is measured, and a later change of learning rate may be the fault
# itself (a ramp), which the profile's rules must judge, not escape.
EARLY_STEPS = 300


def departure(recipes: Sequence[Recipe], step: int, lr: Any) -> str | None:
    """Why a run at ``step`` with learning rate ``lr`` is none of the ``recipes`` its profile
    was calibrated on, or None: checked early in the run (``EARLY_STEPS``: a warm-up or
    another peak shows there) and past the longest calibrated horizon (no band is known there).

    >>> constant = [Recipe("constant", 1e-3, 0, 1600)]
    >>> departure(constant, 0, 1e-3) is None, departure(constant, 1000, 5e-3) is None
    (True, True)
    >>> departure(constant, 25, 1e-5)
    'its learning rate 1e-05 at step 25 is not that of constant lr 0.001, 1600 steps'
    >>> departure(constant, 1600, 1e-3)
    'step 1600 is past the calibrated horizon (1600 steps)'
    """
    if not recipes:
        return None
    horizon = max(r.horizon for r in recipes)
    if step >= horizon:
        return f"step {step} is past the calibrated horizon ({horizon} steps)"
    rate = _rate(lr)
    if rate is None or step > EARLY_STEPS:
        return None
    if any(abs(rate - r.lr_at(step)) <= LR_TOLERANCE * r.lr_at(step) for r in recipes):
        return None
    names = "; ".join(r.describe() for r in recipes)
    return f"its learning rate {rate:g} at step {step} is not that of {names}"


# The least warm-up σ of a run-relative series after a learning-rate warm-up, as a share of
# its warm-up level. The constant-rate runs every threshold was calibrated on measure their
# window while the ΔW entropies still rise, so their σ/μ is rarely small (5th percentile 0.021
# for ΔW_q, 0.022 for ΔW_k, over 660 series of the shipped lab runs); after a warm-up the
# window sees them settled, and σ/μ fell to 0.010 on recipe calibration runs: a threshold in
# σ then meant half the calibrated distance, and healthy runs crossed it in the decay. A floor
# at 0.02 still let 5 of 43 healthy recipe calibration runs (10,000-step GPT-MoE, Mixtrals
# under cosine and WSD) cross a ΔW CUSUM; at 0.04 none did, and every diverging fault run
# there was still warned (``python -m benchmarks.recipes``' variants, ``docs/recipes.md``).
WARMED_UP_REL_FLOOR = 0.04


def settle_floor(standardizer: Any) -> None:
    """Floor a warmed-up run's warm-up σ at ``WARMED_UP_REL_FLOOR`` × its level (CUSUM rules'
    standardizers; others have no ``rel_floor``). Set before its window fills."""
    if hasattr(standardizer, "rel_floor"):
        standardizer.rel_floor = max(standardizer.rel_floor, WARMED_UP_REL_FLOOR)
