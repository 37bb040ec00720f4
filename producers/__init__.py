"""In-trainer producers: the mechanism monitors and the ``Monitor`` that attaches them.

Torch-based names are imported lazily, so that torch-free code can import the torch-free
parts (the file sinks) without torch installed; the Kafka sink and its spool are
``foreshock.delivery``. The record format they write is :mod:`foreshock.transport.records`.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "Monitor": "monitor",
    "MonitorConfig": "monitor",
    "DivergenceWatch": "divergence_watch",
    "JsonlSink": "sinks",
    "ListSink": "sinks",
    "discover": "discovery",
    "AttentionSpec": "layouts",
    "RouterSpec": "layouts",
    "spectrum_stats": "spectra",
    "update_spectrum": "spectra",
    "qk_increment_spectra": "qk_increments",
    "token_entropy": "router",
    "conditioning_ratio": "router",
    "mean_pairwise_cosine": "router",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'foreshock.producers' has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
