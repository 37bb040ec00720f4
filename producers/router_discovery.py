"""Find an MoE layer's router from its module structure.

A router is a child of a module with ``experts`` whose 2-D ``weight`` has one row per expert
(E ≥ 2): an nn.Linear gate or any router module with a ``weight`` (transformers'
``*TopKRouter``). E comes from the experts container (an attribute, its length, or a stacked
3-D weight); ``top_k`` from the gate, its parent or their ``config``; scoring is sigmoid where
the router says so (``e_score_correction_bias``, a ``score_func``/``scoring_func`` of
"sigmoid"), else softmax. A gate with one output (Qwen2-MoE's shared-expert gate) or a child
named ``shared…`` is not a router. Why by shape and not by class: every MoE code base names
its router differently, but each has exactly one matrix mapping a token to E expert scores.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .layouts import RouterSpec
from .module_attrs import config_int as _attr

__all__ = ["router_spec"]

_TOP_K = (
    "top_k",
    "num_experts_per_tok",
    "topk",
    "k",
    "num_selected_experts",
    "moe_router_topk",
    "n_expert_per_token",
)
_N_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "n_experts", "n_expert")
_SCORING = ("score_func", "scoring_func", "score_function", "moe_router_score_function")


def _expert_count(module: nn.Module, experts: object) -> int | None:
    """E from the experts container: an attribute, its length, or a stacked 3-D weight."""
    for source in (experts, module):
        if isinstance(source, nn.Module) and (count := _attr(source, _N_EXPERTS)):
            return count
    if isinstance(experts, nn.ModuleList | nn.ModuleDict | nn.Sequential):
        return len(experts)
    if isinstance(experts, nn.Module):
        stacked = [p.shape[0] for p in experts.parameters(recurse=False) if p.dim() == 3]
        if stacked and len(set(stacked)) == 1:
            return stacked[0]
    return None


def _scoring(*sources: nn.Module) -> Literal["softmax", "sigmoid"]:
    """ "sigmoid" where a router or its config says so, else "softmax"."""
    for source in sources:
        if isinstance(getattr(source, "e_score_correction_bias", None), torch.Tensor):
            return "sigmoid"
        for holder in (source, getattr(source, "config", None)):
            for attr in _SCORING:
                value = getattr(holder, attr, None) if holder is not None else None
                if isinstance(value, str) and "sigmoid" in value.lower():
                    return "sigmoid"
    return "softmax"


def _router_bias(gate: nn.Module, n_experts: int) -> torch.Tensor | None:
    bias = getattr(gate, "bias", None)
    if isinstance(bias, torch.Tensor) and tuple(bias.shape) == (n_experts,):
        return bias
    return None


def router_spec(name: str, module: nn.Module) -> RouterSpec | str | None:
    """A child with one weight row per expert, beside ``experts`` (see the module docstring)."""
    experts = getattr(module, "experts", None)
    if experts is None:
        return None
    n_experts = _expert_count(module, experts)
    prefix = f"{name}." if name else ""
    named = ("gate", "router")
    candidates = []
    for child_name, child in module.named_children():
        if child is experts or "shared" in child_name:
            continue
        weight = getattr(child, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] < 2:
            continue
        if (n_experts is None and child_name in named) or weight.shape[0] == n_experts:
            candidates.append((child_name not in named, child_name, child, weight))
    if not candidates:
        children = dict(module.named_children())  # not aliases: those are reported where they live
        for gate_name in named:
            if isinstance(children.get(gate_name), nn.Module):
                return (
                    f"{prefix}{gate_name}: no 2-D weight with one row per expert "
                    f"({n_experts} experts); register it with Monitor.register_router"
                )
        return None
    _, gate_name, gate, weight = min(candidates, key=lambda c: c[:2])
    count = weight.shape[0]
    top_k = _attr(gate, _TOP_K) or _attr(module, _TOP_K)
    if top_k is not None and top_k > count:
        return f"{prefix}{gate_name}: top_k={top_k} exceeds its {count} experts"
    return RouterSpec(
        f"{prefix}{gate_name}",
        gate,
        weight,
        count,
        top_k,
        bias=_router_bias(gate, count),
        scoring=_scoring(gate, module),
    )
