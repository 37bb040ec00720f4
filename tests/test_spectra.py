"""Spectral statistics against a float64 dense reference.

The reference takes the singular values of the full matrix (torch.linalg.svdvals in float64) and
computes every statistic independently in numpy: p_i = σ_i^α / Σ_j σ_j^α, H = −Σ p_i ln p_i,
entropy = H / ln(rank bound), effective rank = exp(H), stable rank = Σσ² / σ_max²,
Frobenius = sqrt(Σσ²); a zero matrix has every statistic 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _reference import reference_stats
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.producers.spectra import (
    SpectrumStats,
    compute_dtype,
    gram_eigvals,
    spectrum_stats,
    update_spectrum,
)

torch.set_num_threads(1)

ALPHAS = (1.0, 2.0, 3.0)


# ---- reference ----------------------------------------------------------------------------


def dense_sigma(x: torch.Tensor) -> np.ndarray:
    """Singular values of the full matrices (..., m, n), float64, as (batch, min(m, n))."""
    sv = torch.linalg.svdvals(x.to(torch.float64))
    return sv.reshape(-1, sv.shape[-1]).numpy()


def assert_stats_match(
    got: SpectrumStats, sigma: np.ndarray, rank_bound: int, alpha: float, rtol: float
) -> None:
    """Entropies to rtol·max(1, |H|); the rank statistics and norm to rtol relative."""
    for b, row in enumerate(sigma):
        ref = reference_stats(row, rank_bound, alpha)
        for name in SpectrumStats._fields:
            value = getattr(got, name).reshape(-1)[b].item()
            scale = max(1.0, abs(ref[name])) if "entropy" in name else abs(ref[name])
            assert abs(value - ref[name]) <= rtol * scale + 1e-300, (name, b, value, ref[name])


@st.composite
def matrices(draw: st.DrawFn, max_dim: int = 24) -> torch.Tensor:
    """A float64 batch of m×n matrices, full-rank Gaussian or a product of thin factors."""
    m = draw(st.integers(1, max_dim))
    n = draw(st.integers(1, max_dim))
    batch = draw(st.sampled_from([(), (3,), (2, 2)]))
    rank = draw(st.one_of(st.none(), st.integers(1, max(1, min(m, n) - 1))))
    scale = draw(st.sampled_from([1e-6, 1e-2, 1.0, 1e3]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if rank is None:
        x = torch.randn(*batch, m, n, generator=g, dtype=torch.float64)
    else:
        a = torch.randn(*batch, m, rank, generator=g, dtype=torch.float64)
        x = a @ torch.randn(*batch, rank, n, generator=g, dtype=torch.float64)
    return x * scale


# ---- spectrum_stats -----------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(x=matrices(), alpha=st.sampled_from(ALPHAS))
def test_spectrum_stats_matches_dense_reference(x: torch.Tensor, alpha: float) -> None:
    sigma = dense_sigma(x)
    rank_bound = min(x.shape[-2:])
    got = spectrum_stats(torch.from_numpy(sigma**2), rank_bound, alpha)
    assert_stats_match(got, sigma, rank_bound, alpha, rtol=1e-10)


@settings(max_examples=40, deadline=None)
@given(
    sigma=st.lists(st.one_of(st.just(0.0), st.floats(1e-30, 1e3)), min_size=1, max_size=12),
    pad=st.integers(0, 5),
    alpha=st.sampled_from(ALPHAS),
    seed=st.integers(0, 2**31 - 1),
)
def test_spectrum_stats_order_and_zero_padding_invariant(
    sigma: list[float], pad: int, alpha: float, seed: int
) -> None:
    """Order does not matter and zeros beyond k change nothing: a compressed route is exact."""
    s2 = torch.tensor(sigma, dtype=torch.float64).square()
    rank_bound = len(sigma) + pad
    base = spectrum_stats(s2, rank_bound, alpha)
    perm = torch.randperm(len(sigma), generator=torch.Generator().manual_seed(seed))
    padded = torch.cat([s2[perm], torch.zeros(pad, dtype=torch.float64)])
    other = spectrum_stats(padded, rank_bound, alpha)
    for name in SpectrumStats._fields:
        torch.testing.assert_close(
            getattr(other, name), getattr(base, name), rtol=1e-10, atol=1e-14
        )
    assert_stats_match(base, np.array([sigma]), rank_bound, alpha, rtol=1e-10)


@settings(max_examples=40, deadline=None)
@given(x=matrices(), alpha=st.sampled_from(ALPHAS))
def test_spectrum_stats_ranges(x: torch.Tensor, alpha: float) -> None:
    """entropy ∈ [0, 1], effective and stable rank ∈ [1, n]; for α = 2, stable ≤ effective."""
    n = min(x.shape[-2:])
    s = spectrum_stats(gram_eigvals(x), n, alpha)
    tol = 1e-9
    assert bool(((s.entropy >= 0) & (s.entropy <= 1 + tol)).all())
    assert bool(((s.effective_rank >= 1 - tol) & (s.effective_rank <= n * (1 + tol))).all())
    assert bool(((s.stable_rank >= 1 - tol) & (s.stable_rank <= n * (1 + tol))).all())
    if alpha == 2.0:  # stable rank = exp(H_∞) ≤ exp(H_1) = effective rank (Rényi ordering)
        assert bool((s.stable_rank <= s.effective_rank * (1 + 1e-9)).all())


def test_spectrum_stats_known_values() -> None:
    # Flat spectrum of n values: entropy 1, effective rank n, stable rank n, for every α.
    for alpha in ALPHAS:
        s = spectrum_stats(torch.full((5,), 4.0, dtype=torch.float64), rank_bound=5, alpha=alpha)
        assert s.entropy.item() == pytest.approx(1.0, abs=1e-12)
        assert s.effective_rank.item() == pytest.approx(5.0, rel=1e-12)
        assert s.stable_rank.item() == pytest.approx(5.0, rel=1e-12)
        assert s.frobenius.item() == pytest.approx(math.sqrt(20.0), rel=1e-12)
    # σ = (2, 1): α picks the weights p ∝ σ^α.
    s2 = torch.tensor([4.0, 1.0], dtype=torch.float64)
    for alpha, p in [(1.0, [2 / 3, 1 / 3]), (2.0, [0.8, 0.2]), (3.0, [8 / 9, 1 / 9])]:
        h = -sum(pi * math.log(pi) for pi in p)
        s = spectrum_stats(s2, rank_bound=2, alpha=alpha)
        assert s.entropy_nats.item() == pytest.approx(h, rel=1e-12)
        assert s.entropy.item() == pytest.approx(h / math.log(2), rel=1e-12)
        assert s.stable_rank.item() == pytest.approx(1.25, rel=1e-12)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize(
    ("dtype", "scales"),
    [(torch.float32, [1e-18, 1e-9, 1e9, 1e18]), (torch.float64, [1e-140, 1e-60, 1e60, 1e140])],
)
def test_spectrum_stats_is_scale_free(alpha: float, dtype: torch.dtype, scales: list) -> None:
    """p, H and the ranks do not depend on the matrix scale, even where σ^α itself would under-
    or overflow (α = 3 on σ² ~ 1e-36 in float32): no NaN for a tiny but nonzero update."""
    s2 = torch.tensor([[4.0, 1.0, 0.25, 0.0]], dtype=dtype)
    ref = spectrum_stats(s2, 4, alpha)
    for scale in scales:
        got = spectrum_stats(s2 * scale**2, 4, alpha)
        for name in ("entropy", "entropy_nats", "effective_rank", "stable_rank"):
            torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=1e-5, atol=0)
        torch.testing.assert_close(got.frobenius, ref.frobenius * scale, rtol=1e-5, atol=0)


def test_spectrum_stats_clamps_round_off_below_zero() -> None:
    s2 = torch.tensor([9.0, 1.0, -1e-17, -1e-18], dtype=torch.float64)
    ref = spectrum_stats(torch.tensor([9.0, 1.0, 0.0, 0.0], dtype=torch.float64), 4, alpha=1.0)
    got = spectrum_stats(s2, 4, alpha=1.0)
    for name in SpectrumStats._fields:
        expected = getattr(ref, name).item()
        assert getattr(got, name).item() == pytest.approx(expected, abs=1e-12), name


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_matrix_convention(alpha: float, dtype: torch.dtype) -> None:
    """A zero matrix has no direction: every statistic is exactly 0 (not effective rank 1)."""
    s = spectrum_stats(torch.zeros(2, 4, dtype=dtype), rank_bound=4, alpha=alpha)
    for name in SpectrumStats._fields:
        value = getattr(s, name)
        assert value.shape == (2,)
        assert bool((value == 0).all()), name
        assert not bool(torch.signbit(value).any()), f"{name} is -0.0"
    w = torch.randn(3, 5, 4, dtype=dtype)
    s = update_spectrum(w, w.clone(), alpha)
    for name in SpectrumStats._fields:
        assert bool((getattr(s, name) == 0).all()), name


@pytest.mark.parametrize("alpha", ALPHAS)
def test_zero_matrix_in_a_batch_does_not_leak(alpha: float) -> None:
    """Masking the zero matrix of a batch leaves its neighbours' statistics untouched."""
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    x[1] = 0.0
    s = update_spectrum(x, torch.zeros_like(x), alpha)
    for name in SpectrumStats._fields:
        assert getattr(s, name)[1].item() == 0.0, name
    assert_stats_match(s, dense_sigma(x), 4, alpha, rtol=1e-9)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_rank_bound_one(alpha: float) -> None:
    """One singular value: entropy 0 (ln 1 = 0 is not divided by), effective and stable rank 1."""
    s = spectrum_stats(torch.tensor([4.0], dtype=torch.float64), rank_bound=1, alpha=alpha)
    assert (s.entropy.item(), s.entropy_nats.item()) == (0.0, 0.0)
    assert (s.effective_rank.item(), s.stable_rank.item(), s.frobenius.item()) == (1.0, 1.0, 2.0)
    for shape in [(1, 7), (7, 1), (2, 1, 1)]:
        w = torch.randn(*shape, dtype=torch.float64)
        s = update_spectrum(w, torch.zeros_like(w), alpha)
        assert bool((s.entropy == 0).all()) and bool((s.entropy_nats.abs() < 1e-15).all())
        torch.testing.assert_close(s.effective_rank, torch.ones_like(s.effective_rank))
        torch.testing.assert_close(s.stable_rank, torch.ones_like(s.stable_rank))
        torch.testing.assert_close(s.frobenius, w.flatten(-2).norm(dim=-1))


