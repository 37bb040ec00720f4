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
* Interleaved and grouped fused layouts (GPT-NeoX's per-head [q k v], Falcon's and
  Megatron's per-group [q… k v]) select a head's rows with an index tensor (``head_rows``).
* A latent path (MLA: x → c = RMSNorm(x W_a + b_a) ⊙ g → q = c W_b) is folded the same way:
  the norm's 1/rms only rescales each token, so the effective factor from x is
  W_eff = W_b diag(g) [W_a | b_a] (out, d + 1), and x W_effᵀ is exact up to that per-token
  scalar. See ``LatentPath``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from .spectra import compute_dtype

__all__ = [
    "TENSOR_FIELDS",
    "AttentionSpec",
    "LatentPath",
    "RouterSpec",
    "head_rows",
    "linear_out_in",
]

Rows = slice | torch.Tensor  # output features: a slice, or an index tensor in head order


def linear_out_in(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """A projection weight as (out_features, in_features), whatever its storage order."""
    return weight.t() if transposed else weight


def head_rows(starts: torch.Tensor | list[int], width: int) -> torch.Tensor:
    """The output rows of heads whose blocks of ``width`` rows start at ``starts``, in order.

    GPT-NeoX's per-head [q k v] (H heads of d_h): q = head_rows(3·d_h·arange(H), d_h), k the
    same starts + d_h. Falcon's grouped layout (G groups of r query heads, then k, v):
    q starts (r + 2)·d_h·g + d_h·j, k starts (r + 2)·d_h·g + r·d_h.

    >>> head_rows([0, 6], 2).tolist()
    [0, 1, 6, 7]
    """
    starts = torch.as_tensor(starts, dtype=torch.long).reshape(-1, 1)
    return (starts + torch.arange(width)).flatten()


# QK-norm modules inside an attention layer, (query, key) names: discovery folds their scales
# into W_q and W_k, the architecture signature says a model has QK-norm when a layer holds a
# pair. One list for both: two copies once differed, and a model whose norms were named
# ``q_ln``/``k_ln`` was folded but signed ``qk_norm: false`` (profiles are chosen by it).
QK_NORM_PAIRS = (
    ("q_norm", "k_norm"),
    ("q_layernorm", "k_layernorm"),
    ("q_ln", "k_ln"),
    ("norm_q", "norm_k"),
)


@dataclass(eq=False)
class LatentPath:
    """The down-projection a per-head projection reads from: c = RMSNorm(x W_aᵀ + b_a) ⊙ g.

    MLA (DeepSeek-V2/V3, Kimi) projects x to a small latent, normalises it and projects up per
    head. RMSNorm divides each token by its own rms, a per-token scalar, so the score's
    content part stays bilinear in x: q^h = s(x) · x̃ (W_b^h diag(g) A)ᵀ with A = [W_a | b_a]
    and x̃ = [x, 1]. ``matrix()`` is A (r, d or d + 1), ``scale`` is g (r,) or None.
    ``rows`` selects the latent's rows of ``weight`` (stored (out, in)), ``bias`` is the
    down-projection's whole bias (sliced by ``rows``).
    """

    weight: torch.Tensor
    rows: slice = field(default_factory=lambda: slice(None))
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    @property
    def width(self) -> int:
        """r, the latent's size."""
        return self.weight[self.rows].shape[0]

    def matrix(self, dtype: torch.dtype) -> torch.Tensor:
        """A = [W_a | b_a] (r, d[+1]) in ``dtype``, detached."""
        a = self.weight.detach()[self.rows].to(dtype)
        if self.bias is not None:
            a = torch.cat([a, self.bias.detach()[self.rows].to(dtype).unsqueeze(1)], dim=1)
        return a


@dataclass(eq=False)
class AttentionSpec:
    """One attention layer's query/key projections (see the module docstring).

    ``q_rows``/``k_rows`` select the output features of ``q_weight``/``k_weight`` (stored
    (out, in) unless ``transposed``) that hold the query and key heads, in head order.
    ``q_bias``/``k_bias`` are the projections' whole biases, selected by the same rows.
    ``q_latent``/``k_latent`` are the down-projections an MLA layer's up-projections read from
    (``LatentPath``); the factors are then taken from x, through the latent. All
    slicing happens when read, so the spec holds the live parameters themselves: a view taken
    at discovery would go stale when ``module.to()`` swaps a parameter's storage.
    """

    name: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    q_rows: Rows = field(default_factory=lambda: slice(None))
    k_rows: Rows = field(default_factory=lambda: slice(None))
    transposed: bool = False
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    q_scale: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    q_latent: LatentPath | None = None
    k_latent: LatentPath | None = None

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
            latent = self._latent(which)
            if latent is not None and latent.width != rows.shape[1]:
                raise ValueError(
                    f"{self.name}: W_{which} reads {rows.shape[1]} inputs but its latent path "
                    f"gives {latent.width}"
                )
        if self._input_dim("q") != self._input_dim("k"):
            raise ValueError(
                f"{self.name}: queries read {self._input_dim('q')} inputs, keys "
                f"{self._input_dim('k')}: not one bilinear form"
            )

    def tensors(self) -> list[torch.Tensor | None]:
        """Every tensor this layer is read from (weights, biases, scales, latent paths)."""
        found = [self.q_weight, self.k_weight, self.q_bias, self.k_bias, self.q_scale]
        found.append(self.k_scale)
        for latent in (self.q_latent, self.k_latent):
            if latent is not None:
                found += [latent.weight, latent.scale, latent.bias]
        return found

    @property
    def model_dim(self) -> int:
        """d' = d, or d + 1 when biases are folded in as an extra input row."""
        return self._input_dim("q") + self._has_bias_row

    @property
    def _has_bias_row(self) -> bool:
        latents = (self.q_latent, self.k_latent)
        return (
            self.q_bias is not None
            or self.k_bias is not None
            or any(lat is not None and lat.bias is not None for lat in latents)
        )

    def _latent(self, which: str) -> LatentPath | None:
        return self.q_latent if which == "q" else self.k_latent

    def _input_dim(self, which: str) -> int:
        latent = self._latent(which)
        if latent is not None:
            return latent.weight.shape[1]
        return self._rows(which).shape[1]

    def _rows(self, which: str) -> torch.Tensor:
        weight, rows = (
            (self.q_weight, self.q_rows) if which == "q" else (self.k_weight, self.k_rows)
        )
        return linear_out_in(weight, self.transposed)[rows]

    def heads(self, which: str) -> torch.Tensor:
        """Effective per-head factors (heads, d', d_h), detached; parameter dtype, or float32
        when a QK-norm scale or a latent path is folded in."""
        n = self.n_heads if which == "q" else self.n_kv_heads
        scale = self.q_scale if which == "q" else self.k_scale
        with torch.no_grad():
            w = self._effective(which)  # (n·d_h, d')
            heads = w.reshape(n, self.head_dim, -1).transpose(1, 2)  # (n, d', d_h)
            if scale is not None:  # folded in float32: bf16 rounding of W·g would swamp ΔW
                dtype = compute_dtype(heads)
                heads = heads.to(dtype) * scale.detach().to(dtype).reshape(-1, 1, self.head_dim)
            return heads

    def _effective(self, which: str) -> torch.Tensor:
        """W (n·d_h, d') in (out, in) order from x̃ = [x, 1]: through the latent path if any,
        with the bias (own, and the latent's) as the last input column."""
        bias, rows = (self.q_bias, self.q_rows) if which == "q" else (self.k_bias, self.k_rows)
        latent = self._latent(which)
        w = self._rows(which).detach()  # (n·d_h, d) or (n·d_h, r)
        own_bias = bias.detach()[rows] if bias is not None else None
        bias_in_w = False
        if latent is not None:
            dtype = compute_dtype(w)
            w = w.to(dtype)
            if latent.scale is not None:
                w = w * latent.scale.detach().to(dtype)  # W_b diag(g)
            w = w @ latent.matrix(dtype)  # (n·d_h, d[+1])
            bias_in_w = latent.bias is not None
        if not self._has_bias_row:
            return w
        if bias_in_w:
            if own_bias is not None:
                w = torch.cat([w[:, :-1], (w[:, -1] + own_bias.to(w.dtype)).unsqueeze(1)], 1)
            return w
        column = own_bias.to(w.dtype) if own_bias is not None else w.new_zeros(w.shape[0])
        return torch.cat([w, column.unsqueeze(1)], dim=1)


@dataclass(eq=False)
class RouterSpec:
    """One MoE router: the module whose output holds the routing logits (..., E), its weight.

    ``top_k`` is how many experts each token is dispatched to; None when unknown, in which
    case the expert-load metrics are skipped (the soft-routing metrics need no k).
    ``bias`` is the router's own bias (E,) (GPT-OSS): the logits are x̃ [W | b]ᵀ, so the weight
    geometry (ε, cosines) is taken over the rows of [W | b].
    ``scoring`` is how logits become routing scores: ``"softmax"`` (Mixtral, Qwen-MoE, OLMoE,
    GPT-OSS) or ``"sigmoid"`` (DeepSeek-V3: per-expert σ(z), normalised over the experts).
    The token entropy is taken over that distribution; the load over the experts the router
    actually selected when its output says (a tuple with an integer (…, k) tensor), else over
    the top-k of the logits.
    ``weight`` is the model's parameter itself: (E, d), or flat (E·d,) where the model stores
    it so (OLMo-core, for FSDP); ``matrix()`` is then its (E, d) view, taken at every read.
    """

    name: str
    module: torch.nn.Module
    weight: torch.Tensor
    n_experts: int
    top_k: int | None = None
    bias: torch.Tensor | None = None
    scoring: Literal["softmax", "sigmoid"] = "softmax"

    def __post_init__(self) -> None:
        flat = self.weight.dim() == 1 and self.weight.numel() % self.n_experts == 0
        if not flat and (self.weight.dim() != 2 or self.weight.shape[0] != self.n_experts):
            raise ValueError(
                f"{self.name}: router weight must be (n_experts={self.n_experts}, d) or flat, "
                f"got {tuple(self.weight.shape)}"
            )
        if self.bias is not None and tuple(self.bias.shape) != (self.n_experts,):
            raise ValueError(
                f"{self.name}: router bias must be ({self.n_experts},), "
                f"got {tuple(self.bias.shape)}"
            )
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"{self.name}: scoring must be softmax or sigmoid: {self.scoring!r}")

    def tensors(self) -> list[torch.Tensor | None]:
        """Every tensor this router is read from."""
        return [self.weight, self.bias]

    def matrix(self) -> torch.Tensor:
        """W (E, d): the weight, or the view of a flat one."""
        return self.weight.view(self.n_experts, -1) if self.weight.dim() == 1 else self.weight

    def rows(self) -> torch.Tensor:
        """The router's rows [W | b] (E, d[+1]), detached."""
        weight = self.matrix().detach()
        if self.bias is None:
            return weight
        return torch.cat([weight, self.bias.detach().to(weight.dtype).unsqueeze(1)], dim=1)


# The fields of each spec that hold tensors read from the model (one place: following live
# parameters and gathering shards both walk them).
TENSOR_FIELDS: dict[type, tuple[str, ...]] = {
    AttentionSpec: ("q_weight", "k_weight", "q_bias", "k_bias", "q_scale", "k_scale"),
    RouterSpec: ("weight", "bias"),
    LatentPath: ("weight", "scale", "bias"),
}
