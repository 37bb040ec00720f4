"""Where a model keeps its per-head W_q, W_k and its router weights.

An :class:`AttentionSpec` turns a layer's live parameters into the effective per-head factors
W_q^h, W_k^h ∈ R^{d'×d_h} of the bilinear form x M^h xᵀ that produces attention scores:

* nn.Linear stores (out, in): W_q^h = weight[h·d_h:(h+1)·d_h, :]ᵀ. GPT-2's Conv1D stores
  (in, out) and is read transposed. A fused qkv projection is sliced by row ranges.
* Bias, treated in homogeneous coordinates: x W + b = [x, 1] [W; b], so the bias is one more
  input row of W (d' = d + 1). That keeps the score form x̃ M x̃ᵀ exact, including the
  key-dependent term b_q W_kᵀ xᵀ that a bias adds to the scores.
* QK-norm: q = norm(x W_q) ⊙ g_q. An RMS norm only rescales each token's row, so the
  learnable scale is folded in: W_q^h diag(g_q^h) (likewise for k), in float32. Its updates
  then count as updates of the circuit. A LayerNorm-type q/k norm also centres the row and may
  add a bias; those are not folded (discovery says so in ``skipped``).
* Rotary position embeddings act after the projections and are not part of W_q, W_k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .spectra import compute_dtype

__all__ = ["AttentionSpec", "RouterSpec", "linear_out_in"]


def linear_out_in(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """A projection weight as (out_features, in_features), whatever its storage order."""
    return weight.t() if transposed else weight


@dataclass(eq=False)
class AttentionSpec:
    """One attention layer's query/key projections (see the module docstring).

    ``q_rows``/``k_rows`` select the output features of ``q_weight``/``k_weight`` (stored
    (out, in) unless ``transposed``) that hold the query and key heads, in head order.
    ``q_bias``/``k_bias`` are the projections' whole biases, selected by the same rows. All
    slicing happens when read, so the spec holds the live parameters themselves: a view taken
    at discovery would go stale when ``module.to()`` swaps a parameter's storage.
    """

    name: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    q_rows: slice = field(default_factory=lambda: slice(None))
    k_rows: slice = field(default_factory=lambda: slice(None))
    transposed: bool = False
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    q_scale: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.name}: n_heads={self.n_heads} is not a multiple of "
                f"n_kv_heads={self.n_kv_heads}"
            )
        for which, heads in (("q", self.n_heads), ("k", self.n_kv_heads)):
            rows = self._rows(which)
            if rows.shape[0] != heads * self.head_dim:
                raise ValueError(
                    f"{self.name}: W_{which} has {rows.shape[0]} output features, expected "
                    f"{heads} heads × {self.head_dim} = {heads * self.head_dim}"
                )
            weight = self.q_weight if which == "q" else self.k_weight
            bias = self.q_bias if which == "q" else self.k_bias
            out_features = linear_out_in(weight, self.transposed).shape[0]
            if bias is not None and tuple(bias.shape) != (out_features,):
                raise ValueError(
                    f"{self.name}: {which}_bias has shape {tuple(bias.shape)}, expected the "
                    f"projection's whole bias ({out_features},)"
                )

    @property
    def model_dim(self) -> int:
        """d' = d, or d + 1 when biases are folded in as an extra input row."""
        return self._rows("q").shape[1] + (self.q_bias is not None or self.k_bias is not None)

    def _rows(self, which: str) -> torch.Tensor:
        weight, rows = (
            (self.q_weight, self.q_rows) if which == "q" else (self.k_weight, self.k_rows)
        )
        return linear_out_in(weight, self.transposed)[rows]

    def heads(self, which: str) -> torch.Tensor:
        """Effective per-head factors (heads, d', d_h), detached; parameter dtype, or float32
        when a QK-norm scale is folded in."""
        n = self.n_heads if which == "q" else self.n_kv_heads
        bias, rows = (self.q_bias, self.q_rows) if which == "q" else (self.k_bias, self.k_rows)
        scale = self.q_scale if which == "q" else self.k_scale
        other_bias = self.k_bias if which == "q" else self.q_bias
        with torch.no_grad():
            w = self._rows(which).detach()  # (n·d_h, d)
            heads = w.reshape(n, self.head_dim, -1).transpose(1, 2)  # (n, d, d_h)
            if bias is not None or other_bias is not None:
                b = bias.detach()[rows] if bias is not None else w.new_zeros(n * self.head_dim)
                heads = torch.cat([heads, b.reshape(n, 1, self.head_dim)], dim=1)
            if scale is not None:  # folded in float32: bf16 rounding of W·g would swamp ΔW
                dtype = compute_dtype(heads)
                heads = heads.to(dtype) * scale.detach().to(dtype).reshape(-1, 1, self.head_dim)
            return heads


@dataclass(eq=False)
class RouterSpec:
    """One MoE router: the module whose output is the routing logits (..., E), and its weight.

    ``top_k`` is how many experts each token is dispatched to; None when unknown, in which
    case the expert-load metrics are skipped (the soft-routing metrics need no k).
    """

    name: str
    module: torch.nn.Module
    weight: torch.Tensor
    n_experts: int
    top_k: int | None = None

    def __post_init__(self) -> None:
        if self.weight.dim() != 2 or self.weight.shape[0] != self.n_experts:
            raise ValueError(
                f"{self.name}: router weight must be (n_experts={self.n_experts}, d), "
                f"got {tuple(self.weight.shape)}"
            )
