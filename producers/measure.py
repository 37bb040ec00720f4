"""One monitoring step's measurements, as (keys, values-on-device) chunks.

Layers of the same shape are stacked so that a whole model's Δ2/Δ3 spectra take two QRs and
two batched eigen-solves per shape group, not a Python loop of SVDs. Values stay on the
device; the Monitor moves them to the host in one transfer.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Any

import torch

from foreshock.transport.records import series_key

from .layouts import AttentionSpec, RouterSpec
from .qk_increments import qk_increment_spectra
from .router import conditioning_ratio, cosine_lower_bound, mean_pairwise_cosine
from .spectra import SpectrumStats, compute_dtype, gram_eigvals, spectrum_stats

__all__ = [
    "ATTENTION_LAYER_METRICS",
    "attention_chunks",
    "attention_inputs",
    "router_geometry_chunk",
    "router_geometry_of",
    "solve_attention",
]

Chunk = tuple[list[str], torch.Tensor]

_STATS = ("entropy", "erank", "srank", "fro")
ATTENTION_LAYER_METRICS = (
    *(f"attn.dwq.{s}" for s in _STATS),
    *(f"attn.dwk.{s}" for s in _STATS),
    *(
        f"attn.{inc}.{s}"
        for inc in ("d2", "d3")
        for s in ("entropy_mean", "entropy_min", "erank_mean", "srank_mean", "fro")
    ),
)
_LAYER_ONLY = tuple(m for m in ATTENTION_LAYER_METRICS if not m.startswith("attn.dw"))


@lru_cache(maxsize=64)
def _layer_keys(names: tuple[str, ...], n_heads: int, per_head: bool, with_dw: bool) -> list[str]:
    metrics = ATTENTION_LAYER_METRICS if with_dw else _LAYER_ONLY
    keys = []
    for name in names:
        keys += [series_key(m, name) for m in metrics]
        if per_head:
            keys += [
                series_key(f"attn.{inc}.entropy", name, h)
                for inc in ("d2", "d3")
                for h in range(n_heads)
            ]
    return keys


def _stack_stats(s: SpectrumStats) -> list[torch.Tensor]:
    return [s.entropy, s.effective_rank, s.stable_rank, s.frobenius]


def _increment_layer_stats(s: SpectrumStats) -> list[torch.Tensor]:
    """Per-layer aggregates over heads (…, H) → (…): mean/min entropy, total Frobenius."""
    return [
        s.entropy.mean(-1),
        s.entropy.amin(-1),
        s.effective_rank.mean(-1),
        s.stable_rank.mean(-1),
        s.frobenius.square().sum(-1).sqrt(),
    ]


def _weight_update_stats(
    q_now: torch.Tensor,
    q_before: torch.Tensor,
    k_now: torch.Tensor,
    k_before: torch.Tensor,
    alpha: float,
) -> list[torch.Tensor]:
    """ΔW_q then ΔW_k stats (4 + 4 columns of (L,)), each layer's whole matrix (d', H·d_h).

    Where ΔW_q and ΔW_k have the same shape (H = H_kv), both go through one batched Gram
    eigen-solve. The difference is formed in float32, as ``update_spectrum`` does.
    """
    dtype = compute_dtype(q_now)
    pairs = ((q_now, q_before), (k_now, k_before))
    if q_now.shape != k_now.shape:  # GQA: fewer key heads
        deltas = [_layer_delta(now, before, dtype) for now, before in pairs]
        stats = [spectrum_stats(gram_eigvals(d), min(d.shape[-2:]), alpha) for d in deltas]
        return _stack_stats(stats[0]) + _stack_stats(stats[1])
    n_layers, n_heads, d, d_head = q_now.shape
    both = q_now.new_empty(2, n_layers, d, n_heads * d_head, dtype=dtype)  # [ΔW_q, ΔW_k]
    for out, (now, before) in zip(both, pairs, strict=True):
        _layer_delta(now, before, dtype, out=out)
    joint = spectrum_stats(gram_eigvals(both.flatten(0, 1)), min(d, n_heads * d_head), alpha)
    return [s[:n_layers] for s in _stack_stats(joint)] + [s[n_layers:] for s in _stack_stats(joint)]


def _layer_delta(
    now: torch.Tensor, before: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(L, H, d', d_h) heads → the layers' whole ΔW (L, d', H·d_h), heads side by side, written
    in ``dtype`` straight into that layout."""
    n_layers, n_heads, d, d_head = now.shape
    if out is None:
        out = now.new_empty(n_layers, d, n_heads * d_head, dtype=dtype)
    heads = out.view(n_layers, d, n_heads, d_head).transpose(1, 2)  # (L, H, d', d_h) view
    torch.sub(now.to(dtype), before.to(dtype), out=heads)
    return out


def _group_key(spec: AttentionSpec) -> tuple[Any, ...]:
    q = spec.q_weight
    return (spec.n_heads, spec.n_kv_heads, spec.model_dim, spec.head_dim, q.dtype, q.device)


