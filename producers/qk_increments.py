"""Spectra of the per-head QK-product increments Δ2 and Δ3 by compressed cores.

Per head h, attention scores are ∝ x W_q^h (x W_k^h)ᵀ = x M^h xᵀ with M^h = W_q^h W_k^hᵀ
(d×d, rank ≤ d_h). Between two snapshots (W at t−δ, update ΔW):

    ΔM = Δ2 + Δ3,  Δ2 = ΔW_q W_kᵀ + W_q ΔW_kᵀ = [ΔW_q, W_q] [W_k, ΔW_k]ᵀ,  Δ3 = ΔW_q ΔW_kᵀ.

Δ2 is the first-order increment and carries the early signal of a coherent low-rank bias in
the query/key gradients. Both are products A Bᵀ of thin d×r factors (r = 2·d_h, resp. d_h).
With thin QR A = Q_A R_A and B = Q_B R_B, A Bᵀ = Q_A (R_A R_Bᵀ) Q_Bᵀ, so the singular values
of the d×d product are exactly those of the small r×r core R_A R_Bᵀ: O(d r² + r³) instead of
O(d³), and no d×d matrix is ever formed. (R is taken from a Cholesky factorization of the
Gram where that is well defined, see ``r_factor``; it enters only through RᵀR.)

Only two QRs per layer are needed: the first d_h columns of R_A are the R factor of ΔW_q and the
last d_h columns of R_B that of ΔW_k, so the Δ3 core is R_A[:, :d_h] R_B[:, d_h:]ᵀ for free. R_A
is upper triangular, so only its top d_h rows are nonzero there: the Δ3 core is d_h×2d_h and its
eigenproblem d_h×d_h, an eighth of the 2d_h×2d_h one.
Grouped-query attention: query head h pairs with key head h // (H / H_kv); the key factors are
factored once per key head and shared.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from .spectra import SpectrumStats, compute_dtype, spectrum_stats

__all__ = ["QKSpectra", "qk_core_eigvals", "qk_increment_spectra", "r_factor"]

CoreMethod = Literal["eigh", "svd"]


class QKSpectra(NamedTuple):
    """Per-head spectral statistics of Δ2 (first order) and Δ3 (second order); shape (..., H)."""

    d2: SpectrumStats
    d3: SpectrumStats


def r_factor(x: torch.Tensor) -> torch.Tensor:
    """An R with RᵀR = XᵀX for a batch of d×r factors X, shape (..., min(d, r), r).

    Singular values of the cores depend on each factor only through its Gram XᵀX, so any such
    R is as good as thin QR's. Cholesky of the Gram (one batched matmul and an r×r
    factorization) is several times faster than Householder QR on small factors. The Gram is
    scaled to a unit diagonal first (D⁻¹ G D⁻¹, D = column norms), so that columns of very
    different size — a small ΔW beside W — cost no accuracy. What remains is collinearity:
    forming the Gram squares it, and a nearly dependent direction comes out with an absolute
    error ≈ √ε·σ_max (~1e-8·σ_max in float64), which an α = 1 entropy counts. So factors whose
    scaled Gram is not numerically positive definite (a frozen W, a zero update, d < r) or
    nearly singular (a pivot below ε^¼: a rank-deficient or collapsing update, exactly what
    the monitors look for) take the Householder route, padded with zero rows to r×r when
    d ≥ r.

    >>> x = torch.tensor([[3.0, 0.0], [4.0, 5.0]], dtype=torch.float64)
    >>> r = r_factor(x)
    >>> torch.allclose(r.mT @ r, x.mT @ x)
    True
    >>> r_factor(torch.zeros(3, 2)).abs().max().item() < 1e-30  # rank 0: the QR route
    True
    >>> rank_one = torch.outer(torch.ones(4, dtype=torch.float64), torch.tensor([1.0, 2.0]))
    >>> abs(r_factor(rank_one)[1, 1].item()) < 1e-12  # ~0 by QR (round-off), not √ε by Cholesky
    True
    """
    rows, cols = x.shape[-2], x.shape[-1]
    if rows < cols:  # never positive definite: R is (d, r) as from thin QR
        return torch.linalg.qr(x, mode="r").R
    gram = x.mT @ x  # (..., r, r)
    scale = gram.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(x.dtype).tiny).sqrt()
    unit = gram / (scale.unsqueeze(-1) * scale.unsqueeze(-2))  # D⁻¹ G D⁻¹: unit diagonal
    chol, info = torch.linalg.cholesky_ex(unit)  # D⁻¹ G D⁻¹ = L Lᵀ, so G = (D L)(D L)ᵀ
    r = (chol * scale.unsqueeze(-1)).mT.contiguous()  # R = (D L)ᵀ
    pivots = chol.diagonal(dim1=-2, dim2=-1)
    failed = (info != 0) | (pivots.amin(-1) <= torch.finfo(x.dtype).eps ** 0.25)
    if bool(failed.any()):  # a sync; rare outside frozen layers and first steps
        exact = torch.linalg.qr(x[failed], mode="r").R  # (n, min(d, r), r)
        padded = exact.new_zeros(exact.shape[0], cols, cols)
        padded[:, : exact.shape[1]] = exact
        r[failed] = padded
    return r


def _core_sigma_sq(core: torch.Tensor, method: CoreMethod) -> torch.Tensor:
    if method == "svd":
        return torch.linalg.svdvals(core).square()
    if method == "eigh":
        return torch.linalg.eigvalsh(core @ core.mT)
    raise ValueError(f"core method must be 'eigh' or 'svd', got {method!r}")


def qk_core_eigvals(
    q_now: torch.Tensor,
    q_before: torch.Tensor,
    k_now: torch.Tensor,
    k_before: torch.Tensor,
    method: CoreMethod = "eigh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """σ² of Δ2^h and Δ3^h for every query head, from the compressed cores.

    Shapes: q_* (..., H, d, d_h), k_* (..., H_kv, d, d_h) with H divisible by H_kv; leading
    dimensions batch layers of the same shape. Returns two tensors of shape (..., H, k) with
    k = min(d, 2·d_h), padded with zeros beyond each increment's rank.

    >>> e = torch.eye(3, dtype=torch.float64)
    >>> q0, k0 = e[None, :, :1], e[None, :, 1:2]           # one head, d=3, d_h=1
    >>> dq, dk = torch.zeros_like(q0), e[None, :, 2:3]      # only W_k moves
    >>> s2, s3 = qk_core_eigvals(q0 + dq, q0, k0 + dk, k0)     # Δ2 = e0 e2ᵀ, Δ3 = 0
    >>> [round(v, 6) for v in s2.flatten().tolist()], s3.abs().max().item() < 1e-12
    ([0.0, 1.0], True)
    """
    n_heads, n_kv = q_now.shape[-3], k_now.shape[-3]
    if n_heads % n_kv:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of key heads ({n_kv})")
    dtype = compute_dtype(q_now)
    d_head = q_now.shape[-1]
    q_before, k_before = q_before.to(dtype), k_before.to(dtype)
    # A = [ΔW_q, W_q] and B = [W_k, ΔW_k], written straight into one buffer (2, ..., H, d, 2d_h)
    # when they have the same shape (H = H_kv): one batched factorization for both sides.
    shared = q_now.shape == k_now.shape
    a_and_b = q_before.new_empty(2 if shared else 1, *q_now.shape[:-1], 2 * d_head)
    a = a_and_b[0]
    b = a_and_b[1] if shared else k_before.new_empty(*k_now.shape[:-1], 2 * d_head)
    torch.sub(q_now.to(dtype), q_before, out=a[..., :d_head])
    a[..., d_head:] = q_before
    b[..., :d_head] = k_before
    torch.sub(k_now.to(dtype), k_before, out=b[..., d_head:])
    if shared:
        r_a, r_b = r_factor(a_and_b).unbind(0)  # (..., H, k, 2d_h) each
    else:
        r_a, r_b = r_factor(a), r_factor(b)  # (..., H, k, 2d_h), (..., H_kv, k, 2d_h)
    r_b = r_b.repeat_interleave(n_heads // n_kv, dim=-3)  # (..., H, k, 2d_h)
    core2 = r_a @ r_b.mT  # (..., H, k, k)
    # R_A is upper triangular (or trapezoidal), so its first d_h columns vanish below row d_h:
    # the Δ3 core's rows past m = min(k, d_h) are zero and dropping them changes no σ.
    m = min(r_a.shape[-2], d_head)
    core3 = r_a[..., :m, :d_head] @ r_b[..., d_head:].mT  # (..., H, m, k)
    s3 = _core_sigma_sq(core3, method)  # (..., H, m)
    pad = s3.new_zeros(*s3.shape[:-1], r_a.shape[-2] - m)  # σ = 0 beyond rank m
    return _core_sigma_sq(core2, method), torch.cat([s3, pad], -1)


def qk_increment_spectra(
    q_now: torch.Tensor,
    q_before: torch.Tensor,
    k_now: torch.Tensor,
    k_before: torch.Tensor,
    alpha: float = 2.0,
    method: CoreMethod = "eigh",
) -> QKSpectra:
    """Spectral statistics (entropy, effective/stable rank, Frobenius) of Δ2^h and Δ3^h.

    Rank bounds used to normalize the entropies: min(d, 2·d_h) for Δ2, min(d, d_h) for Δ3.

    >>> torch.manual_seed(0) and None
    >>> q0, k0 = torch.randn(2, 8, 2), torch.randn(2, 8, 2)    # H=2 heads, d=8, d_h=2
    >>> bias = torch.randn(8, 1) @ torch.ones(1, 2)           # a coherent rank-one drift
    >>> out = qk_increment_spectra(q0 + 0.1 * bias, q0, k0 + 0.1 * bias, k0)
    >>> out.d2.entropy.shape, bool((out.d3.entropy < 1e-6).all())   # Δ3 is rank one
    (torch.Size([2]), True)
    """
    s2, s3 = qk_core_eigvals(q_now, q_before, k_now, k_before, method)
    d, d_head = q_now.shape[-2], q_now.shape[-1]
    return QKSpectra(
        spectrum_stats(s2, min(d, 2 * d_head), alpha),
        spectrum_stats(s3, min(d, d_head), alpha),
    )
