"""A Monitor's registration calls: layers and routers that discovery cannot read, declared.

Apart from :mod:`.monitor` only to keep each module one screenful of ideas: these are the
Monitor's methods (a mixin), reading and writing its ``discovery``, snapshots and hooks.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from .layouts import AttentionSpec, RouterSpec
from .module_attrs import tensor_attr
from .names import named_modules
from .signature import signature_or_none

__all__ = ["Registration"]


class Registration:
    """``register_attention`` and ``register_router`` of :class:`~.monitor.Monitor`, and what
    it reads of what was found: the attention modules, the architecture signature."""

    model: nn.Module
    discovery: Any
    participating: bool
    _snapshots: dict[str, Any]
    _observed: Any

    def register_attention(
        self,
        name: str,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        n_heads: int,
        head_dim: int,
        n_kv_heads: int | None = None,
        **layout: Any,
    ) -> AttentionSpec:
        """Declare an attention layer discovery can't read (e.g. W_q, W_k with 8 heads of 64);
        ``layout``: AttentionSpec's optional fields (q_rows, k_rows, transposed, q/k_bias/scale)."""
        spec = AttentionSpec(
            name, n_heads, n_kv_heads or n_heads, head_dim, q_weight, k_weight, **layout
        )
        self.discovery.attention = [a for a in self.discovery.attention if a.name != name]
        self.discovery.attention.append(spec)
        self._snapshots.pop(name, None)
        return spec

    def register_router(
        self,
        name: str,
        module: nn.Module,
        n_experts: int,
        top_k: int | None = None,
        *,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        scoring: Literal["softmax", "sigmoid"] = "softmax",
    ) -> RouterSpec:
        """Declare a router: ``module`` outputs its logits (..., n_experts), alone or first in a
        tuple; ``weight`` defaults to ``module.weight``; ``scoring``: see ``RouterSpec``."""
        weight = tensor_attr(module, "weight") if weight is None else weight
        spec = RouterSpec(name, module, weight, n_experts, top_k, bias, scoring)
        self.discovery.routers = [r for r in self.discovery.routers if r.name != name]
        self.discovery.routers.append(spec)
        if self.participating:
            self._observed.hook_router(spec)
        return spec

    def attention_modules(self) -> dict[str, nn.Module]:
        """{name: module} of the discovered (or registered) attention layers in the model."""
        modules = dict(named_modules(self.model))
        return {a.name: modules[a.name] for a in self.discovery.attention if a.name in modules}

    def signature(self) -> dict[str, Any] | None:
        """The model's architecture signature (``producers.signature``): the detectors choose
        a calibrated profile by it. None when it cannot be read (never raises)."""
        d = self.discovery
        return signature_or_none(self.model, d.attention, d.routers, self.attention_modules)
