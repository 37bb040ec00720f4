"""Megatron-core: ``linear_qkv`` attention, multi-latent attention and the ``TopKRouter``.

Recognised by class (a ``megatron.`` module in the class's MRO), never by importing Megatron.

* ``SelfAttention.linear_qkv`` (a ColumnParallelLinear, stored (out, in)) holds this rank's
  partition: G_p = ``num_query_groups_per_partition`` groups of r = H_p / G_p query heads, each
  group laid out [q_1 … q_r, (gate_1 … gate_r,) k, v] with d_h = ``hidden_size_per_attention_
  head`` rows per head (the gate with ``config.attention_output_gate``). Group g's width is
  W = (r·(1 + gate) + 2)·d_h, query j of group g starts at g·W + j·d_h, its key at
  g·W + r·(1 + gate)·d_h. Under TP ≤ G each rank's shard holds whole groups, laid out alike:
  the spec describes the partition, and in a group the Monitor gathers the partitions whole to
  the layer's owner (``collective``: the weight is ``tensor_model_parallel`` along dim 0),
  which reads TP·H_p = H heads in TP·G_p = G groups. Under TP > G a group is split over TP/G
  ranks and each rank rebuilds its heads from an all-gather of the activations (its shard need
  not hold its key head): the partition is no layer, so it is reported in ``skipped``.
* QK-norm: ``q_layernorm``/``k_layernorm`` normalise each head (d_h wide); the scale g is
  folded, W_q^h diag(g). RMSNorm only rescales each (token, head) row: exact. A LayerNorm also
  centres it: approximate, and said so.
* MLA (``MLASelfAttention``): ``linear_q_proj`` or ``linear_q_down_proj`` → ``q_layernorm`` →
  ``linear_q_up_proj``, and ``linear_kv_down_proj`` → ``kv_layernorm`` → ``linear_kv_up_proj``;
  the content score q_nope·k_nope from x through both latents (``layouts.LatentPath``), heads
  of ``qk_head_dim`` among (qk_head_dim + qk_pos_emb_head_dim) query rows and
  (qk_head_dim + v_head_dim) key/value rows per head.
* ``TopKRouter``: E = ``config.num_moe_experts`` (the global count: under expert parallelism
  the experts module holds only E / EP), k = ``config.moe_router_topk``, scoring
  ``config.moe_router_score_function``. Its forward returns (probs, routing_map): probs are
  the sparse top-k weights, not logits. The logits are what ``gating(input)`` returns; a
  ``tap.RouterTap`` hands them on with ``routing_map`` (after expert bias and token dropping)
  as the selection.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..layouts import AttentionSpec, LatentPath, RouterSpec, head_rows
from ..module_attrs import int_attr
from .tap import router_tap

__all__ = ["find"]

Found = AttentionSpec | RouterSpec | str


def _is_megatron(module: nn.Module) -> bool:
    return any(cls.__module__.startswith("megatron.") for cls in type(module).__mro__)


def _class_names(module: nn.Module) -> set[str]:
    return {cls.__name__ for cls in type(module).__mro__}


def _param(module: object, name: str = "weight") -> torch.Tensor | None:
    value = getattr(module, name, None) if module is not None else None
    return value if isinstance(value, torch.Tensor) else None


def _norm_scale(module: object) -> torch.Tensor | None:
    """A norm's scale g; None for None/IdentityOp/L2 norms (nothing to fold)."""
    return _param(module)


def _centring(config: object, *norms: nn.Module | None) -> bool:
    """True when a present norm mean-centres (LayerNorm), rather than only rescaling (RMS)."""
    present = [n for n in norms if n is not None and _param(n) is not None]
    if not present:
        return False
    if getattr(config, "normalization", "LayerNorm") == "RMSNorm":
        return False
    return not all("RMSNorm" in type(n).__name__ for n in present)


def _linear_qkv_spec(name: str, module: nn.Module) -> Found:
    config: Any = module.config  # Megatron's TransformerConfig (Megatron is never imported)
    proj = module.linear_qkv
    weight = _param(proj)
    tp = int(getattr(module, "world_size", 1) or 1)
    groups_total = config.num_query_groups or config.num_attention_heads
    if groups_total < tp:
        return (
            f"{name}: linear_qkv under TP={tp} > {groups_total} query groups: a rank's shard "
            "splits a group (its key head may live on another rank's shard): no layer of whole "
            "heads to gather; not measured"
        )
    heads = int_attr(module, "num_attention_heads_per_partition")
    groups = int_attr(module, "num_query_groups_per_partition")
    head_dim = int_attr(module, "hidden_size_per_attention_head")
    if weight is None or weight.dim() != 2:
        return f"{name}: linear_qkv without a 2-D weight"
    per_group = heads // groups
    gated = per_group if getattr(config, "attention_output_gate", False) else 0
    width = (per_group + gated + 2) * head_dim  # one group's rows
    if weight.shape[0] != groups * width:
        return (
            f"{name}: linear_qkv has {weight.shape[0]} rows, not {groups} groups × "
            f"({per_group} q{f' + {gated} gate' if gated else ''} + k + v) × {head_dim}"
        )
    block = torch.arange(groups) * width
    q_starts = (block.unsqueeze(1) + torch.arange(per_group) * head_dim).flatten()
    k_starts = block + (per_group + gated) * head_dim
    q_norm = getattr(module, "q_layernorm", None)
    k_norm = getattr(module, "k_layernorm", None)
    bias = _param(proj, "bias")
    return AttentionSpec(
        name,
        heads,
        groups,
        head_dim,
        weight,
        weight,
        q_rows=head_rows(q_starts, head_dim),
        k_rows=head_rows(k_starts, head_dim),
        q_bias=bias,
        k_bias=bias,
        q_scale=_norm_scale(q_norm),
        k_scale=_norm_scale(k_norm),
    )


