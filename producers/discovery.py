"""Find attention Q/K projections and MoE routers in a model from its module structure.

Recognised layouts (by child names and attributes, the conventions of the common code bases):

* fused qkv, contiguous [q | k | v] blocks: ``c_attn`` (nanoGPT nn.Linear, GPT-2 Conv1D stored
  (in, out)), ``qkv_proj`` (Phi-3) and ``qkv`` (litgpt); GQA sizes H·d_h + 2·H_kv·d_h allowed;
* fused ``query_key_value``: per-head interleaved [q k v] (GPT-NeoX/Pythia, Bloom, Falcon
  without ``multi_query``), [q heads | k | v] (Falcon ``multi_query``), or per group of query
  heads [q… k v] (Falcon ``new_decoder_architecture``);
* separate projections: ``q_proj``/``k_proj`` (Llama, Mistral, Qwen, GPT-OSS), ``wq``/``wk``,
  ``query``/``key``, ``to_q``/``to_k``;
* multi-head latent attention (DeepSeek-V2/V3, Kimi): ``kv_a_proj_with_mqa``/``kv_b_proj``
  with ``q_proj`` or ``q_a_proj``/``q_b_proj``; the no-RoPE (content) part of the score is
  monitored through the latents (``layouts.LatentPath``);
* QK-norm scales: ``q_norm``/``k_norm``, ``q_layernorm``/``k_layernorm``, ``q_ln``/``k_ln``,
  ``norm_q``/``norm_k``;
* routers: a child of a module with ``experts`` whose 2-D ``weight`` has one row per expert
  (E ≥ 2) — an nn.Linear gate or any router module with a ``weight`` (transformers'
  ``*TopKRouter``), with ``top_k`` from it, its parent or their ``config``; sigmoid scoring
  where it says so (``e_score_correction_bias``, a ``score_func``/``scoring_func`` of
  "sigmoid"). A gate with one output (Qwen2-MoE's shared-expert gate) is not a router
  (``router_discovery``).

Framework modules the rules above can't read go to their adapters (``adapters``): Megatron-
core (``linear_qkv`` per group [q… k v] with per-partition counts, MLA, the ``TopKRouter``'s
logits from its ``gating``) and OLMo-core (``w_q``/``w_k``, the flat ``MoELinearRouter``'s
logits from ``get_expert_logits``); a module claimed by an adapter is not read again here.

Head counts come from the attention module's attributes or its ``config``. Whatever is found
but can't be read is reported in ``Discovery.skipped`` with the reason, so that the user can
register it explicitly; nothing is guessed silently. A module reachable under two names (an
alias property) is reported once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .adapters import FINDERS
from .layouts import (
    QK_NORM_PAIRS,
    AttentionSpec,
    LatentPath,
    RouterSpec,
    head_rows,
    linear_out_in,
)
from .module_attrs import config_int as _attr
from .module_attrs import submodule, tensor_attr
from .names import named_modules
from .router_discovery import router_spec

__all__ = ["ATTENTION_LAYOUTS", "Discovery", "discover"]

_FUSED = ("c_attn", "qkv_proj", "qkv")
_SEPARATE = (("q_proj", "k_proj"), ("wq", "wk"), ("query", "key"), ("to_q", "to_k"))
_QK_NORMS = QK_NORM_PAIRS
_HEADS = ("num_heads", "n_head", "n_heads", "num_attention_heads")
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head", "n_query_groups")
_HEAD_DIM = ("head_dim", "head_size")


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


def _fused_weight(
    name: str, module: nn.Module, proj: nn.Module
) -> tuple[torch.Tensor, bool, int, int] | str:
    """(weight, transposed, out_features, heads) of a fused projection, or why not."""
    found = _weight_of(proj)
    heads = _attr(module, _HEADS)
    if found is None or heads is None:
        return f"{name}: fused qkv projection without a 2-D weight or a head-count attribute"
    weight, transposed = found
    return weight, transposed, linear_out_in(weight, transposed).shape[0], heads


def _fused_spec(
    name: str, module: nn.Module, proj: nn.Module, kv_heads: int | None = None
) -> AttentionSpec | str:
    fused = _fused_weight(name, module, proj)
    if isinstance(fused, str):
        return fused
    weight, transposed, out_features, heads = fused
    kv_heads = kv_heads or _attr(module, _KV_HEADS) or heads
    head_dim = _attr(module, _HEAD_DIM) or out_features // (heads + 2 * kv_heads)
    q_end = heads * head_dim
    k_end = q_end + kv_heads * head_dim
    if out_features != k_end + kv_heads * head_dim:
        return f"{name}: fused qkv has {out_features} outputs, not (H + 2·H_kv)·d_h"
    q_scale, k_scale = _qk_scales(module)
    return AttentionSpec(
        name,
        heads,
        kv_heads,
        head_dim,
        weight,
        weight,
        q_rows=slice(0, q_end),
        k_rows=slice(q_end, k_end),
        transposed=transposed,
        q_bias=_bias(proj),
        k_bias=_bias(proj),
        q_scale=q_scale,
        k_scale=k_scale,
    )


def _separate_spec(name: str, module: nn.Module, q: nn.Module, k: nn.Module) -> AttentionSpec | str:
    q_found, k_found = _weight_of(q), _weight_of(k)
    heads = _attr(module, _HEADS)
    if q_found is None or k_found is None or heads is None:
        return f"{name}: q/k projections without 2-D weights or a head-count attribute"
    q_out = linear_out_in(*q_found).shape[0]
    k_out = linear_out_in(*k_found).shape[0]
    head_dim = _attr(module, _HEAD_DIM) or q_out // heads
    kv_heads = _attr(module, _KV_HEADS) or k_out // head_dim
    q_scale, k_scale = _qk_scales(module)
    if q_found[1] != k_found[1]:
        return f"{name}: q and k projections are stored in different orders"
    return AttentionSpec(
        name,
        heads,
        kv_heads,
        head_dim,
        q_found[0],
        k_found[0],
        transposed=q_found[1],
        q_bias=_bias(q),
        k_bias=_bias(k),
        q_scale=q_scale,
        k_scale=k_scale,
    )


def _query_key_value_spec(name: str, module: nn.Module, proj: nn.Module) -> AttentionSpec | str:
    """GPT-NeoX / Bloom / Falcon ``query_key_value``: the layout follows the module's flags."""
    fused = _fused_weight(name, module, proj)
    if isinstance(fused, str):
        return fused
    weight, transposed, out_features, heads = fused
    if getattr(module, "new_decoder_architecture", False):  # groups of [q_1 … q_r, k, v]
        groups = _attr(module, ("num_kv_heads", *_KV_HEADS)) or heads
        head_dim = out_features // (heads + 2 * groups)
        per_group = heads // groups
        block = torch.arange(groups) * (per_group + 2) * head_dim
        q_starts = (block.unsqueeze(1) + torch.arange(per_group) * head_dim).flatten()
        q_rows = head_rows(q_starts, head_dim)
        k_rows = head_rows(block + per_group * head_dim, head_dim)
        kv_heads = groups
    elif getattr(module, "multi_query", False):  # [q heads | k | v]: contiguous, one kv head
        return _fused_spec(name, module, proj, kv_heads=1)
    else:  # per head [q k v] (GPT-NeoX, Bloom, Falcon-RW)
        head_dim = out_features // (3 * heads)
        starts = torch.arange(heads) * 3 * head_dim
        q_rows, k_rows = head_rows(starts, head_dim), head_rows(starts + head_dim, head_dim)
        kv_heads = heads
    if q_rows.numel() + 2 * k_rows.numel() != out_features:
        return f"{name}: query_key_value has {out_features} outputs, not (H + 2·H_kv)·d_h"
    q_scale, k_scale = _qk_scales(module)
    return AttentionSpec(
        name,
        heads,
        kv_heads,
        head_dim,
        weight,
        weight,
        q_rows=q_rows,
        k_rows=k_rows,
        transposed=transposed,
        q_bias=_bias(proj),
        k_bias=_bias(proj),
        q_scale=q_scale,
        k_scale=k_scale,
    )


