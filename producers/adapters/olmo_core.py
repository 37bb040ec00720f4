"""OLMo-core: ``Attention`` (``w_q``/``w_k``) and the ``MoELinearRouter``.

Recognised by class (an ``olmo_core.`` module in the class's MRO), never by importing OLMo-core.

* ``Attention``: separate nn.Linear ``w_q`` (H·d_h, d) and ``w_k`` (H_kv·d_h, d), with
  ``n_heads``, ``n_kv_heads``, ``head_dim``. QK-norm: by default over the whole projection
  (``q_norm`` of width H·d_h: RMS over all heads of a token, one scalar per token), with
  ``use_head_qk_norm`` per head (a scale of d_h, or (H, d_h) with per-head gains). Either way
  the scale g reshaped to (heads, d_h) is folded, W_q^h diag(g^h); an RMS norm only rescales
  a token's row: exact. OLMo-core's ``LayerNorm`` also centres: approximate, and said so.
  ``clip_qkv`` clamps q and k: exact only while nothing is clipped, and said so.
* ``MoELinearRouter``: its weight is one flat parameter of E·d (flat so that FSDP can shard it
  over many ranks); the logits are z = x Wᵀ with W = weight.view(E, d), returned by
  ``get_expert_logits``. Its forward returns (top-k weights, expert_indices,
  batch_size_per_expert, aux_loss): no logits. A ``tap.RouterTap`` hands on the logits with
  ``expert_indices`` (after any score bias) as the selection. The spec holds the flat
  parameter itself (so that it is followed live, and gathered whole when sharded);
  ``RouterSpec.matrix()`` views it as (E, d) at every read.
* An ``MoETransformerBlock`` exposes ``router``/``experts``/``shared_mlp`` as properties of its
  ``feed_forward_moe``: aliases, not modules of their own, and never read twice.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layouts import AttentionSpec, RouterSpec
from ..module_attrs import int_attr
from .tap import router_tap

__all__ = ["find"]

Found = AttentionSpec | RouterSpec | str


def _is_olmo_core(module: nn.Module) -> bool:
    return any(cls.__module__.startswith("olmo_core.") for cls in type(module).__mro__)


def _class_names(module: object) -> set[str]:
    return {cls.__name__ for cls in type(module).__mro__}


def _param(module: object, name: str = "weight") -> torch.Tensor | None:
    value = getattr(module, name, None) if module is not None else None
    return value if isinstance(value, torch.Tensor) else None


def _attention_spec(name: str, module: nn.Module) -> Found:
    q, k = module.w_q, module.w_k
    q_weight, k_weight = _param(q), _param(k)
    if q_weight is None or k_weight is None:
        return f"{name}: w_q/w_k without weights"
    return AttentionSpec(
        name,
        int_attr(module, "n_heads"),
        int_attr(module, "n_kv_heads"),
        int_attr(module, "head_dim"),
        q_weight,
        k_weight,
        q_bias=_param(q, "bias"),
        k_bias=_param(k, "bias"),
        q_scale=_param(getattr(module, "q_norm", None)),
        k_scale=_param(getattr(module, "k_norm", None)),
    )


def _attention_notes(name: str, module: nn.Module) -> list[str]:
    notes = []
    norms = [getattr(module, n, None) for n in ("q_norm", "k_norm")]
    if any(n is not None and "RMSNorm" not in _class_names(n) for n in norms):
        notes.append(
            f"{name}: q_norm is a centring norm (LayerNorm); only its scale is folded, the "
            "mean-centring and bias are not (approximate)"
        )
    if getattr(module, "clip_qkv", None) is not None:
        notes.append(f"{name}: clip_qkv clamps q and k; exact only while nothing is clipped")
    return notes


def _expert_indices(output: object) -> torch.Tensor | None:
    """``MoERouter.forward`` returns (weights, expert_indices (…, k), batch sizes, aux loss)."""
    if isinstance(output, tuple) and len(output) >= 2 and isinstance(output[1], torch.Tensor):
        return output[1]
    return None


def _router_spec(name: str, module: nn.Module) -> Found:
    n_experts, d_model = int_attr(module, "num_experts"), int_attr(module, "d_model")
    weight = _param(module)
    if weight is None or weight.numel() != n_experts * d_model:
        return f"{name}: router weight is not E·d = {n_experts}·{d_model} values"
    gating = str(getattr(module, "gating_function", "softmax")).lower()
    return RouterSpec(
        name,
        router_tap(module, "get_expert_logits", _expert_indices),
        weight,
        n_experts,
        getattr(module, "top_k", None),
        scoring="sigmoid" if "sigmoid" in gating else "softmax",
    )


def find(name: str, module: nn.Module) -> list[Found] | None:
    """What ``module`` is, if it is an OLMo-core module; None if it is not one.

    An empty list for OLMo-core modules with nothing of their own to monitor (the MoE and the
    block, whose ``router``/``experts`` the generic rule would otherwise visit once per alias).
    """
    if not _is_olmo_core(module):
        return None
    if callable(getattr(module, "get_expert_logits", None)) and hasattr(module, "num_experts"):
        return [_router_spec(name, module)]
    if isinstance(getattr(module, "w_q", None), nn.Module) and isinstance(
        getattr(module, "w_k", None), nn.Module
    ):
        spec = _attention_spec(name, module)
        return [spec, *(_attention_notes(name, module) if isinstance(spec, AttentionSpec) else [])]
    return []
