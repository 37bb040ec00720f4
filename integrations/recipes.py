"""The recipe a Hugging Face Trainer trains with, declared in the run's ``start`` labels.

Why: a calibrated profile judges only runs of its own recipe (:mod:`foreshock.recipe`); a
Trainer knows its schedule before the first step (``lr_scheduler_type``, the warm-up, the
peak ``learning_rate`` and the horizon), so its runs say so at once instead of being caught
by their learning rates a few records in. Schedules outside the table below declare nothing
(the records' ``lr`` series still tells the detectors where the schedule stands).

The Trainer's cosine and linear schedules decay to 0 (``final`` 0); ``constant_with_warmup``
is ``constant`` after its warm-up; ``warmup_stable_decay`` is ``wsd``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["trainer_recipe"]

_KINDS = {
    "constant": "constant",
    "constant_with_warmup": "constant",
    "cosine": "cosine",
    "linear": "linear",
    "warmup_stable_decay": "wsd",
}


def trainer_recipe(args: Any, max_steps: int | None) -> dict[str, Any] | None:
    """The recipe labels of a Trainer's ``TrainingArguments`` over ``max_steps`` updates, or
    None when its schedule is not one foreshock knows (never raises).

    >>> from types import SimpleNamespace as A
    >>> args = A(lr_scheduler_type="cosine", learning_rate=1e-3, warmup_steps=50)
    >>> trainer_recipe(args, 1000)["schedule"], trainer_recipe(args, 1000)["warmup"]
    ('cosine', 50)
    >>> trainer_recipe(A(lr_scheduler_type="polynomial"), 1000) is None
    True
    """
    from foreshock.recipe import Recipe

    try:
        kind = _KINDS.get(str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)))
        if kind is None or not max_steps or max_steps < 1:
            return None
        warmup = int(args.get_warmup_steps(max_steps)) if hasattr(args, "get_warmup_steps") else 0
        warmup = warmup or int(getattr(args, "warmup_steps", 0) or 0)
        final = 0.0 if kind in ("cosine", "linear", "wsd") else 1.0
        recipe = Recipe(kind, float(args.learning_rate), warmup, int(max_steps), final=final)
        return recipe.to_labels()
    except Exception:
        return None