def _mla_spec(name: str, module: nn.Module) -> AttentionSpec | str:
    """Multi-head latent attention: the content (no-RoPE) score q_nope · k_nope from x.

    Per head h, q_nope^h = RMSNorm_q(x W_qa) W_qb^h (or x W_q^h without a query latent) and
    k_nope^h = RMSNorm_kv(x W_kva[:r_kv]) W_kvb^h; the rotary part (q_rope · k_rope, k_rope
    shared by all heads) is position-dependent and not part of the monitored form."""
    heads = _attr(module, _HEADS)
    nope = _attr(module, ("qk_nope_head_dim",))
    rope = _attr(module, ("qk_rope_head_dim",))
    v_dim = _attr(module, ("v_head_dim",))
    kv_rank = _attr(module, ("kv_lora_rank",))
    if heads is None or nope is None or rope is None or v_dim is None or kv_rank is None:
        return f"{name}: MLA without head counts and qk_nope/qk_rope/v/kv_lora dims"
    q_b = getattr(module, "q_b_proj", None)
    q_up = q_b if isinstance(q_b, nn.Module) else getattr(module, "q_proj", None)
    if not isinstance(q_up, nn.Module):
        return f"{name}: MLA without q_proj or q_b_proj"
    q_latent = None
    if isinstance(q_b, nn.Module):
        q_down = submodule(module, "q_a_proj")
        q_norm = _norm_weight(getattr(module, "q_a_layernorm", None))
        q_latent = LatentPath(tensor_attr(q_down, "weight"), scale=q_norm, bias=_bias(q_down))
    # both modules: _attention_spec checked them before choosing this layout
    kv_down = submodule(module, "kv_a_proj_with_mqa")
    kv_up = submodule(module, "kv_b_proj")
    kv_norm = _norm_weight(getattr(module, "kv_a_layernorm", None))
    k_latent = LatentPath(
        tensor_attr(kv_down, "weight"), rows=slice(0, kv_rank), scale=kv_norm, bias=_bias(kv_down)
    )
    return AttentionSpec(
        name,
        heads,
        heads,
        nope,
        tensor_attr(q_up, "weight"),
        tensor_attr(kv_up, "weight"),
        q_rows=head_rows(torch.arange(heads) * (nope + rope), nope),
        k_rows=head_rows(torch.arange(heads) * (nope + v_dim), nope),
        q_bias=_bias(q_up),
        k_bias=_bias(kv_up),
        q_latent=q_latent,
        k_latent=k_latent,
    )


