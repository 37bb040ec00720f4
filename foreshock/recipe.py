"""A training recipe: the learning-rate schedule a run trains with, and when one recipe is
another's.

Real runs warm up, then decay; profiles and bands calibrated at one constant learning rate
do not carry over to them (``docs/recipes.md``). So the lab trains recipes, runs declare
theirs in their ``start`` labels (``recipe``), a calibrated profile records the recipes of
its calibration runs, and a run whose recipe is not one of them is judged by rules that hold
across recipes — never silently by another recipe's bands.

The schedule, with η the peak learning rate, w the warm-up steps, T the horizon and
f the final fraction (η_T = f·η):

* warm-up (every kind): η_t = η·(t + 1)/w for t < w (linear, as HF's and torch's);
* ``constant``: η;
* ``cosine``: η·(f + (1 − f)·(1 + cos(π·p))/2), p = (t − w)/(T − w);
* ``linear``: η·(1 − (1 − f)·p);
* ``wsd`` (warm-up, stable, decay): η until ``decay_start``, then linear to f·η at T.

Torch-free and dependency-free.

>>> r = Recipe("cosine", lr=1e-3, warmup=100, horizon=1100, final=0.1)
>>> round(r.lr_at(49), 6), round(r.lr_at(100), 6), round(r.lr_at(600), 6), round(r.lr_at(1100), 6)
(0.0005, 0.001, 0.00055, 0.0001)
>>> Recipe("wsd", lr=1e-3, warmup=0, horizon=1000, decay_start=800).lr_at(900)
0.00055
>>> Recipe().describe()
'constant lr 0.001, 1600 steps'
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["SCHEDULES", "Recipe", "recipe_mismatch", "recipe_of_run"]

SCHEDULES = ("constant", "cosine", "linear", "wsd")
# How far a run's peak learning rate may lie from a profile's calibration runs' and still be
# judged by its bands (a relative difference): recipes at 0.5x and 2x are other recipes.
LR_TOLERANCE = 0.1


@dataclass(frozen=True)
class Recipe:
    """A learning-rate schedule (see the module docstring); ``horizon`` in optimizer steps."""

    schedule: str = "constant"
    lr: float = 1e-3
    warmup: int = 0
    horizon: int = 1600
    decay_start: int | None = None  # wsd: the first step of the decay (default 80 % in)
    final: float = 0.1  # the learning rate at the horizon, as a fraction of the peak

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose from {SCHEDULES}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"the learning rate must be positive, got {self.lr}")
        if self.horizon < 1 or not 0 <= self.warmup < self.horizon:
            raise ValueError(f"need 0 <= warmup < horizon, got {self.warmup}, {self.horizon}")
        if not 0 <= self.final <= 1:
            raise ValueError(f"final must be a fraction of the peak in [0, 1], got {self.final}")
        start = self.decay_start
        if start is not None and (
            self.schedule != "wsd" or not self.warmup <= start <= self.horizon
        ):
            raise ValueError("decay_start is for wsd, between the warm-up and the horizon")

    @property
    def decay_from(self) -> int:
        """The first step of the decay (the warm-up's end; wsd: ``decay_start``)."""
        if self.schedule == "wsd":
            return self.decay_start if self.decay_start is not None else (4 * self.horizon) // 5
        return self.warmup

    def lr_at(self, step: int) -> float:
        """The learning rate at optimizer step ``step`` (the horizon's beyond it)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.schedule == "constant":
            return self.lr
        start = self.decay_from
        p = min(1.0, max(0.0, (step - start) / max(1, self.horizon - start)))
        f = self.final
        if self.schedule == "cosine":
            return self.lr * (f + (1 - f) * (1 + math.cos(math.pi * p)) / 2)
        return self.lr * (1 - (1 - f) * p)  # linear, and wsd's decay

    def describe(self) -> str:
        """What a person reads: ``cosine lr 0.001, warm-up 100, 2000 steps``."""
        warm = f", warm-up {self.warmup}" if self.warmup else ""
        wsd = f", decay from {self.decay_from}" if self.schedule == "wsd" else ""
        return f"{self.schedule} lr {self.lr:g}{warm}{wsd}, {self.horizon} steps"

    def to_labels(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_labels(cls, data: Any) -> Recipe | None:
        """The recipe a ``start`` record's ``labels.recipe`` declares; None when absent or
        not a recipe (a run that declares none is judged by what its records show)."""
        if not isinstance(data, dict):
            return None
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ValueError):
            return None


def recipe_mismatch(run: Recipe, calibrated: list[Recipe]) -> str | None:
    """Why ``run`` is none of the ``calibrated`` recipes, or None when it is one of them: the
    same schedule kind and warm-up, a peak within ``LR_TOLERANCE`` and a horizon no longer
    (bands past the calibrated horizon would be guessed). No calibrated recipe: no claim.

    >>> calibrated = [Recipe("constant", 1e-3, 0, 1600)]
    >>> recipe_mismatch(Recipe("constant", 1e-3, 0, 1600), calibrated) is None
    True
    >>> for part in recipe_mismatch(Recipe("cosine", 1e-3, 100, 1600), calibrated).split(" is "):
    ...     print(part)
    cosine lr 0.001, warm-up 100, 1600 steps
    not a calibrated recipe (constant lr 0.001, 1600 steps)
    """
    if not calibrated:
        return None
    for known in calibrated:
        same_lr = abs(run.lr - known.lr) <= LR_TOLERANCE * known.lr
        same_kind = run.schedule == known.schedule and run.warmup == known.warmup
        decay = run.schedule != "wsd" or run.decay_from == known.decay_from
        if same_lr and same_kind and decay and run.horizon <= known.horizon:
            return None
    names = "; ".join(r.describe() for r in calibrated)
    return f"{run.describe()} is not a calibrated recipe ({names})"


def recipe_of_run(start: dict[str, Any], records: list[dict[str, Any]]) -> Recipe | None:
    """The recipe a finished run trained with: the one its ``start`` labels declare; else,
    from a run that recorded its learning rate (``lr``), a constant one when it never
    changed; else a lab run's constant ``lr`` over its ``steps``. None: not knowable.

    >>> recipe_of_run({"labels": {"lr": 1e-3, "steps": 800}}, []).describe()
    'constant lr 0.001, 800 steps'
    >>> warming = [{"step": 0, "values": {"lr": 1e-4}}, {"step": 99, "values": {"lr": 2e-4}}]
    >>> recipe_of_run({}, warming) is None
    True
    """
    labels = start.get("labels") or {}
    declared = Recipe.from_labels(labels.get("recipe"))
    if declared is not None:
        return declared
    rates = {r.get("values", {}).get("lr") for r in records} - {None}
    if len(rates) == 1 and records:
        return Recipe.from_labels({"lr": rates.pop(), "horizon": records[-1]["step"] + 1})
    if rates:
        return None
    return Recipe.from_labels({"lr": labels.get("lr"), "horizon": labels.get("steps")})
