"""Δ2 spectra of a whole attention layer: batched compressed cores vs dense SVDs vs a head loop.

What it measures: for one layer of width d with H = d / 128 heads of d_h = 128, the time to get
every head's Δ2 = ΔW_q W_kᵀ + W_q ΔW_kᵀ spectrum (and its normalized entropy) these ways:

* batched: ``qk_increment_spectra`` as the Monitor calls it — two thin QRs of the d×2d_h
  factors [ΔW_q, W_q], [W_k, ΔW_k] for all heads at once, then the 2d_h×2d_h cores, with the
  core method "eigh" (eigvalsh of the core's Gram) and "svd" (svdvals of the core). The call
  also produces Δ3 (one more small core per head), so its time is an upper bound for Δ2 alone;
* loop: the same compression one head at a time in Python (QR of each factor, svdvals of the
  Δ2 core only) — what the batching saves; "lib loop": the library call itself on one head at
  a time ("eigh", Δ3 included), the like-for-like measure of batching;
* dense: each head's explicit d×d Δ2 in float32 and ``torch.linalg.svdvals`` of it — the
  route the compression replaces. At large d it is timed on a few heads only and extrapolated
  as H × (fastest timed head); the table and JSON say so (``dense_heads_timed``).

Accuracy: max relative error, over heads, of the per-head normalized entropy (α = 2, rank bound
min(d, 2·d_h)) against a float64 dense reference built from the same float32 weights: svdvals of
the explicit Δ2 in float64 (at d = 8192 eigvalsh of Δ2Δ2ᵀ in float64, the same σ² to ~1e-16·σ₁²,
several times cheaper); on a subset of heads where that is slow (``ref_heads``).

Why: the compressed cores are what make per-step spectral monitoring affordable; the paper
reports up to 50× over dense. Inputs are float32 (what the Monitor snapshots) with a realistic
update: ΔW = 1e-3-relative Gaussian noise plus a coherent rank-4 drift of the same norm.
Single-threaded; every time is the minimum over repeats.

    python -m benchmarks.spectra            # d = 1024, 2048, 4096, 8192 (~12 min)
    python -m benchmarks.spectra --quick    # d = 1024, 2048, dense on a subset (< 1 min)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import torch

from foreshock.producers.qk_increments import qk_increment_spectra
from foreshock.producers.spectra import spectrum_stats

from ._table import best_of, emit_json, format_table, single_thread

D_HEAD = 128
PAPER_SPEEDUP = 50.0


@dataclass(frozen=True)
class Plan:
    dims: tuple[int, ...]
    repeats: dict[int, int]  # timed calls of the batched and loop routes (min taken)
    dense_heads: dict[int, int | None]  # heads timed densely; None = all
    ref_heads: dict[int, int | None]  # heads with a float64 dense reference; None = all
    gram_ref_from: int = 8192  # d at and above which the f64 reference is eigvalsh(ΔΔᵀ)
    seed: int = 0


FULL = Plan(
    dims=(1024, 2048, 4096, 8192),
    repeats={1024: 5, 2048: 4, 4096: 3, 8192: 2},
    dense_heads={1024: None, 2048: None, 4096: 2, 8192: 1},
    ref_heads={1024: None, 2048: 4, 4096: 2, 8192: 1},
)
QUICK = Plan(
    dims=(1024, 2048),
    repeats={1024: 3, 2048: 3},
    dense_heads={1024: 4, 2048: 2},
    ref_heads={1024: 2, 2048: 2},
)


# ---- inputs -------------------------------------------------------------------------------
def make_layer(d: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(q_now, q_before, k_now, k_before), float32, shape (H, d, d_h).

    W ~ N(0, 1/d); ΔW = 1e-3·σ_W·noise + a rank-4 drift along input directions shared by all
    heads, scaled to the noise's Frobenius norm. W_now = W_before + ΔW is rounded to float32,
    so the increment the routes see is exactly what a float32 monitor sees.
    """
    g = torch.Generator().manual_seed(seed + d)
    n_heads, std = d // D_HEAD, d**-0.5
    out = []
    for _ in ("q", "k"):
        before = torch.randn(n_heads, d, D_HEAD, generator=g) * std
        noise = torch.randn(n_heads, d, D_HEAD, generator=g) * (1e-3 * std)
        drift = torch.randn(d, 4, generator=g) @ torch.randn(n_heads, 4, D_HEAD, generator=g)
        drift *= noise.norm() / drift.norm()
        out += [before + (noise + drift), before]
    return tuple(out)


def rank_bound(d: int) -> int:
    return min(d, 2 * D_HEAD)


# ---- the routes -----------------------------------------------------------------------------
def batched(layer: tuple[torch.Tensor, ...], method: str) -> torch.Tensor:
    """Per-head Δ2 entropies, (H,), by the library's batched compressed cores."""
    return qk_increment_spectra(*layer, method=method).d2.entropy  # type: ignore[arg-type]


