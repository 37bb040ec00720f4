"""One rank's share of a monitoring step, and how the shares make one record.

Each rank sends a :class:`RankPart`: the series it owns (the spectra of its layers, the
geometry of its routers), and its share of every data statistic in a form that combines
exactly — routing accumulator states (counts, sums and histograms add, minima take the least),
dropped/assigned token counts (add), the largest attention logit it saw (max), its loss
(mean over ranks: equal micro-batches make it the global batch's mean loss) and its share of
Σ‖w‖² and Σ‖g‖² (add, then √). A single process is the one-part case of the same path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from foreshock.transport.records import series_key

from .router import RoutingAccumulator, merge_states

__all__ = ["RankPart", "combine"]


@dataclass
class RankPart:
    """What one rank measured at one monitoring step (plain Python values: cheap to gather)."""

    rank: int = 0
    owned: dict[str, float] = field(default_factory=dict)  # series this rank computed
    routing: dict[str, list[float] | None] = field(default_factory=dict)  # router → state
    routers: dict[str, tuple[int, int | None, int, str]] = field(default_factory=dict)
    # router → its accumulator's (E, k, bins, scoring): a writer without that router (another
    # pipeline stage's) can still combine its states
    drops: dict[str, tuple[float, int]] = field(default_factory=dict)  # router → (dropped, n)
    max_logits: dict[str, float] = field(default_factory=dict)
    loss: float | None = None
    squares: dict[str, float] = field(default_factory=dict)  # grad_norm/weight_norm → Σ share
    flags: list[str] = field(default_factory=list)


def combine(
    parts: list[RankPart],
    data: list[RankPart],
    routers: dict[str, RoutingAccumulator],
) -> tuple[dict[str, float], list[str]]:
    """(values, flags) of one record: every part's owned series and norms, and the data
    statistics of the ``data`` parts (all of them for the global record, one rank's own for a
    per-rank record). ``routers`` gives each router's accumulator (its E, k, bins, scoring)."""
    values: dict[str, float] = {}
    for part in parts:
        values.update(part.owned)
    known = {n: shape for p in parts for n, shape in p.routers.items()}
    for name in [*routers, *(n for n in known if n not in routers)]:
        acc = routers.get(name) or RoutingAccumulator(*known[name])
        acc.load_state(merge_states([_state(p.routing.get(name)) for p in data]))
        for stat, value in acc.summary().items():
            values[series_key(f"router.{stat}", name)] = float(value)
        acc.reset()
    for name in sorted({n for p in data for n in p.drops}):
        dropped = sum(p.drops[name][0] for p in data if name in p.drops)
        assigned = sum(p.drops[name][1] for p in data if name in p.drops)
        values[series_key("router.dropped_fraction", name)] = dropped / max(assigned, 1)
    losses = [p.loss for p in data if p.loss is not None]
    if losses:
        values["loss"] = sum(losses) / len(losses)
    for metric in ("grad_norm", "weight_norm"):
        shares = [p.squares[metric] for p in parts if metric in p.squares]
        if shares:
            values[metric] = math.sqrt(max(sum(shares), 0.0)) if _finite(shares) else math.nan
    for name in sorted({n for p in data for n in p.max_logits}):
        seen = [p.max_logits[name] for p in data if name in p.max_logits]
        values[series_key("max_logit", name)] = math.nan if not _finite(seen) else max(seen)
    flags = sorted({f for p in parts for f in p.flags})
    return values, flags


def _state(state: list[float] | None) -> torch.Tensor | None:
    return None if state is None else torch.tensor(state, dtype=torch.float64)


def _finite(numbers: list[float]) -> bool:
    return all(math.isfinite(x) for x in numbers)
