"""A hyper-parameter a module states, on itself or on its ``config``.

Code bases spell the same number many ways (``n_head``, ``num_attention_heads``, ``num_heads``;
``top_k``, ``num_experts_per_tok``, ``moe_router_topk``, …) and keep it either on the module or
on the model config the module holds; discovery reads them all through this one lookup.

>>> from torch import nn
>>> gate = nn.Linear(4, 8)
>>> gate.config = type("Config", (), {"num_experts_per_tok": 2})()
>>> config_int(gate, ("top_k", "num_experts_per_tok"))
2
"""

from __future__ import annotations

from torch import nn

__all__ = ["config_int"]


def config_int(module: nn.Module, names: tuple[str, ...]) -> int | None:
    """The first positive int among ``names`` on ``module``, then on ``module.config``."""
    config = getattr(module, "config", None)
    for source in (module, config):
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