def attention_chunks(
    specs: list[AttentionSpec],
    snapshots: dict[str, tuple[torch.Tensor, torch.Tensor]],
    config: Any,
) -> list[Chunk]:
    """Spectra of ΔW_q, ΔW_k, Δ2, Δ3 for every layer with a previous snapshot; then snapshot.

    A layer whose weights (now or at the snapshot) are not finite gets NaN values (emitted as
    null with a ``nonfinite@layer`` flag) instead of an error; its inputs are zeroed first so
    the eigen-solvers never see NaN.
    """
    return solve_attention(attention_inputs(specs, snapshots, config), config)


def attention_inputs(
    specs: list[AttentionSpec],
    snapshots: dict[str, tuple[torch.Tensor, torch.Tensor]],
    config: Any,
) -> list[tuple[Any, ...]]:
    """What the spectra read, copied now: per batch of same-shape layers with a snapshot,
    (specs, W_q now, W_q before, W_k now, W_k before) as stacked heads; the snapshots move
    on to now. Nothing after this reads the live weights (:mod:`.spectra_worker`)."""
    groups: dict[tuple[Any, ...], list[AttentionSpec]] = defaultdict(list)
    for spec in specs:
        groups[_group_key(spec)].append(spec)
    jobs = []
    for group in groups.values():
        q_now = torch.stack([s.heads("q") for s in group])  # (L, H, d', d_h), a copy
        k_now = torch.stack([s.heads("k") for s in group])  # (L, H_kv, d', d_h)
        before = [snapshots.get(s.name) for s in group]
        for i, spec in enumerate(group):
            snapshots[spec.name] = (q_now[i], k_now[i])
        held = [b for b in before if b is not None]
        if len(held) < len(before):
            continue
        q_before = torch.stack([b[0] for b in held])
        k_before = torch.stack([b[1] for b in held])
        per_layer = q_now[0].numel() * 2  # elements of one layer's [ΔW_q, W_q] factor
        step = max(1, config.batch_elements // per_layer)  # bounds the transient working set
        for i in range(0, len(group), step):
            part = slice(i, i + step)
            jobs.append((group[part], q_now[part], q_before[part], k_now[part], k_before[part]))
    return jobs


def solve_attention(jobs: list[tuple[Any, ...]], config: Any) -> list[Chunk]:
    """The spectra of ``attention_inputs``' jobs (any thread: they read only the copies)."""
    return [_group_chunk(g, q_now, q_before, k_now, k_before, config)
            for g, q_now, q_before, k_now, k_before in jobs]  # fmt: skip


def _group_chunk(
    group: list[AttentionSpec],
    q_now: torch.Tensor,
    q_before: torch.Tensor,
    k_now: torch.Tensor,
    k_before: torch.Tensor,
    config: Any,
) -> Chunk:
    tensors = (q_now, q_before, k_now, k_before)
    # A sum is NaN/inf iff an entry is (or, for absurd weights, it overflows): one cheap pass.
    finite = torch.stack([t.float().sum((1, 2, 3)).isfinite() for t in tensors]).all(0)  # (L,)
    if not bool(finite.all()):  # a device sync, only to skip four copies in the normal case
        q_now, q_before, k_now, k_before = (t.nan_to_num(0.0, 0.0, 0.0) for t in tensors)
    inc = qk_increment_spectra(
        q_now, q_before, k_now, k_before, config.alpha, config.core_method
    )  # fields (L, H)
    columns: list[torch.Tensor] = []
    if config.weight_spectra:
        columns += _weight_update_stats(q_now, q_before, k_now, k_before, config.alpha)
    columns += _increment_layer_stats(inc.d2) + _increment_layer_stats(inc.d3)
    values = torch.stack(columns, dim=1)  # (L, n_layer_metrics)
    if config.per_head:
        values = torch.cat([values, inc.d2.entropy, inc.d3.entropy], dim=1)
    values = values.masked_fill(~finite.unsqueeze(1), float("nan"))
    names = tuple(s.name for s in group)
    keys = _layer_keys(names, group[0].n_heads, config.per_head, config.weight_spectra)
    return keys, values.flatten()


def router_geometry_chunk(spec: RouterSpec) -> Chunk:
    """Router-weight geometry: mean pairwise cosine, ε and the cosine floor it implies.

    (The routing entropies come from the forward hooks' accumulators, combined over ranks.)"""
    return router_geometry_of(spec.name, spec.rows())  # (E, d[+1]): [W | b] with a bias


def router_geometry_of(name: str, weight: torch.Tensor) -> Chunk:
    """:func:`router_geometry_chunk` of router ``name``'s rows ``weight`` (any thread, from a
    copy: :mod:`.spectra_worker`)."""
    eps = conditioning_ratio(weight)
    stats = {
        "cosine_mean": mean_pairwise_cosine(weight),
        "epsilon": eps,
        "cosine_floor": cosine_lower_bound(eps),
    }
    keys = [series_key(f"router.{stat}", name) for stat in stats]
    return keys, torch.stack(
        [v.to(weight.device, torch.float32).reshape(()) for v in stats.values()]
    )
