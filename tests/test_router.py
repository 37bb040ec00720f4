"""Router monitors against known distributions and brute-force float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.producers.router import (
    RoutingAccumulator,
    conditioning_ratio,
    cosine_lower_bound,
    expert_load_stats,
    mean_pairwise_cosine,
    token_entropy,
)

torch.set_num_threads(1)

INF = math.inf


# ---- references ---------------------------------------------------------------------------


def entropy_ref(logits: np.ndarray) -> np.ndarray:
    """H(softmax(logits)) per row in float64 numpy, with 0 ln 0 = 0."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    return -terms.sum(-1)


def cosine_matrix(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    unit = w / np.linalg.norm(w, axis=-1, keepdims=True)
    return unit @ unit.T


def off_diagonal(m: np.ndarray) -> np.ndarray:
    return m[~np.eye(m.shape[0], dtype=bool)]


# ---- token_entropy ------------------------------------------------------------------------


@pytest.mark.parametrize("n_experts", [2, 3, 8, 64])
def test_token_entropy_uniform_is_log_e(n_experts: int) -> None:
    for value in (0.0, 7.5, -3.0):
        h = token_entropy(torch.full((5, n_experts), value))
        torch.testing.assert_close(h, torch.full((5,), math.log(n_experts)))


def test_token_entropy_one_hot_is_zero() -> None:
    assert token_entropy(torch.tensor([0.0, -1e4, -1e4, -1e4])).item() == pytest.approx(0, abs=1e-9)
    # A true one-hot needs −inf logits (masked experts): 0 ln 0 = 0, not NaN.
    assert token_entropy(torch.tensor([5.0, -INF, -INF, -INF])).item() == pytest.approx(0, abs=1e-9)
    assert token_entropy(torch.tensor([-INF, 1.0])).item() == pytest.approx(0, abs=1e-9)


def test_token_entropy_two_point_distribution() -> None:
    """logits (0, ln 3): p = (1/4, 3/4), H = ln 4 − (3/4) ln 3; masked experts add nothing."""
    expected = math.log(4) - 0.75 * math.log(3)
    got = token_entropy(torch.tensor([0.0, math.log(3)])).item()
    assert got == pytest.approx(expected, abs=1e-6)
    masked = torch.tensor([[0.0, -INF, math.log(3), -INF], [-INF, 0.0, -INF, math.log(3)]])
    torch.testing.assert_close(token_entropy(masked), torch.full((2,), expected))


def test_token_entropy_propagates_nan_logits() -> None:
    """A NaN logit is a broken router, not a confident one: it must not read as entropy 0."""
    assert math.isnan(token_entropy(torch.tensor([0.0, math.nan, 1.0])).item())


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(7,), (3, 5), (2, 3, 4)]),
    n_experts=st.integers(2, 32),
    log_scale=st.floats(-3.0, 4.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_token_entropy_matches_numpy(
    shape: tuple[int, ...], n_experts: int, log_scale: float, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, n_experts, generator=g) * math.exp(log_scale)
    h = token_entropy(logits)
    assert h.shape == shape
    np.testing.assert_allclose(h.numpy(), entropy_ref(logits.numpy()), rtol=0, atol=2e-6)
    assert bool((h >= 0).all()) and bool((h <= math.log(n_experts) + 1e-6).all())


# ---- expert_load_stats --------------------------------------------------------------------


@pytest.mark.parametrize("n_experts", [2, 4, 16])
def test_expert_load_balanced(n_experts: int) -> None:
    h, v = expert_load_stats(torch.full((n_experts,), 12.0))
    assert h.item() == pytest.approx(1.0, abs=1e-6)
    assert v.item() == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("n_experts", [2, 4, 16])
def test_expert_load_collapsed(n_experts: int) -> None:
    load = torch.zeros(n_experts)
    load[n_experts // 2] = 100.0
    h, v = expert_load_stats(load)
    assert h.item() == pytest.approx(0, abs=1e-9)
    assert v.item() == pytest.approx(n_experts - 1)


def test_expert_load_hand_computed() -> None:
    # load (2, 1, 1, 0): q = (1/2, 1/4, 1/4, 0), H = (1/2) ln 2 + (1/2) ln 4 = (3/2) ln 2,
    # H / ln 4 = 3/4; mean load 1, MaxVio = 2/1 − 1 = 1.
    h, v = expert_load_stats(torch.tensor([2, 1, 1, 0]))
    assert h.item() == pytest.approx(0.75, abs=1e-6)
    assert v.item() == pytest.approx(1.0, abs=1e-6)
    # load (3, 1): H = −(3/4 ln 3/4 + 1/4 ln 1/4) / ln 2, MaxVio = 3/2 − 1.
    h, v = expert_load_stats(torch.tensor([3.0, 1.0]))
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert h.item() == pytest.approx(expected, abs=1e-6)
    assert v.item() == pytest.approx(0.5, abs=1e-6)


# ---- mean_pairwise_cosine -----------------------------------------------------------------


@st.composite
def router_weights(draw: st.DrawFn) -> torch.Tensor:
    """E×d router rows: Gaussian around a common direction of drawn strength (0 = isotropic)."""
    n_experts = draw(st.integers(2, 16))
    d = draw(st.integers(1, 16))
    common = draw(st.sampled_from([0.0, 0.5, 2.0, 10.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    base = torch.randn(1, d, generator=g)
    w = common * base + torch.randn(n_experts, d, generator=g)
    return w * draw(st.sampled_from([1e-3, 1.0, 1e3]))


@settings(max_examples=80, deadline=None)
@given(w=router_weights())
def test_mean_pairwise_cosine_equals_brute_force(w: torch.Tensor) -> None:
    expected = off_diagonal(cosine_matrix(w.numpy())).mean()
    assert mean_pairwise_cosine(w).item() == pytest.approx(expected, abs=1e-5)


def test_mean_pairwise_cosine_known_values() -> None:
    assert mean_pairwise_cosine(torch.eye(4)).item() == pytest.approx(0.0, abs=1e-7)
    assert mean_pairwise_cosine(torch.ones(3, 2) * 5).item() == pytest.approx(1.0, abs=1e-6)
    # Antipodal pair: cos = −1. Regular simplex of E unit vectors: cos = −1/(E − 1).
    assert mean_pairwise_cosine(torch.tensor([[1.0, 2.0], [-1.0, -2.0]])).item() == (
        pytest.approx(-1.0, abs=1e-6)
    )
    simplex = torch.eye(5) - 1.0 / 5
    assert mean_pairwise_cosine(simplex).item() == pytest.approx(-0.25, abs=1e-6)


# ---- conditioning_ratio and the cosine floor ----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(w=router_weights())
def test_conditioning_ratio_equals_hand_computation(w: torch.Tensor) -> None:
    x = w.numpy().astype(np.float64)
    w_bar = x.mean(0)
    expected = np.linalg.norm(x - w_bar, axis=-1).max() / np.linalg.norm(w_bar)
    assert conditioning_ratio(w).item() == pytest.approx(expected, rel=1e-4)


def test_conditioning_ratio_is_exact_where_rows_nearly_agree() -> None:
    """Rows equal to −0.005 up to 1e-6: ε ≈ 2e-4, where w_e − w̄ cancels all but three
    digits. In float32 ε was off by up to 1.2e-4 of itself (a flaky property test in CI);
    in float64 it is the hand computation's to 1e-9 (a BLAS's last bits aside)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        w = torch.full((4, 16), -0.005) + 1e-6 * torch.randn(4, 16, generator=g)
        x = w.numpy().astype(np.float64)
        w_bar = x.mean(0)
        expected = np.linalg.norm(x - w_bar, axis=-1).max() / np.linalg.norm(w_bar)
        assert conditioning_ratio(w).item() == pytest.approx(expected, rel=1e-9)


def test_conditioning_ratio_zero_mean_is_inf() -> None:
    assert conditioning_ratio(torch.tensor([[1.0, 2.0], [-1.0, -2.0]])).item() == INF


@settings(max_examples=80, deadline=None)
@given(
    n_experts=st.integers(2, 16),
    d=st.integers(2, 16),
    scale=st.floats(1e-4, 0.3),
    seed=st.integers(0, 2**31 - 1),
)
def test_cosine_floor_holds_for_every_pair(n_experts: int, d: int, scale: float, seed: int) -> None:
    """Rows w̄ + r_e with ‖r_e‖ ≤ scale·‖w̄‖: ε < 1 and every pair has cos ≥ 1 − 2ε²."""
    g = torch.Generator().manual_seed(seed)
    center = torch.randn(d, generator=g, dtype=torch.float64)
    directions = torch.nn.functional.normalize(
        torch.randn(n_experts, d, generator=g, dtype=torch.float64), dim=-1
    )
    lengths = scale * center.norm() * torch.rand(n_experts, 1, generator=g, dtype=torch.float64)
    w = (center + lengths * directions).float()  # the rows the router actually holds
    eps = conditioning_ratio(w).item()
    # Around the rows' own mean ε ≤ 2·scale / (1 − scale) < 1: the floor is never vacuous here.
    assert eps < 1.0
    floor = cosine_lower_bound(torch.tensor(eps)).item()
    assert floor == pytest.approx(1.0 - 2.0 * eps**2, abs=1e-7)
    cos = off_diagonal(cosine_matrix(w.numpy()))
    worst = cos.min()
    assert worst < 1.0  # the rows do spread: the floor constrains something
    # 1 − cos ≤ 2ε², compared in 1 − cos so small ε keeps its resolution; the 1e-6 slack on ε
    # covers ε being computed in float32.
    assert 1.0 - worst <= 2.0 * (eps + 1e-6) ** 2
    assert worst >= floor - 1e-6


def tangent_rows(eps: float, d: int, seed: int) -> np.ndarray:
    """Four rows with mean w̄ and conditioning ratio ε whose worst pair meets the floor exactly.

    In the plane of w̄ (unit, u) and a unit v ⟂ u: two rows (1 − ε²) u ± ε√(1 − ε²) v sit at
    angle arcsin ε to w̄, at distance exactly ε from it (their residuals are tangent to the
    cone), so they are 2·arcsin ε apart: cos = cos(2 arcsin ε) = 1 − 2ε². Two rows (1 + ε²) u
    restore the mean to w̄ and lie only ε² < ε from it.
    """
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    u, v = basis[:, 0], basis[:, 1]
    side = eps * math.sqrt(1.0 - eps**2) * v
    return np.stack(
        [(1 - eps**2) * u + side, (1 - eps**2) * u - side, (1 + eps**2) * u, (1 + eps**2) * u]
    )


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.01, 0.95), d=st.integers(2, 12), seed=st.integers(0, 2**31 - 1))
def test_cosine_floor_is_tight(eps: float, d: int, seed: int) -> None:
    rows = tangent_rows(eps, d, seed)
    np.testing.assert_allclose(rows.mean(0), rows[2] / (1 + eps**2), atol=1e-12)  # = w̄ = u
    measured = conditioning_ratio(torch.from_numpy(rows)).item()
    assert measured == pytest.approx(eps, rel=1e-5)
    cos = off_diagonal(cosine_matrix(rows))
    worst = cos.min()
    assert worst == pytest.approx(1.0 - 2.0 * eps**2, abs=1e-12)  # the floor is attained
    assert worst >= cosine_lower_bound(torch.tensor(eps, dtype=torch.float64)).item() - 1e-12
    # Any smaller ε would claim a floor these rows violate: the bound cannot be improved.
    assert worst < 1.0 - 2.0 * (0.99 * eps) ** 2


# ---- RoutingAccumulator -------------------------------------------------------------------


@st.composite
def routing_batches(draw: st.DrawFn) -> tuple[int, int | None, int, list[torch.Tensor]]:
    """(E, top_k, bins, micro-batches of logits (..., E)) with per-token temperatures."""
    n_experts = draw(st.integers(2, 16))
    top_k = draw(st.one_of(st.none(), st.integers(1, n_experts)))
    bins = draw(st.sampled_from([10, 100, 1000]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batches = []
    for shape in draw(
        st.lists(st.sampled_from([(5,), (3, 4), (2, 2, 8), (40,)]), min_size=1, max_size=4)
    ):
        temperature = torch.empty(*shape, 1).uniform_(-2.0, 4.0, generator=g).exp()
        batches.append(torch.randn(*shape, n_experts, generator=g) * temperature)
    return n_experts, top_k, bins, batches


@settings(max_examples=80, deadline=None)
@given(case=routing_batches())
def test_accumulator_matches_brute_force(
    case: tuple[int, int | None, int, list[torch.Tensor]],
) -> None:
    n_experts, top_k, bins, batches = case
    acc = RoutingAccumulator(n_experts, top_k, bins=bins)
    for logits in batches:  # gradient-accumulation micro-batches
        acc.update(logits)
    out = acc.summary()

    flat = torch.cat([b.reshape(-1, n_experts) for b in batches])
    h_norm = entropy_ref(flat.numpy()) / math.log(n_experts)
    assert not acc.empty
    assert out["token_entropy_norm"].item() == pytest.approx(h_norm.mean(), abs=1e-6)
    assert out["token_entropy"].item() == pytest.approx(
        h_norm.mean() * math.log(n_experts), abs=1e-6
    )
    # Min: a running reduction of the same per-token values, so it is the batch-free minimum.
    brute_min = (token_entropy(flat) / math.log(n_experts)).min()
    torch.testing.assert_close(out["token_entropy_norm_min"], brute_min, rtol=1e-6, atol=1e-7)
    assert out["token_entropy_norm_min"].item() == pytest.approx(h_norm.min(), abs=1e-6)
    # p05 is the lower edge of the histogram bin holding the 5th percentile, so it lies within
    # one bin below the lower (inverted-CDF) sample quantile. Linear interpolation is not the
    # right comparison: with 1 token at 0 and 19 at 1 it gives 0.95, while the 5% quantile is 0.
    q05 = float(np.quantile(h_norm, 0.05, method="inverted_cdf"))
    p05 = out["token_entropy_norm_p05"].item()
    assert p05 <= q05 + 1e-6
    assert q05 <= p05 + 1.0 / bins + 1e-6

    if top_k is None:
        assert "load_entropy" not in out and "load_maxvio" not in out
        return
    chosen = np.argsort(-flat.numpy(), axis=-1, kind="stable")[:, :top_k]
    counts = np.bincount(chosen.ravel(), minlength=n_experts).astype(np.float64)
    assert counts.sum() == top_k * flat.shape[0]
    np.testing.assert_array_equal(acc._load.numpy(), counts)
    q = counts / counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        load_h = -np.where(q > 0, q * np.log(q), 0.0).sum() / math.log(n_experts)
    assert out["load_entropy"].item() == pytest.approx(load_h, abs=1e-6)
    assert out["load_maxvio"].item() == pytest.approx(counts.max() / counts.mean() - 1, abs=1e-5)


def test_accumulator_percentile_on_a_known_mix() -> None:
    """1 sharp token (h = 0) in 20, the rest uniform (h = 1): the 5% point is exactly 0."""
    logits = torch.zeros(20, 4)
    logits[7] = torch.tensor([0.0, -INF, -INF, -INF])
    acc = RoutingAccumulator(4, top_k=2, bins=50)
    acc.update(logits)
    out = acc.summary()
    assert out["token_entropy_norm_p05"].item() == 0.0
    assert out["token_entropy_norm_min"].item() == 0.0
    assert out["token_entropy_norm"].item() == pytest.approx(19 / 20, abs=1e-6)
    acc.update(torch.zeros(20, 4))  # 1 sharp token in 40 now: the 5% point is uniform
    assert acc.summary()["token_entropy_norm_p05"].item() == pytest.approx(1.0, abs=1 / 50)


def test_accumulator_with_masked_experts_stays_finite() -> None:
    logits = torch.randn(6, 8)
    logits[:, 6:] = -INF  # two experts masked out for every token
    acc = RoutingAccumulator(8, top_k=2)
    acc.update(logits)
    out = acc.summary()
    for name, value in out.items():
        assert math.isfinite(value.item()), name
    h_norm = entropy_ref(logits.numpy()) / math.log(8)
    assert out["token_entropy_norm"].item() == pytest.approx(h_norm.mean(), abs=1e-6)
    assert acc._load[6:].sum().item() == 0


def test_accumulator_reset() -> None:
    g = torch.Generator().manual_seed(0)
    first, second = torch.randn(4, 7, 6, generator=g), torch.randn(9, 6, generator=g)
    acc = RoutingAccumulator(6, top_k=2, bins=100)
    acc.update(first)
    acc.reset()
    assert acc.empty
    assert acc.summary() == {}
    acc.update(second)
    fresh = RoutingAccumulator(6, top_k=2, bins=100)
    fresh.update(second)
    got, expected = acc.summary(), fresh.summary()
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].item() == pytest.approx(expected[name].item(), rel=1e-6, abs=1e-9), name


def test_accumulator_empty_summary() -> None:
    acc = RoutingAccumulator(4, top_k=None)
    assert acc.empty
    assert acc.summary() == {}


@pytest.mark.parametrize(
    ("n_experts", "top_k", "bins", "match"),
    [
        (1, None, 1000, "experts"),
        (0, None, 1000, "experts"),
        (4, 0, 1000, "top_k"),
        (4, 5, 1000, "top_k"),
        (4, -1, 1000, "top_k"),
        (4, 2, 0, "bins"),
        (4, 2, -3, "bins"),
    ],
)
def test_accumulator_rejects_bad_arguments(
    n_experts: int, top_k: int | None, bins: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        RoutingAccumulator(n_experts, top_k, bins=bins)
