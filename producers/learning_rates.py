"""The optimizer's learning rates in every monitoring record: the schedule, as a series.

Why: a run's recipe (warm-up, decay, its own peak) changes what healthy training looks like,
and a baseline measured while the learning rate still warms up calls the routers' later
specialisation a collapse (``docs/recipes.md``). With the learning rate in the records the
detectors know where the schedule stands (:mod:`foreshock.detectors.schedule_clock`), and
the store and the run page can show it.

Each parameter group's learning rate is ``lr@group.<i>`` (1/step, as the optimizer holds
it); ``lr`` alone is the largest group's — the group with the most parameter elements — the
schedule the model as a whole trains on (a lab fault that ramps only the routers' group
leaves it alone). Read at the monitoring step only, from ``param_groups``: no device sync.
Never raises: an optimizer whose groups cannot be read gives no values.

>>> import torch
>>> w, r = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
>>> groups = [{"params": w.parameters()}, {"params": r.parameters(), "lr": 0.5}]
>>> opt = torch.optim.SGD(groups, lr=0.1)
>>> LearningRates(opt).values()
{'lr': 0.1, 'lr@group.0': 0.1, 'lr@group.1': 0.5}
>>> LearningRates(None).values()
{}
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["LearningRates"]


class LearningRates:
    """Reads an optimizer's per-group learning rates; ``watch`` swaps the optimizer (the
    Hugging Face Trainer builds its own after the callbacks are made)."""

    def __init__(self, optimizer: Any = None) -> None:
        self.optimizer = optimizer

    def watch(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def values(self) -> dict[str, float]:
        try:
            groups = list(getattr(self.optimizer, "param_groups", None) or [])
            rates = [float(g["lr"]) for g in groups]
            sizes = [sum(p.numel() for p in g["params"]) for g in groups]
        except Exception:  # an optimizer of another shape: no schedule, never an error
            return {}
        if not rates or not all(math.isfinite(x) for x in rates):
            return {}
        main = max(range(len(rates)), key=lambda i: (sizes[i], -i))
        return {"lr": rates[main], **{f"lr@group.{i}": x for i, x in enumerate(rates)}}