@pytest.mark.parametrize("rank_bound", [0, -1])
def test_bad_rank_bound(rank_bound: int) -> None:
    with pytest.raises(ValueError, match="rank_bound"):
        spectrum_stats(torch.ones(3), rank_bound=rank_bound)


@pytest.mark.parametrize("alpha", [0.0, -1.0, -2.0])
def test_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        spectrum_stats(torch.ones(3), rank_bound=3, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        update_spectrum(torch.ones(3, 3), torch.zeros(3, 3), alpha=alpha)


# ---- gram_eigvals -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(x=matrices())
def test_gram_eigvals_matches_svdvals(x: torch.Tensor) -> None:
    """eig of the smaller Gram matrix = σ², absolute error ≲ ε · σ_max² (tall and wide)."""
    m, n = x.shape[-2:]
    ev = gram_eigvals(x)
    assert ev.shape == (*x.shape[:-2], min(m, n))
    assert ev.dtype == torch.float64
    ref = torch.linalg.svdvals(x).square()
    got = ev.sort(dim=-1, descending=True).values
    smax2 = ref[..., :1]
    assert bool(((got - ref).abs() <= 1e-12 * smax2 + 1e-300).all())


def test_gram_eigvals_keeps_float32() -> None:
    assert gram_eigvals(torch.randn(5, 3)).dtype == torch.float32
    assert compute_dtype(torch.ones(1, dtype=torch.float64)) == torch.float64
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert compute_dtype(torch.ones(1, dtype=dtype)) == torch.float32


# ---- update_spectrum ----------------------------------------------------------------------


@st.composite
def weight_pairs(draw: st.DrawFn, full_rank: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_now, W_before) in float64; the update is full-rank or a product of thin factors."""
    m = draw(st.integers(1, 24))
    n = draw(st.integers(1, 24))
    batch = draw(st.sampled_from([(), (3,), (2, 2)]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    before = torch.randn(*batch, m, n, generator=g, dtype=torch.float64)
    scale = draw(st.sampled_from([1e-4, 1e-2, 1.0]))
    if full_rank:
        delta = torch.randn(*batch, m, n, generator=g, dtype=torch.float64)
    else:
        r = draw(st.integers(1, max(1, min(m, n) - 1)))
        delta = torch.randn(*batch, m, r, generator=g, dtype=torch.float64)
        delta = delta @ torch.randn(*batch, r, n, generator=g, dtype=torch.float64)
    return before + scale * delta, before


@settings(max_examples=60, deadline=None)
@given(pair=weight_pairs(full_rank=True), alpha=st.sampled_from(ALPHAS))
def test_update_spectrum_matches_dense_reference(
    pair: tuple[torch.Tensor, torch.Tensor], alpha: float
) -> None:
    now, before = pair
    delta = now - before  # the update the function sees, formed the same way
    s = update_spectrum(now, before, alpha)
    assert s.entropy.shape == now.shape[:-2]
    assert_stats_match(s, dense_sigma(delta), min(delta.shape[-2:]), alpha, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(pair=weight_pairs(full_rank=False), alpha=st.sampled_from(ALPHAS))
def test_update_spectrum_rank_deficient(
    pair: tuple[torch.Tensor, torch.Tensor], alpha: float
) -> None:
    """A low-rank update: exact to 1e-6 for α ≥ 2; α = 1 has a known, looser floor.

    The Gram route gets σ² to an absolute ε·σ_max², so a zero singular value comes back as
    σ ≈ √ε·σ_max ≈ 1.5e-8·σ_max; α = 1 weights it by σ itself, and each of up to n such values
    adds ≈ 1.5e-8·ln(1/1.5e-8) ≈ 3e-7 nats. For α = 2 the weight is σ² ≈ ε and the effect is nil.
    """
    now, before = pair
    delta = now - before
    s = update_spectrum(now, before, alpha)
    rtol = 1e-5 if alpha < 2 else 1e-6
    assert_stats_match(s, dense_sigma(delta), min(delta.shape[-2:]), alpha, rtol=rtol)


def test_update_spectrum_low_precision_weights() -> None:
    """bf16 weights: the difference is formed in float32 (exact for bf16) and stays float32."""
    before = torch.randn(16, 8).to(torch.bfloat16)
    now = (before.float() + 0.05 * torch.randn(16, 8)).to(torch.bfloat16)
    s = update_spectrum(now, before)
    assert s.entropy.dtype == torch.float32
    delta = now.double() - before.double()
    assert_stats_match(s, dense_sigma(delta), 8, 2.0, rtol=1e-4)
