"""Compressed-core spectra of the QK increments Δ2 and Δ3 against a float64 dense reference.

Per query head h with key head g = h // (H / H_kv), W at t−δ ("before") and ΔW = W_now − W_before:

    Δ2^h = ΔW_q^h W_k^gᵀ + W_q^h ΔW_k^gᵀ,     Δ3^h = ΔW_q^h ΔW_k^gᵀ     (d×d each).

The reference builds each d×d matrix explicitly and takes torch.linalg.svdvals in float64; the
statistics are computed independently in numpy. "Equal" means, for singular values,
|σ_i − σ_i^ref| ≤ 1e-6·σ_max^ref on the descending vectors (the compressed ones zero-padded to
length d), and for entropies |H − H_ref| ≤ 1e-6·max(1, |H_ref|).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from _reference import reference_stats
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foreshock.producers.qk_increments import qk_core_eigvals, qk_increment_spectra
from foreshock.producers.spectra import SpectrumStats

torch.set_num_threads(1)

RTOL = 1e-6
METHODS = ("eigh", "svd")


# ---- reference ----------------------------------------------------------------------------


def dense_increments(
    q_now: torch.Tensor, q_before: torch.Tensor, k_now: torch.Tensor, k_before: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Descending singular values (batch..., H, d) of Δ2^h and Δ3^h, each built explicitly."""
    q_now, q_before, k_now, k_before = (
        t.to(torch.float64) for t in (q_now, q_before, k_now, k_before)
    )
    dq, dk = q_now - q_before, k_now - k_before
    batch, n_heads, d = q_now.shape[:-3], q_now.shape[-3], q_now.shape[-2]
    group = n_heads // k_now.shape[-3]
    flat = [t.reshape(-1, *t.shape[-3:]) for t in (dq, q_before, dk, k_before)]
    sv2 = np.zeros((flat[0].shape[0], n_heads, d))
    sv3 = np.zeros_like(sv2)
    for b in range(flat[0].shape[0]):
        dq_b, q_b, dk_b, k_b = (t[b] for t in flat)
        for h in range(n_heads):
            g = h // group
            d2 = dq_b[h] @ k_b[g].T + q_b[h] @ dk_b[g].T
            d3 = dq_b[h] @ dk_b[g].T
            sv2[b, h] = torch.linalg.svdvals(d2).numpy()
            sv3[b, h] = torch.linalg.svdvals(d3).numpy()
    return sv2.reshape(*batch, n_heads, d), sv3.reshape(*batch, n_heads, d)


def compressed_sigma(sigma_sq: torch.Tensor, d: int) -> np.ndarray:
    """σ from the core's σ², descending and zero-padded to length d."""
    sv = sigma_sq.to(torch.float64).clamp_min(0).sqrt().sort(dim=-1, descending=True).values
    pad = torch.zeros(*sv.shape[:-1], d - sv.shape[-1], dtype=torch.float64)
    return torch.cat([sv, pad], dim=-1).numpy()


def assert_sigma_close(got: np.ndarray, ref: np.ndarray, rtol: float, what: str) -> None:
    smax = ref[..., :1]
    err = np.abs(got - ref)
    bad = err > rtol * smax
    assert not bad.any(), f"{what}: max err/σ_max {np.max(err / np.maximum(smax, 1e-300)):.3g}"


def assert_stats_close(
    got: SpectrumStats, sigma: np.ndarray, rank_bound: int, alpha: float, rtol: float, what: str
) -> None:
    """Entropies to rtol·max(1, |H_ref|); effective/stable rank and Frobenius to rtol relative."""
    flat_sigma = sigma.reshape(-1, sigma.shape[-1])
    for name in SpectrumStats._fields:
        assert getattr(got, name).shape == sigma.shape[:-1], name
    for i, row in enumerate(flat_sigma):
        ref = reference_stats(row, rank_bound, alpha)
        for name in SpectrumStats._fields:
            value = getattr(got, name).reshape(-1)[i].item()
            scale = max(1.0, abs(ref[name])) if "entropy" in name else abs(ref[name])
            assert abs(value - ref[name]) <= rtol * scale, (what, name, i, value, ref[name])


# ---- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """Shape and update structure of one example; ``rank_*`` None = dense, 0 = zero update."""

    d: int
    d_head: int
    n_kv: int
    group: int
    batch: tuple[int, ...]
    rank_q: int | None
    rank_k: int | None
    scale: float
    seed: int

    @property
    def n_heads(self) -> int:
        return self.n_kv * self.group


def _update(
    g: torch.Generator, shape: tuple[int, ...], rank: int | None, scale: float
) -> torch.Tensor:
    *lead, d, d_head = shape
    if rank is None:
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)
    if rank == 0:
        return torch.zeros(shape, dtype=torch.float64)
    a = torch.randn(*lead, d, rank, generator=g, dtype=torch.float64)
    return scale * (a @ torch.randn(*lead, rank, d_head, generator=g, dtype=torch.float64))