def head_loop(layer: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Per-head Δ2 entropies by the same compression, one head at a time."""
    q_now, q_before, k_now, k_before = layer
    d = q_now.shape[-2]
    sigma_sq = []
    for h in range(q_now.shape[0]):
        dq, dk = q_now[h] - q_before[h], k_now[h] - k_before[h]
        r_a = torch.linalg.qr(torch.cat([dq, q_before[h]], -1), mode="r").R
        r_b = torch.linalg.qr(torch.cat([k_before[h], dk], -1), mode="r").R
        sigma_sq.append(torch.linalg.svdvals(r_a @ r_b.T).square())
    return spectrum_stats(torch.stack(sigma_sq), rank_bound(d)).entropy


def lib_loop(layer: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Per-head Δ2 entropies by the library call ("eigh") on one head at a time: the same work
    as ``batched`` (Δ3 included), so batched vs this is exactly what batching buys."""
    n_heads = layer[0].shape[0]
    return torch.cat([batched(tuple(t[h : h + 1] for t in layer), "eigh") for h in range(n_heads)])


def dense_delta2(layer: tuple[torch.Tensor, ...], h: int, dtype: torch.dtype) -> torch.Tensor:
    """Head h's explicit d×d Δ2 = ΔW_q W_kᵀ + W_q ΔW_kᵀ in ``dtype``."""
    q_now, q_before, k_now, k_before = (t[h].to(dtype) for t in layer)
    return (q_now - q_before) @ k_before.T + q_before @ (k_now - k_before).T


def dense_head(layer: tuple[torch.Tensor, ...], h: int) -> torch.Tensor:
    """Head h's Δ2 entropy by float32 svdvals of the explicit d×d matrix (scalar tensor)."""
    sigma = torch.linalg.svdvals(dense_delta2(layer, h, torch.float32))
    return spectrum_stats(sigma.square(), rank_bound(sigma.shape[-1])).entropy


def reference_head(layer: tuple[torch.Tensor, ...], h: int, gram: bool) -> float:
    """Head h's Δ2 entropy in float64 from the same float32 weights (the error reference)."""
    delta = dense_delta2(layer, h, torch.float64)
    if gram:
        sigma_sq = torch.linalg.eigvalsh(delta @ delta.T)
    else:
        sigma_sq = torch.linalg.svdvals(delta).square()
    return spectrum_stats(sigma_sq, rank_bound(delta.shape[-1])).entropy.item()


def max_rel_err(values: torch.Tensor, ref: dict[int, float]) -> float:
    return max(abs(values[h].item() - r) / abs(r) for h, r in ref.items())


# ---- one width -------------------------------------------------------------------------------
def bench_width(d: int, plan: Plan, log: bool) -> dict[str, object]:
    start = time.perf_counter()
    layer = make_layer(d, plan.seed)
    n_heads = d // D_HEAD
    small = d <= 2048  # defaults for widths outside the plan (--dims)
    reps = plan.repeats.get(d, 3 if small else 2)

    t_eigh, e_eigh = best_of(lambda: batched(layer, "eigh"), reps)
    t_svd, e_svd = best_of(lambda: batched(layer, "svd"), reps)
    t_loop, e_loop = best_of(lambda: head_loop(layer), reps)
    t_lib_loop, _ = best_of(lambda: lib_loop(layer), reps)
    if log:
        print(
            f"  d={d}: eigh {t_eigh:.3g}s  svd {t_svd:.3g}s  loop {t_loop:.3g}s  "
            f"lib loop {t_lib_loop:.3g}s",
            flush=True,
        )

    n_dense = plan.dense_heads.get(d, None if small else 2) or n_heads
    dense_times, e_dense = [], {}
    for h in range(min(n_dense, n_heads)):
        tick = time.perf_counter()
        e_dense[h] = dense_head(layer, h).item()
        dense_times.append(time.perf_counter() - tick)
    t_dense = n_heads * min(dense_times)  # per-head minimum × H (heads are identical work)
    if log:
        print(f"  d={d}: dense {min(dense_times):.3g}s/head × {n_heads}", flush=True)

    gram = d >= plan.gram_ref_from
    n_ref = min(plan.ref_heads.get(d, None if small else 2) or n_heads, n_heads)
    ref = {h: reference_head(layer, h, gram) for h in range(n_ref)}
    t_best = min(t_eigh, t_svd)
    row: dict[str, object] = {
        "d": d,
        "heads": n_heads,
        "batched_eigh_s": t_eigh,
        "batched_svd_s": t_svd,
        "loop_s": t_loop,
        "lib_loop_eigh_s": t_lib_loop,
        "dense_s": t_dense,
        "dense_heads_timed": len(dense_times),
        "dense_extrapolated": len(dense_times) < n_heads,
        "dense_measured_sum_s": sum(dense_times) if len(dense_times) == n_heads else None,
        "speedup_dense_over_eigh": t_dense / t_eigh,
        "speedup_dense_over_svd": t_dense / t_svd,
        "speedup_loop_over_eigh": t_loop / t_eigh,
        "speedup_loop_over_svd": t_loop / t_svd,
        "speedup_lib_loop_over_eigh": t_lib_loop / t_eigh,
        "speedup_dense_over_best": t_dense / t_best,
        "err_eigh": max_rel_err(e_eigh, ref),
        "err_svd": max_rel_err(e_svd, ref),
        "err_loop": max_rel_err(e_loop, ref),
        "err_dense_f32": max(
            (abs(e_dense[h] - r) / abs(r) for h, r in ref.items() if h in e_dense),
            default=float("nan"),
        ),
        "ref_heads": n_ref,
        "ref_method": "f64 eigvalsh(Δ2Δ2ᵀ)" if gram else "f64 svdvals(Δ2)",
        "entropy_ref_range": [min(ref.values()), max(ref.values())],
        "repeats": reps,
        "wall_s": time.perf_counter() - start,
    }
    return row


def table(rows: list[dict[str, object]]) -> str:
    headers = [
        "d",
        "H",
        "eigh s",
        "svd s",
        "loop s",
        "dense s",
        "dense heads",
        "dense/eigh",
        "dense/svd",
        "loop/eigh",
        "loop/svd",
        "lib loop/eigh",
        "err eigh",
        "err svd",
        "err loop",
        "err dense32",
        "ref heads",
    ]
    body = []
    for r in rows:
        heads = f"{r['dense_heads_timed']}/{r['heads']}" + ("*" if r["dense_extrapolated"] else "")
        body.append(
            [
                r["d"],
                r["heads"],
                r["batched_eigh_s"],
                r["batched_svd_s"],
                r["loop_s"],
                r["dense_s"],
                heads,
                f"{r['speedup_dense_over_eigh']:.1f}x",
                f"{r['speedup_dense_over_svd']:.1f}x",
                f"{r['speedup_loop_over_eigh']:.2f}x",
                f"{r['speedup_loop_over_svd']:.2f}x",
                f"{r['speedup_lib_loop_over_eigh']:.2f}x",
                f"{r['err_eigh']:.1e}",
                f"{r['err_svd']:.1e}",
                f"{r['err_loop']:.1e}",
                f"{r['err_dense_f32']:.1e}",
                f"{r['ref_heads']}/{r['heads']}",
            ]
        )
    return format_table(headers, body)


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per layer width d: how many times
    faster the compressed cores are than the dense SVD of every head's d×d Δ2, and the smaller
    entropy error of the two ways (eigh, SVD)."""
    return [
        (
            f"compressed cores vs dense SVD of each head's d×d Δ2, one layer, d = {x['d']} "
            f"({x['heads']} heads of {result['d_head']})",
            f"{x['speedup_dense_over_best']:.0f}× faster; entropy error "
            f"{min(x['err_eigh'], x['err_svd']):.1e}",
        )
        for x in result["results"]
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 1024, 2048; dense on a subset")
    parser.add_argument("--dims", type=int, nargs="*", help="override the widths d")
    args = parser.parse_args(argv)
    single_thread()
    plan = QUICK if args.quick else FULL
    dims = tuple(args.dims) if args.dims else plan.dims
    if any(d % D_HEAD for d in dims):
        parser.error(f"every d must be a multiple of {D_HEAD}")

    start = time.perf_counter()
    mode = "quick" if args.quick else "full"
    print(f"Δ2 spectra of one layer, d_h={D_HEAD}, float32, 1 thread ({mode})")
    rows = [bench_width(d, plan, log=True) for d in dims]
    wall = time.perf_counter() - start

    print()
    print(table(rows))
    best = max(rows, key=lambda r: r["speedup_dense_over_best"])  # type: ignore[arg-type,return-value]
    print()
    print("times: seconds per layer (all H heads), min over repeats; * = dense extrapolated as")
    print("H × fastest timed head. Batched times include Δ3 (the library call computes both);")
    print("loop = Δ2 only, QR + svdvals per head; lib loop = the library call per head (Δ3 too).")
    print("err: max over ref heads of |entropy − f64 dense entropy| / f64 dense entropy.")
    print(
        f"best dense/batched speedup: {best['speedup_dense_over_best']:.0f}x at d={best['d']} "
        f"(paper: up to {PAPER_SPEEDUP:.0f}x); wall {wall:.0f}s"
    )
    emit_json(
        {
            "benchmark": "spectra",
            "quick": args.quick,
            "d_head": D_HEAD,
            "dtype": "float32",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "results": rows,
            "best_speedup_dense_over_batched": best["speedup_dense_over_best"],
            "best_speedup_at_d": best["d"],
            "paper_speedup": PAPER_SPEEDUP,
            "wall_s": wall,
        }
    )


if __name__ == "__main__":
    main()
