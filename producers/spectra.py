"""Spectral statistics of a matrix from its squared singular values.

Why squared values: every route foreshock uses to reach a spectrum (Gram matrices,
compressed cores) yields σ² directly, and the default exponent α = 2 needs nothing else,
so no square root is taken unless α ≠ 2.

All functions are batched over leading dimensions and never leave the tensors' device.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["SpectrumStats", "compute_dtype", "gram_eigvals", "spectrum_stats", "update_spectrum"]


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (exact references); everything else is computed in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class SpectrumStats(NamedTuple):
    """Spectral summary of one matrix (or a batch of them); every field has the batch shape.

    entropy:        H / ln n, normalized to [0, 1]; n = the rank bound (count of singular values)
    entropy_nats:   H = −Σ p_i ln p_i, with p_i = σ_i^α / Σ_j σ_j^α  [nats]
    effective_rank: exp(H)                                            [dimensionless, 1..n]
    stable_rank:    ‖X‖_F² / ‖X‖_2² = Σσ_i² / σ_max²                   [dimensionless, 1..n]
    frobenius:      ‖X‖_F = sqrt(Σσ_i²)                               [units of X]
    """

    entropy: torch.Tensor
    entropy_nats: torch.Tensor
    effective_rank: torch.Tensor
    stable_rank: torch.Tensor
    frobenius: torch.Tensor


def spectrum_stats(sigma_sq: torch.Tensor, rank_bound: int, alpha: float = 2.0) -> SpectrumStats:
    """Spectral entropy, effective rank, stable rank and Frobenius norm from σ².

    ``sigma_sq`` has shape (..., k): the squared singular values of each matrix, in any order;
    values a hair below zero (round-off of an eigen-solver) are clamped to 0. Zeros beyond k
    do not change any statistic, so a compressed route with k < rank_bound is exact.

    p_i = σ_i^α / Σ_j σ_j^α,  H = −Σ_i p_i ln p_i (0 ln 0 = 0),  entropy = H / ln(rank_bound).

    Convention for a zero matrix (e.g. a frozen layer's update): there is no direction at all,
    so every statistic is 0 — entropy 0, effective rank 0, stable rank 0, Frobenius 0. A
    detector reads that as "no update", never as a collapse with effective rank 1.

    >>> s = spectrum_stats(torch.tensor([1.0, 1.0, 1.0, 1.0]), rank_bound=4)
    >>> [round(v.item(), 4) for v in (s.entropy, s.effective_rank, s.stable_rank)]
    [1.0, 4.0, 4.0]
    >>> s = spectrum_stats(torch.tensor([4.0, 0.0, 0.0]), rank_bound=3)
    >>> stats = (s.entropy, s.effective_rank, s.stable_rank, s.frobenius)
    >>> [round(abs(v.item()), 6) for v in stats]
    [0.0, 1.0, 1.0, 2.0]
    >>> spectrum_stats(torch.zeros(3), rank_bound=3).effective_rank.item()
    0.0
    """
    if rank_bound < 1:
        raise ValueError(f"rank_bound must be >= 1, got {rank_bound}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    s2 = sigma_sq.clamp_min(0)
    total_sq = s2.sum(-1)
    zero = total_sq == 0
    s_max = s2.amax(-1).masked_fill(zero, 1.0)
    # For α ≠ 2, σ^α is taken of σ²/σ_max² ∈ [0, 1] (p is scale-free): (σ²)^(α/2) itself
    # under- or overflows for α > 2 on tiny or huge matrices, and 0/0 or inf/inf gives NaN.
    weights = s2 if alpha == 2.0 else (s2 / s_max.unsqueeze(-1)).pow(alpha / 2)
    p = weights / weights.sum(-1, keepdim=True).masked_fill(zero.unsqueeze(-1), 1.0)
    nats = 0.0 - torch.special.xlogy(p, p).sum(-1)  # 0.0 - x: no negative zero
    log_n = math.log(rank_bound)
    entropy = nats / log_n if log_n > 0 else torch.zeros_like(nats)
    eff_rank = torch.exp(nats).masked_fill(zero, 0.0)
    stable = total_sq / s_max
    return SpectrumStats(entropy, nats, eff_rank, stable, total_sq.sqrt())


_HALVED_GRAM = 256  # from this size on, the Gram's lower blocks beat one full product


def gram_eigvals(x: torch.Tensor) -> torch.Tensor:
    """σ²(X) for a batch of matrices (..., m, n) through the Gram matrix of the smaller side.

    eig(X Xᵀ) when m ≤ n else eig(Xᵀ X): an m×m (or n×n) symmetric eigenproblem, several times
    cheaper than an SVD; σ² is all that α = 2 needs. Absolute error ≈ ε_machine · σ_max².

    From k = 256 on, only the Gram's lower triangle is formed (three k/2 blocks), which is all
    ``eigvalsh`` reads: 3/4 of the product's cost, the same values.

    >>> gram_eigvals(torch.diag(torch.tensor([3.0, 1.0]))).tolist()
    [1.0, 9.0]
    >>> x = torch.randn(300, 260, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> torch.allclose(gram_eigvals(x), torch.linalg.svdvals(x).square().flip(0))  # halved
    True
    """
    if x.shape[-2] <= x.shape[-1]:
        x = x.mT  # the Gram of the smaller side: (..., k, k), k = min(m, n)
    k = x.shape[-1]
    if k < _HALVED_GRAM:
        return torch.linalg.eigvalsh(x.mT @ x)
    # eigvalsh reads only the lower triangle: its three k/2 blocks are 3/4 of a full product.
    gram = x.new_zeros(*x.shape[:-2], k, k)
    half = k // 2
    left, right = x[..., :half], x[..., half:]
    torch.matmul(left.mT, left, out=gram[..., :half, :half])
    torch.matmul(right.mT, left, out=gram[..., half:, :half])
    torch.matmul(right.mT, right, out=gram[..., half:, half:])
    return torch.linalg.eigvalsh(gram, UPLO="L")


def update_spectrum(
    w_now: torch.Tensor, w_before: torch.Tensor, alpha: float = 2.0
) -> SpectrumStats:
    """Spectral statistics of the weight update ΔW = W_t − W_{t−δ}.

    Why the update and not W: initialisation energy dominates W's own spectrum, so a
    coherent low-rank drift shows in ΔW long before it shows in W. The difference is formed
    in float32 (exact for bf16/fp16 weights); rank bound n = min(shape).

    >>> w0 = torch.zeros(4, 3)
    >>> w1 = torch.outer(torch.ones(4), torch.tensor([1.0, 2.0, 2.0]))  # a rank-one update
    >>> s = update_spectrum(w1, w0)
    >>> round(s.entropy.item(), 5), round(s.frobenius.item(), 4)
    (0.0, 6.0)
    """
    dtype = compute_dtype(w_now)
    delta = w_now.to(dtype) - w_before.to(dtype)
    return spectrum_stats(gram_eigvals(delta), min(delta.shape[-2:]), alpha)
