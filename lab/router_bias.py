"""DeepSeek-V3's auxiliary-loss-free load balancing: the router's bias, updated each step.

DeepSeek-V3 chooses each token's experts by sigmoid score *plus* a per-expert bias b_e, which
is not trained by the gradient and does not weight the expert outputs (DeepSeek-V3 report,
§2.1.2). At the end of every step the bias moves against the load:

    b_e ← b_e + γ · sign(c̄ − c_e)

with c_e the token→expert assignments expert e took in the step's batch and c̄ their mean
over the experts: an overloaded expert becomes less attractive by γ, an underloaded one more.
γ = 0.001 is the report's bias update speed. transformers' ``DeepseekV3TopkRouter`` holds the
bias (``e_score_correction_bias``, a buffer, zero at init) and uses it for the choice, but
leaves the update to the training loop — as here. Without it the bias stays zero and the
model has no load balancing at all (it trains without a balancing loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from foreshock.producers.module_attrs import tensor_attr

__all__ = ["BIAS_UPDATE_SPEED", "BiasBalancer"]

BIAS_UPDATE_SPEED = 1e-3  # γ, bias units per step (DeepSeek-V3 report)
BIAS = "e_score_correction_bias"  # the router buffer the balancer moves


class BiasBalancer:
    """Counts each router's assignments over a training step's forward passes (a forward
    hook on the router, whose third output is the chosen experts' indices) and applies the
    bias update when :meth:`step` is called, after the optimizer step."""

    def __init__(self, routers: Sequence[nn.Module], speed: float = BIAS_UPDATE_SPEED) -> None:
        self.speed = speed
        self.counts: dict[nn.Module, torch.Tensor] = {}
        self._hooks = [r.register_forward_hook(self._count) for r in routers]
        for router in routers:
            self.counts[router] = torch.zeros_like(tensor_attr(router, BIAS))

    def _count(self, router: nn.Module, args: Any, output: tuple[torch.Tensor, ...]) -> None:
        if router.training:  # an evaluation forward does not load the experts of a step
            indices = output[2].reshape(-1)
            self.counts[router] += torch.bincount(indices, minlength=len(self.counts[router]))

    @torch.no_grad()
    def step(self) -> None:
        """b_e ← b_e + γ · sign(c̄ − c_e) for every router that saw tokens; counts reset."""
        for router, counts in self.counts.items():
            if counts.sum() > 0:
                tensor_attr(router, BIAS).add_(self.speed * torch.sign(counts.mean() - counts))
            counts.zero_()

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
