"""A small ring of in-memory training snapshots, for a rollback before a warning's evidence.

Why in memory, and few: a remedy that rolls back wants the newest state *older than the
warning's first evidence* — a few hundred steps back at most — and trainers that checkpoint
every few thousand steps have nothing that recent. A copy of the model's and the optimizer's
state every ``every`` steps, ``capacity`` of them, costs ``capacity`` × (parameters + optimizer
state) bytes (``nbytes``: AdamW keeps two moments, so about 3× the parameters each) of the
memory those tensors live in — the accelerator's for a model on one: the copies are clones on
the same device — and a copy's time every ``every`` steps. Restoring is bit for bit: the tensors are
cloned, never shared with the live ones.

>>> import torch
>>> model = torch.nn.Linear(2, 2)
>>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
>>> ring = SnapshotRing(capacity=2, every=10)
>>> ring.maybe_take(0, model, optimizer), ring.maybe_take(5, model, optimizer)
(True, False)
>>> before = model.weight.detach().clone()
>>> with torch.no_grad():
...     _ = model.weight.add_(1.0)
>>> ring.restore_before(7, model, optimizer), bool(torch.equal(model.weight, before))
(0, True)
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

import torch

__all__ = ["SnapshotRing"]


def _clone(state: Any) -> Any:
    """A copy of a state tree whose tensors are cloned (``copy.deepcopy`` of an optimizer's
    state takes ~25× the time of cloning its tensors); other leaves are copied."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_clone(v) for v in state)
    return copy.deepcopy(state)


def _nbytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(_nbytes(v) for v in state)
    return 0


class SnapshotRing:
    """The last ``capacity`` snapshots, one every ``every`` steps: (step, model, optimizer)."""

    def __init__(self, capacity: int = 3, every: int = 100) -> None:
        if capacity < 1 or every < 1:
            raise ValueError("capacity and every must be >= 1")
        self.capacity, self.every = capacity, every
        self._ring: deque[tuple[int, dict[str, Any], dict[str, Any]]] = deque(maxlen=capacity)

    def maybe_take(self, step: int, model: torch.nn.Module, optimizer: Any) -> bool:
        """Snapshot the state *before* training step ``step`` when it is due."""
        if step % self.every:
            return False
        model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self._ring.append((step, model_state, _clone(optimizer.state_dict())))
        return True

    def newest_before(self, step: int) -> int | None:
        """The newest snapshot's step older than ``step`` (None: none)."""
        return max((s for s in self.steps if s < step), default=None)

    def restore_before(self, step: int, model: torch.nn.Module, optimizer: Any) -> int | None:
        """Load the newest snapshot taken before ``step``; its step (training goes on from
        there), or None when none is that old (nothing restored)."""
        newest = self.newest_before(step)
        if newest is None:
            return None
        taken, model_state, optimizer_state = next(s for s in self._ring if s[0] == newest)
        model.load_state_dict(model_state)
        optimizer.load_state_dict(_clone(optimizer_state))  # loading may alias its tensors
        while self._ring and self._ring[-1][0] > taken:  # the future it replaces is gone
            self._ring.pop()
        return taken

    @property
    def steps(self) -> list[int]:
        return [s[0] for s in self._ring]

    @property
    def nbytes(self) -> int:
        """Host bytes the snapshots hold (model and optimizer tensors)."""
        return sum(_nbytes(m) + _nbytes(o) for _, m, o in self._ring)
