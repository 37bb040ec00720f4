"""Causal attention with FlashAttention's backward, and low-precision rounding of its O.

Forward (per head, scale α = 1/√d_h):  S = α Q Kᵀ (causal mask),  P̄ = exp(S − rowmax S),
P = P̄ / rowsum P̄,  O = P V.

Backward, as FlashAttention computes it (Dao 2022, alg. 4):
  dV = Pᵀ dO,  dP = dO Vᵀ,  D = rowsum(dO ∘ O),  dS = P ∘ (dP − D),  dQ = α dS K,  dK = α dSᵀ Q.
D uses the *output* O instead of rowsum(P ∘ dP); both are equal in exact arithmetic, which is why
a low-precision O poisons the gradient: the error rowsum(dO ∘ (O_lowp − O)) is one number per
query row, subtracted from every dP entry of that row, so dS gains a term −P·δD_i that is
rank-one per head and alike across steps when the rounding is biased (Qiu & Yao 2025).

Fault emulation (exact choice): only the O that the backward uses for D is rounded to
``mantissa_bits`` (m) bits, in float32, by bit manipulation; the forward output and everything
else stay exact. ``rounding="truncate"`` drops the low bits (toward zero: the biased rounding of
``fa-lowprec``); ``rounding="nearest"`` rounds to nearest, ties to even (unbiased: the
``fa-noise`` control). m = 7 is bf16's mantissa; m is the magnitude knob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["LowPrecision", "flash_attention", "round_mantissa"]

Rounding = Literal["truncate", "nearest"]


@dataclass(frozen=True)
class LowPrecision:
    """How the O used by the backward's D is rounded: m mantissa bits, truncate or nearest."""

    mantissa_bits: int
    rounding: Rounding = "truncate"

    def __post_init__(self) -> None:
        if not 0 <= self.mantissa_bits <= 23:
            raise ValueError(f"mantissa_bits must be in [0, 23], got {self.mantissa_bits}")
        if self.rounding not in ("truncate", "nearest"):
            raise ValueError(f"rounding must be 'truncate' or 'nearest', got {self.rounding!r}")


def round_mantissa(x: torch.Tensor, bits: int, rounding: Rounding = "truncate") -> torch.Tensor:
    """Round float32 values to ``bits`` explicit mantissa bits (float32 has 23).

    truncate: clear the low 23 − bits bits of the mantissa — toward zero, a biased rounding.
    nearest:  add half an ulp (minus one, plus the kept lsb: ties to even), then clear.

    >>> x = torch.tensor([1.875, -1.875, 1.25, 1.75])   # 1.111b, 1.01b, 1.11b
    >>> round_mantissa(x, 1).tolist()
    [1.5, -1.5, 1.0, 1.5]
    >>> round_mantissa(x, 1, "nearest").tolist()        # 1.25 ties to even 1.0, 1.75 to 2.0
    [2.0, -2.0, 1.0, 2.0]
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_mantissa works on float32, got {x.dtype}")
    drop = 23 - bits
    if drop <= 0:
        return x
    as_int = x.view(torch.int32)
    if rounding == "nearest":
        half_minus_one = (1 << (drop - 1)) - 1
        as_int = as_int + half_minus_one + ((as_int >> drop) & 1)
    mask = ~((1 << drop) - 1)
    return (as_int & mask).view(torch.float32)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lowp):  # (B, nh, T, hs) each
        scale = 1.0 / math.sqrt(q.shape[-1])
        T = q.shape[-2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T)
        scores = scores.masked_fill(~causal, float("-inf"))
        p_bar = torch.exp(scores - scores.amax(-1, keepdim=True))
        p = p_bar / p_bar.sum(-1, keepdim=True)
        out = p @ v  # (B, nh, T, hs)
        out_for_d = out if lowp is None else round_mantissa(out, lowp.mantissa_bits, lowp.rounding)
        ctx.save_for_backward(q, k, v, p, out_for_d)
        ctx.scale = scale
        max_logit = scores.detach().amax()
        ctx.mark_non_differentiable(max_logit)
        return out, max_logit

    @staticmethod
    def backward(ctx, d_out, _d_max):
        q, k, v, p, out_for_d = ctx.saved_tensors
        d_v = p.transpose(-2, -1) @ d_out
        d_p = d_out @ v.transpose(-2, -1)
        d_row = (d_out * out_for_d).sum(-1, keepdim=True)  # D = rowsum(dO ∘ O), (B, nh, T, 1)
        d_s = p * (d_p - d_row)
        d_q = (d_s @ k) * ctx.scale
        d_k = (d_s.transpose(-2, -1) @ q) * ctx.scale
        return d_q, d_k, d_v, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lowp: LowPrecision | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention (B, nh, T, hs) → (output, max pre-softmax logit).

    With ``lowp`` the backward's D sees a rounded O (see module docstring); the forward and
    the returned output are exact either way.
    """
    return _FlashAttention.apply(q, k, v, lowp)
