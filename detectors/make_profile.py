"""A user's own profile from their healthy runs: bands, thresholds and the optimizer test.

``foreshock calibrate --name`` builds what the shipped profiles hold for the lab's models —
healthy bands per series and step with leave-one-out thresholds, the run-relative rules'
thresholds, the weight-norm band of the optimizer test
(:func:`~foreshock.detectors.calibrate.calibrate_profile`) — for the user's model, and names
the architecture signature it was made on, so it judges only runs of that model
(:mod:`foreshock.detectors.profiles`).

How many healthy runs: a band of n runs is their [min, max], and its leave-one-out
thresholds are set by how far each run strays from the others; with few runs both are noise.
Measured by ``python -m benchmarks.profile_size`` (profiles of the lab's Mixtral and GPT-MoE
from N of their healthy runs, judged on held-out runs; figures in docs/detectors.md): with 3,
learning-rate ramps went largely unwarned on Mixtral; with 5–7 every fault kind was caught
but a draw could leave 4 in 10 held-out healthy runs warning falsely; with 10 the held-out
healthy runs were mostly quiet. So ``MIN_HEALTHY_RUNS`` = 10: fewer is refused unless asked
for, and then the profile says so in its calibration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .calibrate import calibrate_profile
from .config import BAND_RULES, DetectorConfig
from .signatures import describe, same_model, signature_of

__all__ = ["MIN_HEALTHY_RUNS", "ProfileError", "make_profile", "one_model", "recipes_of"]

MIN_HEALTHY_RUNS = 10


class ProfileError(ValueError):
    """The runs cannot make a profile (too few, of different models, no signature)."""


def make_profile(
    healthy: Sequence[Any],
    replay: Callable[[Any, DetectorConfig], Any],
    allow_few: bool = False,
    base: DetectorConfig | None = None,
) -> tuple[DetectorConfig, list[dict[str, Any]]]:
    """The calibrated config and the signature(s) it applies to, from ``healthy`` runs
    (objects with ``start`` and ``records``) of one model. Raises ``ProfileError`` for
    fewer than ``MIN_HEALTHY_RUNS`` (unless ``allow_few``) or runs of different models."""
    n = len(healthy)
    if n < 2:
        raise ProfileError(f"a profile needs at least 2 healthy runs, got {n}")
    if n < MIN_HEALTHY_RUNS and not allow_few:
        raise ProfileError(
            f"{n} healthy runs: a profile needs {MIN_HEALTHY_RUNS} (with fewer, held-out "
            "healthy runs warned falsely; benchmarks.profile_size); --allow-few makes it anyway"
        )
    first = one_model(healthy)
    config = calibrate_profile(healthy, base or DetectorConfig(BAND_RULES), replay)
    if n < MIN_HEALTHY_RUNS:
        note = f"only {n} healthy runs (at least {MIN_HEALTHY_RUNS} needed)"
        config = replace(config, calibration={**config.calibration, "too_few_runs": note})
    return config, [first]


def one_model(runs: Sequence[Any]) -> dict[str, Any]:
    """The architecture signature every run shares (``start`` records'); ``ProfileError``
    when a run has none or two runs are of different models: a profile is of one model."""
    signatures = [signature_of(run.start) for run in runs]
    if not signatures or signatures[0] is None:
        raise ProfileError(f"{_id(runs[0]) if runs else 'no run'} has no architecture signature")
    first = signatures[0]
    other = next((i for i, s in enumerate(signatures) if not same_model(first, s)), None)
    if other is not None:
        raise ProfileError(
            f"the runs are of different models: {_id(runs[0])} is {describe(first)}, "
            f"{_id(runs[other])} is {describe(signatures[other])}"
        )
    return first


def _id(run: Any) -> str:
    return str(run.start.get("run_id") or "a run")


def recipes_of(runs: Sequence[Any]) -> list[dict[str, Any]]:
    """The distinct recipes of ``runs`` (objects with ``start`` and ``records``), as labels:
    a profile judges only runs of these (:mod:`foreshock.recipe`). Empty when one run's recipe
    cannot be known: a profile then claims none rather than a wrong one."""
    from foreshock.recipe import recipe_of_run

    found = [recipe_of_run(run.start, run.records) for run in runs]
    if not found or any(r is None for r in found):
        return []
    return [r.to_labels() for r in dict.fromkeys(found) if r is not None]
