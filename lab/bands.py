"""The healthy band: when does a run's monitor series leave what healthy runs do?

Deliberately simple and detector-free, to measure what the monitors carry before any tuning.
For a series (one per layer/router; families in FAMILIES) and a monitoring step s, the healthy
band is [lo − w, hi + w], with lo, hi the min and max of the *other* healthy runs at s
(leave-one-out, so healthy runs are scored fairly) and w = pad·(hi − lo), pad = 1 by default.
A run leaves the band at the first step s ≥ ``min_step`` from which it stays outside for
``consecutive`` checks in a row (a null value counts as outside); a family's exit is the
earliest exit of its series. A step needs values from at least two other healthy runs (one, if
only one exists). Torch-free.
"""

from __future__ import annotations

import re
from collections import defaultdict

from .recorded import RecordedRun

__all__ = ["FAMILIES", "band_exit", "family_exits"]

FAMILIES = {
    "d2_entropy": r"^attn\.d2\.entropy_mean@",
    "dw_entropy": r"^attn\.dw[qk]\.entropy@",
    "router_entropy": r"^router\.token_entropy_norm@",
    "epsilon": r"^router\.epsilon@",
    "loss": r"^loss$",
    "grad_norm": r"^grad_norm$",
}


def band_exit(
    run: RecordedRun,
    key: str,
    healthy: list[RecordedRun],
    min_step: int,
    consecutive: int,
    pad: float = 1.0,
) -> int | None:
    others = [h for h in healthy if h.run_id != run.run_id]
    if not others:
        return None
    bands: dict[int, list[float]] = defaultdict(list)
    for other in others:
        for step, value in zip(*other.series(key), strict=True):
            if value is not None:
                bands[step].append(value)
    streak_start, streak = None, 0
    for step, value in zip(*run.series(key), strict=True):
        if step < min_step or len(bands.get(step, ())) < min(2, len(others)):
            continue
        lo, hi = min(bands[step]), max(bands[step])
        width = pad * (hi - lo)
        outside = value is None or not (lo - width <= value <= hi + width)
        if outside:
            streak_start = step if streak == 0 else streak_start
            streak += 1
            if streak >= consecutive:
                return streak_start
        else:
            streak = 0
    return None


def family_exits(
    run: RecordedRun,
    healthy: list[RecordedRun],
    min_step: int,
    consecutive: int,
    pad: float = 1.0,
) -> dict[str, int | None]:
    keys = run.keys()
    exits = {}
    for family, pattern in FAMILIES.items():
        found = [
            band_exit(run, key, healthy, min_step, consecutive, pad)
            for key in keys
            if re.match(pattern, key)
        ]
        steps = [s for s in found if s is not None]
        exits[family] = min(steps) if steps else None
    return exits
