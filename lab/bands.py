"""The healthy band: when does a run's monitor series leave what healthy runs do?

Deliberately simple and detector-free, to measure what the monitors carry before any tuning.
For a series (one per layer/router; families in FAMILIES) and a monitoring step s, the healthy
band is [lo − w, hi + w], with lo, hi the min and max of the *other* healthy runs at s
(leave-one-out, so healthy runs are scored fairly) and w = pad·(hi − lo), pad = 1 by default.
A run leaves the band at the first step s ≥ ``min_step`` from which it stays outside for
``consecutive`` checks in a row on the same side (below, above, or null); a family's exit is the
earliest exit of its series. A step needs values from at least two other healthy runs (one, if
only one exists). Torch-free.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import NamedTuple

from .recorded import RecordedRun

__all__ = ["FAMILIES", "Exit", "band_exit", "family_exits"]

FAMILIES = {
    "d2_entropy": r"^attn\.d2\.entropy_mean@",
    "dw_entropy": r"^attn\.dw[qk]\.entropy@",
    "router_entropy": r"^router\.token_entropy_norm@",
    "load_entropy": r"^router\.load_entropy@",
    "epsilon": r"^router\.epsilon@",
    "loss": r"^loss$",
    "grad_norm": r"^grad_norm$",
}


class Exit(NamedTuple):
    """Where a run left the healthy band: first step, "below"/"above"/"null", and the series."""

    step: int
    direction: str
    key: str


def _healthy_values(key: str, others: list[RecordedRun]) -> dict[int, list[float]]:
    bands: dict[int, list[float]] = defaultdict(list)
    for other in others:
        for step, value in zip(*other.series(key), strict=True):
            if value is not None:
                bands[step].append(value)
    return bands


def band_exit(
    run: RecordedRun,
    key: str,
    healthy: list[RecordedRun],
    min_step: int,
    consecutive: int,
    pad: float = 1.0,
) -> Exit | None:
    """First exit of one series from its healthy band, held ``consecutive`` checks on one side."""
    others = [h for h in healthy if h.run_id != run.run_id]
    bands = _healthy_values(key, others)
    streak_start, streak, side = 0, 0, ""
    for step, value in zip(*run.series(key), strict=True):
        if step < min_step or len(bands.get(step, ())) < min(2, len(others)) or not others:
            continue
        lo, hi = min(bands[step]), max(bands[step])
        width = pad * (hi - lo)
        now = (
            "null"
            if value is None
            else "below"
            if value < lo - width
            else "above"
            if value > hi + width
            else ""
        )
        if now and now == side:
            streak += 1
        elif now:
            streak_start, streak, side = step, 1, now
        else:
            streak, side = 0, ""
        if streak >= consecutive:
            return Exit(streak_start, side, key)
    return None


def family_exits(
    run: RecordedRun,
    healthy: list[RecordedRun],
    min_step: int,
    consecutive: int,
    pad: float = 1.0,
) -> dict[str, Exit | None]:
    """Per family, the earliest exit over its series (its key names the layer or router)."""
    keys = run.keys()
    exits: dict[str, Exit | None] = {}
    for family, pattern in FAMILIES.items():
        found = [
            band_exit(run, key, healthy, min_step, consecutive, pad)
            for key in keys
            if re.match(pattern, key)
        ]
        exited = [e for e in found if e is not None]
        exits[family] = min(exited, key=lambda e: e.step) if exited else None
    return exits
