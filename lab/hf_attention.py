"""The lab's FlashAttention backward as a transformers attention function.

Registered in transformers' attention-function registry as ``foreshock-lab-fa`` and named as
the model's ``attn_implementation``, it is what the model's own attention layer calls after its
projections, QK-norms and rotary embeddings: so the ``fa-*`` faults live in the backward of the
model's own attention call, exactly where a low-precision kernel would put them, and the
gradient reaches the model's q/k/v projections (and norms) through its own code.

The layer that calls it carries the lab's two handles: ``lowp`` (the fault switch, read here)
and ``logit_observer`` (called with the step's largest pre-softmax logit).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .attention import flash_attention

__all__ = ["LAB_ATTENTION", "lab_attention", "register"]

LAB_ATTENTION = "foreshock-lab-fa"


def register() -> str:
    """Register :func:`lab_attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(LAB_ATTENTION, lab_attention)
    return LAB_ATTENTION


def lab_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over the lab's causal FlashAttention.

    query (B, H, T, d_qk), key (B, H_kv, T, d_qk), value (B, H_kv, T, d_v) → output
    (B, T, H, d_v). GQA: each key/value head serves H / H_kv query heads, as in the library's
    own path. MLA (DeepSeek) hands it d_qk = d_nope + d_rope ≠ d_v; the kernel needs no change
    for that: the scores S = α Q Kᵀ contract over d_qk, while O = P V and the backward's
    D = rowsum(dO ∘ O) live in d_v. Causal, no padding (the lab's batches are full windows);
    the scale must be the kernel's α = 1/√d_qk — a model with another (DeepSeek's YaRN mscale)
    is refused rather than trained with the wrong logits.
    """
    d_qk = query.shape[-1]
    if scaling is not None and abs(scaling * d_qk**0.5 - 1) > 1e-6:
        raise ValueError(f"{LAB_ATTENTION}: scale {scaling} is not 1/sqrt({d_qk})")
    if dropout:
        raise ValueError(f"{LAB_ATTENTION}: attention dropout is not supported")
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out, max_logit = flash_attention(query, key, value, getattr(module, "lowp", None))
    observer = getattr(module, "logit_observer", None)
    if observer is not None:
        observer(max_logit)
    return out.transpose(1, 2).contiguous(), None