def make_weights(case: Case, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """(q_now, q_before, k_now, k_before) with q (*batch, H, d, d_h), k (*batch, H_kv, d, d_h)."""
    g = torch.Generator().manual_seed(case.seed)
    q_shape = (*case.batch, case.n_heads, case.d, case.d_head)
    k_shape = (*case.batch, case.n_kv, case.d, case.d_head)
    q_before = torch.randn(q_shape, generator=g, dtype=torch.float64)
    k_before = torch.randn(k_shape, generator=g, dtype=torch.float64)
    q_now = q_before + _update(g, q_shape, case.rank_q, case.scale)
    k_now = k_before + _update(g, k_shape, case.rank_k, case.scale)
    return tuple(t.to(dtype) for t in (q_now, q_before, k_now, k_before))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    d = draw(st.integers(2, 40))
    d_head = draw(st.integers(1, 8))
    ranks = st.one_of(st.none(), st.integers(0, d_head))  # None: dense; 0: zero update
    return Case(
        d=d,
        d_head=d_head,
        n_kv=draw(st.integers(1, 3)),
        group=draw(st.integers(1, 3)),
        batch=draw(st.sampled_from([(), (2,), (2, 2)])),
        rank_q=draw(ranks),
        rank_k=draw(ranks),
        scale=draw(st.sampled_from([1e-3, 0.1, 1.0, 10.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ---- the core requirement -----------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(case=cases())
@example(Case(2, 8, 1, 1, (), None, None, 1.0, 0))  # d < 2·d_h, even d < d_h
@example(Case(5, 3, 1, 1, (), None, None, 1.0, 1))  # d_h < d < 2·d_h
@example(Case(24, 4, 2, 3, (2,), 1, 2, 0.1, 2))  # GQA with H_kv > 1, rank-deficient updates
@example(Case(40, 8, 3, 2, (2, 2), 1, 1, 1.0, 3))  # widest core, rank-two Δ2
@example(Case(16, 4, 2, 2, (2,), 0, None, 1.0, 4))  # W_q frozen: Δ3 = 0
@example(Case(16, 4, 2, 2, (), None, 0, 1.0, 5))  # W_k frozen: Δ3 = 0
@example(Case(16, 4, 2, 2, (2,), 0, 0, 1.0, 6))  # nothing moved: Δ2 = Δ3 = 0
@example(Case(37, 3, 2, 1, (2, 2), 1, 2, 0.1, 502))  # rank-1 factor: Cholesky's √ε error
@example(Case(37, 3, 2, 1, (2, 2), 1, 2, 0.1, 502))  # rank-1 Δ3: eigh round-off, α = 1 (CI)
def test_core_spectra_match_dense_reference(case: Case) -> None:
    q_now, q_before, k_now, k_before = make_weights(case)
    sv2_ref, sv3_ref = dense_increments(q_now, q_before, k_now, k_before)
    d, d_head = case.d, case.d_head
    k = min(d, 2 * d_head)
    for method in METHODS:
        s2, s3 = qk_core_eigvals(q_now, q_before, k_now, k_before, method=method)
        assert s2.shape == s3.shape == (*case.batch, case.n_heads, k)
        assert s2.dtype == s3.dtype == torch.float64
        assert_sigma_close(compressed_sigma(s2, d), sv2_ref, RTOL, f"Δ2 σ ({method})")
        assert_sigma_close(compressed_sigma(s3, d), sv3_ref, RTOL, f"Δ3 σ ({method})")
        for alpha in (1.0, 2.0):
            out = qk_increment_spectra(q_now, q_before, k_now, k_before, alpha=alpha, method=method)
            what = f"{method}, α={alpha}"
            assert_stats_close(out.d2, sv2_ref, min(d, 2 * d_head), alpha, RTOL, f"Δ2 {what}")
            assert_stats_close(out.d3, sv3_ref, min(d, d_head), alpha, RTOL, f"Δ3 {what}")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("frozen_q", "frozen_k"), [(True, False), (False, True), (True, True)])
def test_zero_updates_follow_the_zero_matrix_convention(
    method: str, frozen_q: bool, frozen_k: bool
) -> None:
    """A frozen factor makes Δ3 exactly zero; both frozen make Δ2 zero too: every stat is 0."""
    case = Case(12, 3, 2, 2, (3,), 0 if frozen_q else None, 0 if frozen_k else None, 1.0, 7)
    q_now, q_before, k_now, k_before = make_weights(case)
    for alpha in (1.0, 2.0):
        out = qk_increment_spectra(q_now, q_before, k_now, k_before, alpha=alpha, method=method)
        for name in SpectrumStats._fields:
            assert bool((getattr(out.d3, name) == 0).all()), ("Δ3", name)
            d2 = getattr(out.d2, name)
            if frozen_q and frozen_k:
                assert bool((d2 == 0).all()), ("Δ2", name)
            else:
                assert bool((d2 > 0).all()), ("Δ2", name)


def test_gqa_pairs_query_head_with_its_group_key_head() -> None:
    """Key head g serves query heads g·G … g·G + G − 1 (repeat_interleave, not tiling)."""
    d, d_head, n_kv, group = 6, 1, 2, 2
    e = torch.eye(d, dtype=torch.float64)
    q_before = torch.stack([e[:, h : h + 1] for h in range(n_kv * group)])  # q^h = e_h
    q_now = q_before.clone()  # W_q frozen: Δ2^h = e_h ΔW_k^gᵀ, σ = ‖ΔW_k^g‖
    k_before = torch.zeros(n_kv, d, d_head, dtype=torch.float64)
    k_now = torch.stack([1.0 * e[:, 4:5], 3.0 * e[:, 5:6]])  # ‖ΔW_k^0‖ = 1, ‖ΔW_k^1‖ = 3
    s2, _ = qk_core_eigvals(q_now, q_before, k_now, k_before)
    torch.testing.assert_close(s2.amax(-1), torch.tensor([1.0, 1.0, 9.0, 9.0], dtype=torch.float64))


@pytest.mark.parametrize("method", METHODS)
def test_stacked_layers_equal_per_layer_calls(method: str) -> None:
    """Leading dimensions batch independent layers: stacking changes nothing."""
    case = Case(10, 2, 2, 2, (3,), 1, None, 0.1, 8)
    weights = make_weights(case)
    stacked = qk_increment_spectra(*weights, alpha=1.0, method=method)
    for layer in range(3):
        single = qk_increment_spectra(*(w[layer] for w in weights), alpha=1.0, method=method)
        for part in ("d2", "d3"):
            for name in SpectrumStats._fields:
                torch.testing.assert_close(
                    getattr(getattr(stacked, part), name)[layer],
                    getattr(getattr(single, part), name),
                    rtol=1e-9,
                    atol=1e-12,
                )


# ---- float32 ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("d", "d_head", "n_kv", "group"), [(32, 4, 2, 2), (48, 8, 1, 4), (64, 2, 4, 1)]
)
def test_float32_path_agrees_with_float64_reference(
    method: str, d: int, d_head: int, n_kv: int, group: int
) -> None:
    """fp32 inputs are computed in fp32; on well-conditioned updates the loss is ~1e-6."""
    case = Case(d, d_head, n_kv, group, (2,), None, None, 0.1, d + d_head)
    weights = make_weights(case, torch.float32)
    sv2_ref, sv3_ref = dense_increments(*weights)  # the fp32 values, measured in fp64
    s2, s3 = qk_core_eigvals(*weights, method=method)
    assert s2.dtype == s3.dtype == torch.float32
    assert_sigma_close(compressed_sigma(s2, d), sv2_ref, 1e-4, "Δ2 σ fp32")
    assert_sigma_close(compressed_sigma(s3, d), sv3_ref, 1e-4, "Δ3 σ fp32")
    for alpha in (1.0, 2.0):
        out = qk_increment_spectra(*weights, alpha=alpha, method=method)
        assert_stats_close(out.d2, sv2_ref, min(d, 2 * d_head), alpha, 1e-4, "Δ2 fp32")
        assert_stats_close(out.d3, sv3_ref, min(d, d_head), alpha, 1e-4, "Δ3 fp32")


def test_low_precision_weights_compute_in_float32() -> None:
    case = Case(16, 4, 1, 2, (), None, None, 0.1, 9)
    weights = [w.to(torch.bfloat16) for w in make_weights(case)]
    out = qk_increment_spectra(*weights)
    assert out.d2.entropy.dtype == torch.float32
    sv2_ref, _ = dense_increments(*weights)
    assert_stats_close(out.d2, sv2_ref, 8, 2.0, 1e-4, "Δ2 bf16")


# ---- arguments ----------------------------------------------------------------------------


def test_rejects_head_counts_that_do_not_group() -> None:
    q = torch.randn(3, 8, 2)
    k = torch.randn(2, 8, 2)
    with pytest.raises(ValueError, match="multiple"):
        qk_core_eigvals(q, q, k, k)
    with pytest.raises(ValueError, match="multiple"):
        qk_increment_spectra(q, q, k, k)


def test_rejects_unknown_core_method() -> None:
    q = torch.randn(2, 8, 2)
    with pytest.raises(ValueError, match="core method"):
        qk_core_eigvals(q, q * 2, q, q * 2, method="qr")  # type: ignore[arg-type]
