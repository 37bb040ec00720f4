"""Find attention Q/K projections and MoE routers in a model from its module structure.

Recognised layouts (by child names, the conventions of the common code bases):

* fused qkv, contiguous [q | k | v] blocks: ``c_attn`` (nanoGPT nn.Linear, GPT-2 Conv1D stored
  (in, out)) and ``qkv_proj`` (GQA sizes H·d_h + 2·H_kv·d_h allowed);
* separate projections: ``q_proj``/``k_proj`` (Llama, Mistral, Qwen), ``wq``/``wk``,
  ``query``/``key``, ``to_q``/``to_k``;
* QK-norm scales: ``q_norm``/``k_norm``, ``q_layernorm``/``k_layernorm``, ``q_ln``/``k_ln``;
* routers: an nn.Linear child ``gate`` or ``router`` beside an ``experts`` container
  (Mixtral's ``block_sparse_moe``, Qwen-MoE, most MoE code).

Head counts come from the attention module's attributes or its ``config``. Whatever is found
but can't be read is reported in ``Discovery.skipped`` with the reason, so that the user can
register it explicitly; nothing is guessed silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .layouts import AttentionSpec, RouterSpec, linear_out_in

__all__ = ["Discovery", "discover"]

_FUSED = ("c_attn", "qkv_proj")
_SEPARATE = (("q_proj", "k_proj"), ("wq", "wk"), ("query", "key"), ("to_q", "to_k"))
_QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("q_ln", "k_ln"))
_HEADS = ("num_heads", "n_head", "n_heads", "num_attention_heads")
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head")
_TOP_K = ("top_k", "num_experts_per_tok", "topk", "k", "num_selected_experts")


@dataclass
class Discovery:
    """What :func:`discover` found, and what it saw but could not use (with reasons)."""

    attention: list[AttentionSpec] = field(default_factory=list)
    routers: list[RouterSpec] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """A human-readable account, e.g. for the start of a training log."""
        lines = [f"attention layers: {len(self.attention)}, routers: {len(self.routers)}"]
        lines += [
            f"  attention {a.name}: {a.n_heads} heads ({a.n_kv_heads} kv) × {a.head_dim}"
            for a in self.attention
        ]
        lines += [
            f"  router {r.name}: {r.n_experts} experts, top_k={r.top_k}" for r in self.routers
        ]
        lines += [f"  skipped: {s}" for s in self.skipped]
        if not self.attention and not self.routers:
            lines.append(
                "  nothing recognised: register layers with Monitor.register_attention / "
                "register_router (see README, 'Explicit registration')"
            )
        return "\n".join(lines)


def _attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    config = getattr(module, "config", None)
    for source in (module, config):
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _weight_of(module: nn.Module) -> tuple[torch.Tensor, bool] | None:
    """(weight, transposed) of a projection: nn.Linear, or GPT-2's Conv1D (in, out)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    return weight, type(module).__name__ == "Conv1D"


