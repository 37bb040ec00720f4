"""The remedies a policy can ask a trainer for: one module each in this package, found here.

Why one module each (as river keeps one detector a module, and datasette declares its hooks):
adding a remedy is one file and its test. A module declares ``REMEDY``, a :class:`Remedy` —
its name on the wire and in a policy, a line saying what it does, how it reads a decision, and
``apply(trainer, decision)``, which asks the trainer's remedies
(:class:`~foreshock.remediation.trainer.TrainerRemedies` in a training loop, the lab's in the
lab) for what it needs (:func:`ask`). Which cause a remedy answers is the policy's choice
(:data:`~foreshock.remediation.policy.DEFAULT_ACTIONS`), not the remedy's. Torch-free at
import: the operator's ``warnings act`` lists them on a machine without torch.

>>> sorted(REMEDIES)
['hold-lr', 'precise-attention', 'scale-router-lr', 'stop']
>>> REMEDIES["hold-lr"].scale, REMEDIES["hold-lr"].from_evidence
('lr_scale', True)
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["REMEDIES", "Remedy", "ask"]


@dataclass(frozen=True)
class Remedy:
    """One remedy (see the package docstring)."""

    name: str  # on the wire (``warnings act --action``) and in a policy's ``actions``
    summary: str  # what it does, in a line (the command's help)
    # (the trainer's remedies, the decision: ``foreshock.remediation.decision.Decision``) ->
    # what it did; the package imports nothing of the room it sits in (no cycle through it)
    apply: Callable[[Any, Any], Any]
    scale: str | None = None  # the policy field that scales it (None: 1)
    from_evidence: bool = False  # it scales a rate from when the warning's evidence began
    holds_risen_lr: bool = False  # with ``hold_rising_lr``, a risen learning rate held too


def ask(trainer: Any, method: str, *args: Any) -> Any:
    """``trainer.method(*args)``; a trainer without it cannot take this action (the action's
    error says so, and training goes on)."""
    call = getattr(trainer, method, None)
    if call is None:
        raise NotImplementedError(f"this trainer offers no {method}")
    return call(*args)


def _found() -> dict[str, Remedy]:
    """Every module's ``REMEDY``, by name; a module without one, or a name twice, is an error
    at import (a remedy that silently went missing would leave its cause unanswered)."""
    found: dict[str, Remedy] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        remedy = getattr(importlib.import_module(f"{__name__}.{info.name}"), "REMEDY", None)
        if not isinstance(remedy, Remedy):
            raise RuntimeError(f"{__name__}.{info.name} declares no REMEDY")
        if remedy.name in found:
            raise RuntimeError(f"two remedies named {remedy.name!r}")
        found[remedy.name] = remedy
    return dict(sorted(found.items()))


REMEDIES: dict[str, Remedy] = _found()