def _mla_spec(name: str, module: nn.Module) -> Found:
    config: Any = module.config  # Megatron's TransformerConfig
    heads = int_attr(module, "num_attention_heads_per_partition")
    nope, rope = config.qk_head_dim, config.qk_pos_emb_head_dim
    v_dim, kv_rank = config.v_head_dim, config.kv_lora_rank
    q_up = getattr(module, "linear_q_up_proj", None) or getattr(module, "linear_q_proj", None)
    kv_down = getattr(module, "linear_kv_down_proj", None)
    kv_up = getattr(module, "linear_kv_up_proj", None)
    q_up_weight, kv_down_weight, kv_up_weight = _param(q_up), _param(kv_down), _param(kv_up)
    if q_up_weight is None or kv_down_weight is None or kv_up_weight is None:
        return f"{name}: MLA without q/kv projection weights"
    if kv_down_weight.shape[0] != kv_rank + rope:
        return (
            f"{name}: linear_kv_down_proj has {kv_down_weight.shape[0]} rows, not kv_lora_rank "
            f"+ qk_pos_emb_head_dim = {kv_rank + rope} (sharded along its output?)"
        )
    q_latent = None
    q_down = getattr(module, "linear_q_down_proj", None)
    q_down_weight = _param(q_down)
    if q_down_weight is not None:
        # TE fuses the latent's norm into the up-projection (layer_norm_weight)
        q_scale = _param(q_up, "layer_norm_weight")
        if q_scale is None:
            q_scale = _norm_scale(getattr(module, "q_layernorm", None))
        q_latent = LatentPath(q_down_weight, scale=q_scale, bias=_param(q_down, "bias"))
    kv_scale = _param(kv_up, "layer_norm_weight")
    if kv_scale is None:
        kv_scale = _norm_scale(getattr(module, "kv_layernorm", None))
    k_latent = LatentPath(
        kv_down_weight, rows=slice(0, kv_rank), scale=kv_scale, bias=_param(kv_down, "bias")
    )
    return AttentionSpec(
        name,
        heads,
        heads,
        nope,
        q_up_weight,
        kv_up_weight,
        q_rows=head_rows(torch.arange(heads) * (nope + rope), nope),
        k_rows=head_rows(torch.arange(heads) * (nope + v_dim), nope),
        q_bias=_param(q_up, "bias"),
        k_bias=_param(kv_up, "bias"),
        q_latent=q_latent,
        k_latent=k_latent,
    )


def _routing_map(output: object) -> torch.Tensor | None:
    """``TopKRouter.forward`` returns (probs, routing_map); the map is (tokens, E) boolean."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], torch.Tensor):
        return output[1]
    return None


def _router_spec(name: str, module: nn.Module) -> Found:
    config: Any = module.config  # Megatron's TransformerConfig
    n_experts = config.num_moe_experts
    weight = _param(module)
    if weight is None or weight.dim() != 2 or weight.shape[0] != n_experts:
        shape = None if weight is None else tuple(weight.shape)
        return f"{name}: TopKRouter weight {shape} is not (num_moe_experts={n_experts}, d)"
    score = str(getattr(config, "moe_router_score_function", "softmax")).lower()
    return RouterSpec(
        name,
        router_tap(module, "gating", _routing_map),
        weight,
        n_experts,
        getattr(config, "moe_router_topk", None),
        bias=_param(module, "bias"),
        scoring="sigmoid" if "sigmoid" in score else "softmax",
    )


def find(name: str, module: nn.Module) -> list[Found] | None:
    """What ``module`` is, if it is a Megatron-core module; None if it is not one.

    An empty list: a Megatron module with nothing to monitor (its parts are visited on their
    own), so that the generic rules don't read it a second time (an ``MoELayer`` has
    ``experts`` and a router child, which the generic rule would read as a plain gate).
    """
    if not _is_megatron(module):
        return None
    names = _class_names(module)
    found: list[Found] = []
    if "TopKRouter" in names or ("Router" in names and callable(getattr(module, "gating", None))):
        found.append(_router_spec(name, module))
    elif isinstance(getattr(module, "linear_kv_down_proj", None), nn.Module):
        found.append(_mla_spec(name, module))
    elif isinstance(getattr(module, "linear_qkv", None), nn.Module):
        spec = _linear_qkv_spec(name, module)
        found.append(spec)
        config: Any = module.config  # Megatron's TransformerConfig
        q_norm, k_norm = getattr(module, "q_layernorm", None), getattr(module, "k_layernorm", None)
        if isinstance(spec, AttentionSpec) and _centring(config, q_norm, k_norm):
            found.append(
                f"{name}: q_layernorm is a centring norm (LayerNorm); only its scale is "
                "folded, the mean-centring and bias are not (approximate)"
            )
    return found