def _qk_scales(module: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    for q_name, k_name in _QK_NORMS:
        q_norm, k_norm = getattr(module, q_name, None), getattr(module, k_name, None)
        if isinstance(q_norm, nn.Module) and isinstance(k_norm, nn.Module):
            return getattr(q_norm, "weight", None), getattr(k_norm, "weight", None)
    return None, None


def _bias(module: nn.Module) -> torch.Tensor | None:
    """The projection's bias parameter itself (AttentionSpec slices it when read)."""
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


def _fused_spec(name: str, module: nn.Module, proj: nn.Module) -> AttentionSpec | str:
    found = _weight_of(proj)
    heads = _attr(module, _HEADS)
    if found is None or heads is None:
        return f"{name}: fused qkv projection without a 2-D weight or a head-count attribute"
    weight, transposed = found
    out_features = linear_out_in(weight, transposed).shape[0]
    kv_heads = _attr(module, _KV_HEADS) or heads
    head_dim = _attr(module, ("head_dim",)) or out_features // (heads + 2 * kv_heads)
    q_end = heads * head_dim
    k_end = q_end + kv_heads * head_dim
    if out_features != k_end + kv_heads * head_dim:
        return f"{name}: fused qkv has {out_features} outputs, not (H + 2·H_kv)·d_h"
    q_scale, k_scale = _qk_scales(module)
    return AttentionSpec(
        name, heads, kv_heads, head_dim, weight, weight,
        q_rows=slice(0, q_end), k_rows=slice(q_end, k_end), transposed=transposed,
        q_bias=_bias(proj), k_bias=_bias(proj),
        q_scale=q_scale, k_scale=k_scale,
    )  # fmt: skip


def _separate_spec(name: str, module: nn.Module, q: nn.Module, k: nn.Module) -> AttentionSpec | str:
    q_found, k_found = _weight_of(q), _weight_of(k)
    heads = _attr(module, _HEADS)
    if q_found is None or k_found is None or heads is None:
        return f"{name}: q/k projections without 2-D weights or a head-count attribute"
    q_out = linear_out_in(*q_found).shape[0]
    k_out = linear_out_in(*k_found).shape[0]
    head_dim = _attr(module, ("head_dim",)) or q_out // heads
    kv_heads = _attr(module, _KV_HEADS) or k_out // head_dim
    q_scale, k_scale = _qk_scales(module)
    if q_found[1] != k_found[1]:
        return f"{name}: q and k projections are stored in different orders"
    return AttentionSpec(
        name, heads, kv_heads, head_dim, q_found[0], k_found[0], transposed=q_found[1],
        q_bias=_bias(q), k_bias=_bias(k),
        q_scale=q_scale, k_scale=k_scale,
    )  # fmt: skip


def _attention_spec(name: str, module: nn.Module) -> AttentionSpec | str | None:
    for fused in _FUSED:
        proj = getattr(module, fused, None)
        if isinstance(proj, nn.Module):
            return _fused_spec(name, module, proj)
    for q_name, k_name in _SEPARATE:
        q, k = getattr(module, q_name, None), getattr(module, k_name, None)
        if isinstance(q, nn.Module) and isinstance(k, nn.Module):
            return _separate_spec(name, module, q, k)
    return None


def _router_spec(name: str, module: nn.Module) -> RouterSpec | str | None:
    experts = getattr(module, "experts", None)
    if experts is None:
        return None
    for gate_name in ("gate", "router"):
        gate = getattr(module, gate_name, None)
        if isinstance(gate, nn.Linear):
            n_experts = gate.out_features
            if hasattr(experts, "__len__") and len(experts) != n_experts:
                return f"{name}: {gate_name} has {n_experts} outputs but {len(experts)} experts"
            prefix = f"{name}." if name else ""
            return RouterSpec(
                f"{prefix}{gate_name}", gate, gate.weight, n_experts, _attr(module, _TOP_K)
            )
        if isinstance(gate, nn.Module):
            return f"{name}: router '{gate_name}' is not an nn.Linear; register its logits"
    return None


def _centring_norm_note(name: str, module: nn.Module) -> str | None:
    for q_name, _ in _QK_NORMS:
        norm = getattr(module, q_name, None)
        if isinstance(norm, nn.LayerNorm | nn.GroupNorm):
            kind = type(norm).__name__
            return (
                f"{name}: {q_name} is a centring norm ({kind}); only its scale is folded, "
                "the mean-centring and bias are not (approximate)"
            )
    return None


def discover(model: nn.Module) -> Discovery:
    """Walk ``model.named_modules()`` and collect every recognised attention layer and router.

    Head counts, GQA and top-k are read from the modules' attributes (``n_head``,
    ``num_key_value_heads``, ``top_k`` …) or their ``config``.
    """
    found = Discovery()
    for name, module in model.named_modules():
        for find in (_attention_spec, _router_spec):
            try:
                spec = find(name, module)
            except ValueError as exc:  # shapes that contradict the attributes
                spec = str(exc)
            if isinstance(spec, str):
                found.skipped.append(spec)
            elif isinstance(spec, AttentionSpec):
                found.attention.append(spec)
                note = _centring_norm_note(name, module)
                if note:
                    found.skipped.append(note)
            elif isinstance(spec, RouterSpec):
                if spec.top_k is None:
                    found.skipped.append(
                        f"{spec.name}: no top_k attribute; expert-load metrics are off"
                    )
                found.routers.append(spec)
    return found
