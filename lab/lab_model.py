"""The interface every lab architecture gives the training loop: the model and its handles.

The loop and the faults need the same few things from any architecture — the attention layers
(to switch the FA faults on and to observe the largest logit), the capacity-limited MoE layers
(to observe drops), the router weights (for router-only learning-rate faults), the loss, and
for some routers an update that is not a gradient step (DeepSeek-V3's balancing bias). A
builder (:mod:`foreshock.lab.arch`, :mod:`foreshock.lab.hf_archs`) returns them here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .model import GPT

__all__ = ["LabModel", "set_switch"]


@dataclass
class LabModel:
    """A model with the handles the lab's training loop and faults need."""

    model: nn.Module
    attention: dict[str, nn.Module]  # name -> layer with .lowp and .logit_observer
    moe: dict[str, nn.Module]  # router name -> MoE layer with .drop_observer (capacity only)
    routers: list[torch.Tensor]  # the router weights (router-only learning-rate faults)
    aux_loss_weight: float  # the load-balancing loss added to a transformers model's loss
    after_step: Callable[[], None] | None = None  # run after each optimizer step
    settings: dict[str, Any] = field(default_factory=dict)  # what was built (for the labels)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Next-byte cross-entropy plus the load-balancing loss (weight ``aux_loss_weight``)."""
        if isinstance(self.model, GPT):
            return self.model(x, y)[1]  # GPT.forward adds its own Switch loss
        # Only MoE models know output_router_logits; it is their config's default (False)
        # unless a balancing loss is wanted.
        router_logits = {"output_router_logits": True} if self.aux_loss_weight > 0 else {}
        out = self.model(input_ids=x, **router_logits)
        loss = F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)), y.reshape(-1))
        if self.aux_loss_weight > 0:
            loss = loss + self.aux_loss_weight * out.aux_loss
        return loss

    @property
    def n_parameters(self) -> int:
        """The number of trainable scalars (tied weights counted once)."""
        return sum(p.numel() for p in self.model.parameters())


# nn.Module types its attributes as tensors or modules; the lab's switches (``lowp``,
# ``logit_observer``, ``drop_observer``) are plain attributes, set through this one (the parts
# the lab reads are read with ``producers.module_attrs``: ``tensor_attr``, ``submodule``).
def set_switch(module: nn.Module, name: str, value: Any) -> None:
    """Set a lab switch (a plain attribute: a LowPrecision, an observer, None) on ``module``."""
    setattr(module, name, value)
