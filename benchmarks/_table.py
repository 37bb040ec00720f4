"""Shared plumbing for the benchmarks: single-threaded torch, timing, the closing JSON line.

Every benchmark prints a readable table (``foreshock.table.format_table``) and then exactly one
JSON object on its last stdout line, so that a script can read the figures with
``json.loads(output.splitlines()[-1])``.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from foreshock.table import format_table, median

__all__ = ["best_of", "emit_json", "format_table", "median", "quantile", "single_thread"]

T = TypeVar("T")


def single_thread() -> None:
    """One intra-op and one inter-op thread: the machines are small, shared and noisy."""
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work has started
        torch.set_num_interop_threads(1)


def best_of(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """(min wall time over ``repeats`` calls [s], result of the first call).

    The minimum is the least noisy estimate of a deterministic computation's cost on a shared
    machine: interference only ever adds time. The first call counts too (it is rarely the min).
    """
    best, first = math.inf, None
    for i in range(max(1, repeats)):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
        if i == 0:
            first = out
    return best, first  # type: ignore[return-value]


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile, q in [0, 1]."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become null, tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def emit_json(figures: dict[str, Any]) -> None:
    """Print the figures as one compact JSON object: the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(_clean(figures), allow_nan=False, separators=(",", ":")), flush=True)
