"""The always-on anchors a remedy policy is compared with: guards every step pays for.

Why in the lab: foreshock acts once, on a cause, when a warning opens. The alternative a
trainer already has is a guard that runs at every step whatever happens — it needs no
detector, and it costs nothing to turn on. The remediation table puts the two side by side on
the same faults (``python -m benchmarks.remediation --policies zclip,clip-1.0,spam``). Each
anchor acts between ``loss.backward()`` and ``optimizer.step()``:

* ``clip-1.0``: the global gradient norm clipped to 1.0 (the default of most LLM recipes):
  g ← g · min(1, 1.0 / ‖g‖₂);
* ``zclip``: ZClip (Kumar et al., 2025, arXiv:2504.02507), z-score mode with adaptive
  scaling: the gradient norm n's EMA mean μ and variance σ² (α = 0.97, initialised on the
  first 25 steps), z = (n − μ)/σ; when z > z_t = 2.5 the norm is clipped to
  μ + z_t² σ / z, and the EMA is updated with the norm after clipping;
* ``spam``: SPAM (Huang et al., 2025, arXiv:2501.06842) on Adam(W): every gradient element
  with g² > θ·v (θ = 5000, v Adam's second moment) is clipped to sign(g)·√(θ v), and every
  ΔT = 500 steps both moments are reset to zero with Adam's step count (its bias correction
  then warms the update up again, in place of SPAM's own learning-rate warm-up).

>>> import torch
>>> weight = torch.nn.Parameter(torch.ones(2))
>>> weight.grad = torch.tensor([3.0, 4.0])
>>> optimizer = torch.optim.AdamW([weight])
>>> anchor("clip-1.0").before_step([weight], optimizer)
>>> [round(g, 6) for g in weight.grad.tolist()]
[0.6, 0.8]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch

__all__ = ["ANCHORS", "Anchor", "FixedClip", "SpikeAwareReset", "ZClip", "anchor"]

ANCHORS = ("clip-1.0", "zclip", "spam")


class Anchor(Protocol):
    """A guard that may change the gradients (or the optimizer's state) before each step."""

    def before_step(
        self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer
    ) -> None: ...


def _grad_norm(params: Sequence[torch.Tensor]) -> float:
    """‖g‖₂ over every parameter's gradient (0 with none)."""
    squares = [p.grad.detach().float().square().sum() for p in params if p.grad is not None]
    return math.sqrt(float(torch.stack(squares).sum())) if squares else 0.0


def _scale_grads(params: Sequence[torch.Tensor], factor: float) -> None:
    for p in params:
        if p.grad is not None:
            p.grad.mul_(factor)


class FixedClip:
    """g ← g · min(1, max_norm / ‖g‖₂)."""

    def __init__(self, max_norm: float = 1.0) -> None:
        self.max_norm = max_norm

    def before_step(self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)


class ZClip:
    """ZClip's z-score mode with adaptive scaling (see the module docstring)."""

    def __init__(self, alpha: float = 0.97, z_thresh: float = 2.5, warmup: int = 25) -> None:
        self.alpha, self.z_thresh, self.warmup = alpha, z_thresh, warmup
        self.norms: list[float] = []  # the warm-up's norms, until μ and σ² are set
        self.mean: float | None = None
        self.var = 0.0
        self.clipped = 0  # steps whose norm was clipped

    def before_step(self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        norm = _grad_norm(params)
        if not math.isfinite(norm):
            return  # nothing to scale a NaN into; the run's divergence rule sees it
        if self.mean is None:
            self.norms.append(norm)
            if len(self.norms) >= self.warmup:
                self.mean = sum(self.norms) / len(self.norms)
                self.var = sum((n - self.mean) ** 2 for n in self.norms) / len(self.norms)
            return
        kept = self.clip_to(norm)
        if kept < norm:
            _scale_grads(params, kept / norm)
            self.clipped += 1
        self.mean = self.alpha * self.mean + (1 - self.alpha) * kept
        self.var = self.alpha * self.var + (1 - self.alpha) * (kept - self.mean) ** 2

    def clip_to(self, norm: float) -> float:
        """The norm kept: μ + z_t² σ / z when z = (n − μ)/σ > z_t, else n."""
        assert self.mean is not None
        std = math.sqrt(self.var)
        z = (norm - self.mean) / (std + 1e-12)
        return self.mean + self.z_thresh**2 * std / z if z > self.z_thresh else norm


class SpikeAwareReset:
    """SPAM's spike-aware clipping and periodic momentum reset (see the module docstring)."""

    def __init__(self, theta: float = 5000.0, reset_every: int = 500) -> None:
        self.theta, self.reset_every = theta, reset_every
        self.steps = 0
        self.resets = 0
        self.clipped = 0  # gradient elements clipped

    @torch.no_grad()
    def before_step(self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        self.steps += 1
        for p in params:
            state: dict[str, Any] = optimizer.state.get(p, {})
            v = state.get("exp_avg_sq")
            if p.grad is None or v is None:
                continue
            bound = (self.theta * v).sqrt()
            spikes = (p.grad.square() > self.theta * v) & (v > 0)
            self.clipped += int(spikes.sum())
            p.grad.copy_(torch.where(spikes, p.grad.sign() * bound, p.grad))
        if self.steps % self.reset_every == 0:
            self.resets += 1
            for state in optimizer.state.values():
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in state:
                        state[key].zero_()
                step = state.get("step")
                if torch.is_tensor(step):
                    step.zero_()
                elif step is not None:
                    state["step"] = 0


def anchor(name: str) -> Anchor:
    """The anchor called ``name`` (one of :data:`ANCHORS`), with the published defaults."""
    anchors: dict[str, Any] = {"clip-1.0": FixedClip, "zclip": ZClip, "spam": SpikeAwareReset}
    if name not in anchors:
        raise ValueError(f"unknown anchor {name!r}; known: {list(ANCHORS)}")
    return anchors[name]()
