"""Float64 numpy references shared by the exactness tests."""

import math

import numpy as np

from foreshock.producers.spectra import SpectrumStats


def reference_stats(sigma: np.ndarray, rank_bound: int, alpha: float) -> dict[str, float]:
    """Every statistic of one matrix from its singular values σ (not σ²), in float64 numpy."""
    sigma = np.asarray(sigma, dtype=np.float64)
    total_sq = float(np.sum(sigma**2))
    if total_sq == 0.0:
        return dict.fromkeys(SpectrumStats._fields, 0.0)
    weights = sigma**alpha
    p = weights / weights.sum()
    p = p[p > 0]
    nats = float(-np.sum(p * np.log(p)))
    return {
        "entropy": nats / math.log(rank_bound) if rank_bound > 1 else 0.0,
        "entropy_nats": nats,
        "effective_rank": math.exp(nats),
        "stable_rank": total_sq / float(np.max(sigma) ** 2),
        "frobenius": math.sqrt(total_sq),
    }