def _norm_weight(norm: nn.Module | None) -> torch.Tensor | None:
    weight = getattr(norm, "weight", None) if norm is not None else None
    return weight if isinstance(weight, torch.Tensor) else None


def _mla_layout(name: str, module: nn.Module) -> AttentionSpec | str | None:
    latent = [getattr(module, n, None) for n in ("kv_b_proj", "kv_a_proj_with_mqa")]
    return _mla_spec(name, module) if all(isinstance(m, nn.Module) for m in latent) else None


def _fused_layout(name: str, module: nn.Module) -> AttentionSpec | str | None:
    found = [p for f in _FUSED if isinstance(p := getattr(module, f, None), nn.Module)]
    return _fused_spec(name, module, found[0]) if found else None


def _query_key_value_layout(name: str, module: nn.Module) -> AttentionSpec | str | None:
    proj = getattr(module, "query_key_value", None)
    return _query_key_value_spec(name, module, proj) if isinstance(proj, nn.Module) else None


def _separate_layout(name: str, module: nn.Module) -> AttentionSpec | str | None:
    for q_name, k_name in _SEPARATE:
        q, k = getattr(module, q_name, None), getattr(module, k_name, None)
        if isinstance(q, nn.Module) and isinstance(k, nn.Module):
            return _separate_spec(name, module, q, k)
    return None


# The attention layouts discovery reads, tried in this order (the first that recognises a
# module decides: MLA also has a q projection, so it goes first): each returns the layer's
# spec, why it cannot be read (a string, listed as skipped), or None (not this layout). A new
# layout is one function here and its entry (docs/extending.md lists them; a test checks).
ATTENTION_LAYOUTS: dict[str, Callable[[str, nn.Module], AttentionSpec | str | None]] = {
    "latent (MLA)": _mla_layout,
    "fused qkv": _fused_layout,
    "interleaved query_key_value": _query_key_value_layout,
    "separate q/k": _separate_layout,
}


def _attention_spec(name: str, module: nn.Module) -> AttentionSpec | str | None:
    for layout in ATTENTION_LAYOUTS.values():
        found = layout(name, module)
        if found is not None:
            return found
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
    ``num_key_value_heads``, ``top_k`` …) or their ``config``; framework modules (Megatron-core,
    OLMo-core) are read by their adapters. Each module is visited once, and each finding (a
    spec by name, a skipped reason) is reported once.
    """
    found = Discovery()
    names: set[str] = set()
    for name, module in named_modules(model):  # as the author named them (see ``names``)
        for spec in _find(name, module):
            if isinstance(spec, str):
                if spec not in found.skipped:
                    found.skipped.append(spec)
                continue
            if spec.name in names:
                continue
            names.add(spec.name)
            if isinstance(spec, AttentionSpec):
                found.attention.append(spec)
            else:
                if spec.top_k is None:
                    found.skipped.append(
                        f"{spec.name}: no top_k attribute; expert-load metrics are off"
                    )
                found.routers.append(spec)
    return found


def _shared_expert_note(name: str) -> str | None:
    """Why a shared expert (Qwen2-MoE, DeepSeek) and its gate are not monitored: said, never
    silent. The experts are on for every token (nothing is routed), and Qwen2-MoE's
    ``shared_expert_gate`` is one sigmoid scalar per token, not a distribution over experts:
    none of the router statistics (token or load entropy, ε) is defined for it."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "shared_expert_gate":
        return f"{name}: a shared expert's gate (one sigmoid per token, no routing): not a router"
    if leaf in ("shared_expert", "shared_experts"):
        return f"{name}: shared expert(s), on for every token (nothing routed): no router metric"
    return None


def _find(name: str, module: nn.Module) -> list[AttentionSpec | RouterSpec | str]:
    """What one module holds: from its framework's adapter if it has one, else the rules."""
    for adapter in FINDERS:
        try:
            claimed = adapter(name, module)
        except (ValueError, AttributeError, TypeError) as exc:  # a layout we misread
            return [f"{name}: {type(module).__name__} not readable ({exc})"]
        if claimed is not None:
            return claimed
    if (note := _shared_expert_note(name)) is not None:
        return [note]
    found = []
    for find in (_attention_spec, router_spec):
        try:
            spec = find(name, module)
        except ValueError as exc:  # shapes that contradict the attributes
            spec = str(exc)
        if spec is not None:
            found.append(spec)
        if isinstance(spec, AttentionSpec) and (note := _centring_norm_note(name, module)):
            found.append(note)
    return found
