"""The operational definition of a diverged run, applied by code to every lab run.

A run diverges at step t when the training loss is not finite at t, or when its exponential
moving average (smoothing ``ema``) stays more than ``margin`` nats above the best EMA seen so
far for ``patience`` consecutive steps starting at t. The EMA and the sustained window keep
single noisy batches from counting; "above its own best" makes the rule scale-free across
model sizes and data. Steps before ``warmup`` never start a divergence (the EMA's start-up).

Torch-free: detectors and storage apply the same rule to recorded losses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DivergenceRule", "divergence_step"]


@dataclass(frozen=True)
class DivergenceRule:
    margin: float = 0.5  # nats above the best smoothed loss
    patience: int = 50  # consecutive steps
    ema: float = 0.05  # EMA weight of the newest loss
    warmup: int = 100  # steps before which no divergence can start

    def __post_init__(self) -> None:
        if self.margin <= 0 or self.patience < 1 or not 0 < self.ema <= 1 or self.warmup < 0:
            raise ValueError(f"invalid divergence rule: {self}")


def divergence_step(
    losses: Iterable[float], rule: DivergenceRule = DivergenceRule(), first_step: int = 0
) -> int | None:
    """First step of the divergence, or None. ``losses`` holds one loss per step.

    >>> flat = [2.0] * 300
    >>> divergence_step(flat) is None
    True
    >>> rising = [2.0] * 200 + [4.0] * 100        # jumps by 2 nats at step 200
    >>> divergence_step(rising)                   # EMA crosses best + 0.5 a few steps later
    205
    >>> divergence_step([2.0] * 150 + [float("nan")])
    150
    """
    smoothed = best = None
    above_since = None
    for offset, loss in enumerate(losses):
        step = first_step + offset
        if not math.isfinite(loss):
            return step
        smoothed = loss if smoothed is None else (1 - rule.ema) * smoothed + rule.ema * loss
        best = smoothed if best is None else min(best, smoothed)
        if offset >= rule.warmup and smoothed - best > rule.margin:
            above_since = step if above_since is None else above_since
            if step - above_since + 1 >= rule.patience:
                return above_since
        else:
            above_since = None
    return None
