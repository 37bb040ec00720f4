"""Randomized spectra against the exact ones at large d: error and time, on CPU.

Why: the exact route (:func:`foreshock.producers.spectra.gram_eigvals`: one d×d Gram and a
symmetric eigen-solve) costs O(d³) per layer, most of the Monitor's time at d ≥ 1024. A
randomized range finder (``torch.svd_lowrank``, Halko et al. 2011: q columns, 2 power
iterations) costs O(d² q). It finds the top q singular values; the entropy also needs the
rest, so the tail's mass ‖ΔW‖_F² − Σ_{i≤q} σ_i² is spread evenly over the other n − q values
(the most entropy that mass can carry: an upper-biased estimate where the tail decays).

What is measured, per d ∈ {768, 1024, 2048, 4096} (``--quick``: 768, 1024), on ΔW = W_t − W_{t−δ}
of a d×d projection whose update is AdamW-like (the elementwise-normalized step of a gradient
with a rank-8 coherent part and a dense part: what makes the measured spectral entropy of
ΔW_q high, ~0.9, on healthy runs) and of the same with a rank-2 coherent bias added (the
low-precision attention fault's signature, entropy falling): the normalized spectral entropy
H / ln d (α = 2) exact and randomized at q ∈ {64, 256}, the absolute error (5 seeds: mean and
largest), and the time of each route. The yardstick is the detectors' resolution: the
record-to-record standard deviation of ``attn.dwq.entropy`` on the lab's healthy runs (from
``lab/runs``, d = 128) — an error well below it is invisible to a detector, one near it is
noise the warm-up scale would absorb only if it were constant.

    python -m benchmarks.randomized_spectra --quick
    python -m benchmarks.randomized_spectra

A table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from typing import Any

import torch

from ._table import emit_json, format_table

SIZES, QUICK_SIZES = (768, 1024, 2048, 4096), (768, 1024)
RANKS = (64, 256)
SEEDS = 5


def update(d: int, seed: int, fault: float) -> torch.Tensor:
    """An AdamW-like step of a d×d projection (see the module docstring), float32."""
    g = torch.Generator().manual_seed(seed)
    coherent = torch.randn(d, 8, generator=g) @ torch.randn(8, d, generator=g) / math.sqrt(8)
    grad = coherent + 0.5 * torch.randn(d, d, generator=g)
    step = grad / (grad.abs() + 1e-1)  # Adam's m / (sqrt(v) + eps) at a steady state
    if fault:
        bias = torch.randn(d, 2, generator=g) @ torch.randn(2, d, generator=g) / math.sqrt(2 * d)
        step = step + fault * bias * step.norm() / bias.norm()
    return 1e-3 * step


def exact_entropy(delta: torch.Tensor) -> float:
    from foreshock.producers.spectra import gram_eigvals, spectrum_stats

    return float(spectrum_stats(gram_eigvals(delta), min(delta.shape)).entropy)


def randomized_entropy(delta: torch.Tensor, q: int, seed: int) -> float:
    """Top-q σ² from a randomized range finder, the tail's mass spread evenly (docstring)."""
    from foreshock.producers.spectra import spectrum_stats

    torch.manual_seed(seed)
    _, s, _ = torch.svd_lowrank(delta, q=q, niter=2)
    n = min(delta.shape)
    top = s.square()
    tail = max(float(delta.square().sum()) - float(top.sum()), 0.0)
    filled = torch.cat([top, torch.full((n - q,), tail / max(n - q, 1))])
    return float(spectrum_stats(filled, n).entropy)


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def resolution() -> float | None:
    """Median over the lab's healthy recorded runs of the record-to-record standard deviation
    of attn.dwq.entropy (first differences / √2) — the detectors' yardstick."""
    from foreshock.lab.recorded import RECORDED_DIR, load_run

    spreads = []
    for path in sorted(RECORDED_DIR.glob("healthy-s*.jsonl.gz"))[:10]:
        run = load_run(path)
        for key in {
            k for r in run.records for k in r["values"] if k.startswith("attn.dwq.entropy@")
        }:
            series = [r["values"].get(key) for r in run.records[10:]]
            series = [v for v in series if v is not None]
            diffs = [b - a for a, b in itertools.pairwise(series)]
            if len(diffs) > 2:
                spreads.append(statistics.pstdev(diffs) / math.sqrt(2))
    return statistics.median(spreads) if spreads else None


def measure(d: int) -> list[dict[str, Any]]:
    rows = []
    for case, fault in (("healthy-like", 0.0), ("rank-2 bias", 3.0)):
        exact, t_exact, errors, times = [], [], {q: [] for q in RANKS}, {q: [] for q in RANKS}
        for seed in range(SEEDS):
            delta = update(d, seed, fault)
            value, seconds = timed(lambda delta=delta: exact_entropy(delta))
            exact.append(value)
            t_exact.append(seconds)
            for q in RANKS:
                est, sec = timed(lambda delta=delta, q=q, s=seed: randomized_entropy(delta, q, s))
                errors[q].append(abs(est - value))
                times[q].append(sec)
        for q in RANKS:
            rows.append({
                "d": d, "case": case, "q": q, "entropy": round(statistics.mean(exact), 4),
                "error_mean": statistics.mean(errors[q]), "error_max": max(errors[q]),
                "exact_s": statistics.median(t_exact), "randomized_s": statistics.median(times[q]),
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 768 and 1024 only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    yardstick = resolution()
    rows = [r for d in (QUICK_SIZES if args.quick else SIZES) for r in measure(d)]
    print(format_table(
        ["d", "ΔW", "q", "entropy", "error mean", "error max", "exact s", "randomized s"],
        [[r["d"], r["case"], r["q"], r["entropy"], f"{r['error_mean']:.4f}",
          f"{r['error_max']:.4f}", f"{r['exact_s']:.3f}", f"{r['randomized_s']:.3f}"]
         for r in rows],
    ))  # fmt: skip
    print(
        f"\nthe detectors' resolution (record-to-record std of attn.dwq.entropy, lab): {yardstick}"
    )
    below = [r for r in rows if yardstick and r["error_max"] < yardstick]
    emit_json({
        "benchmark": "randomized_spectra", "quick": args.quick, "seeds": SEEDS,
        "resolution": yardstick, "rows": rows,
        "below_resolution": [(r["d"], r["case"], r["q"]) for r in below],
    })  # fmt: skip


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows: per d and q, the largest error beside the resolution and
    the time against the exact route's."""
    out = []
    for r in result["rows"]:
        out.append((
            f"d = {r['d']}, {r['case']} ΔW, randomized q = {r['q']}",
            f"entropy error ≤ {r['error_max']:.4f} (resolution {result['resolution']:.4f}); "
            f"{r['randomized_s'] * 1e3:.0f} ms vs exact {r['exact_s'] * 1e3:.0f} ms",
        ))  # fmt: skip
    return out


if __name__ == "__main__":
    main()
