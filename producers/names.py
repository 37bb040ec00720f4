"""Module names as the model's author wrote them, whatever wraps the model for training.

Why: series are keyed by module name (``attn.d2.entropy@model.layers.3.self_attn``), and so
are the detectors' calibrated rules. Wrapping a model renames its modules — DDP prefixes
``module.``, FSDP1 inserts ``_fsdp_wrapped_module``, activation checkpointing
``_checkpoint_wrapped_module``, ``torch.compile`` ``_orig_mod`` — so the same layer would be
another series, and a profile calibrated on the unwrapped model would not apply. Names drop
those segments; FSDP2 and DTensor tensor parallel rename nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

__all__ = ["WRAPPER_SEGMENTS", "named_modules"]

WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def _wraps_as_module(model: nn.Module) -> bool:
    """DDP and DataParallel hold the model as their child ``module``."""
    return type(model).__name__ in ("DistributedDataParallel", "DataParallel")


def named_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``model.named_modules()`` with wrapper segments dropped from each name.

    >>> inner = nn.Sequential(nn.Linear(2, 2))
    >>> outer = nn.Module(); outer._orig_mod = inner
    >>> [name for name, _ in named_modules(outer)]
    ['', '', '0']
    """
    strip_first = _wraps_as_module(model)
    for name, module in model.named_modules():
        parts = name.split(".") if name else []
        if strip_first and parts[:1] == ["module"]:
            parts = parts[1:]
        yield ".".join(p for p in parts if p not in WRAPPER_SEGMENTS), module
