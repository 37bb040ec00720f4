"""A hyper-parameter a module states, on itself or on its ``config``; typed attribute reads.

Code bases spell the same number many ways (``n_head``, ``num_attention_heads``, ``num_heads``;
``top_k``, ``num_experts_per_tok``, ``moe_router_topk``, …) and keep it either on the module or
on the model config the module holds; discovery reads them all through this one lookup.

>>> from torch import nn
>>> gate = nn.Linear(4, 8)
>>> gate.config = type("Config", (), {"num_experts_per_tok": 2})()
>>> config_int(gate, ("top_k", "num_experts_per_tok"))
2

``int_attr``, ``tensor_attr`` and ``submodule`` read an attribute the code relies on with the
type it relies on: ``nn.Module.__getattr__`` types any attribute as ``Tensor | Module``. An
absent attribute raises AttributeError as before; one of another type raises TypeError (where
reading it would have failed anyway, or given nonsense).

>>> int_attr(gate, "in_features"), tuple(tensor_attr(gate, "weight").shape)
(4, (8, 4))
>>> tensor_attr(gate, "config")
Traceback (most recent call last):
...
TypeError: Linear.config is a Config, not a tensor
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["config_int", "int_attr", "submodule", "tensor_attr"]


def config_int(module: nn.Module, names: tuple[str, ...]) -> int | None:
    """The first positive int among ``names`` on ``module``, then on ``module.config``."""
    config = getattr(module, "config", None)
    for source in (module, config):
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def int_attr(source: object, name: str) -> int:
    """``source.<name>``, an int (a head count, a width); TypeError when it is not one."""
    value = getattr(source, name)
    if not isinstance(value, int):
        raise TypeError(f"{type(source).__name__}.{name} is a {type(value).__name__}, not an int")
    return value


def tensor_attr(module: object, name: str) -> torch.Tensor:
    """``module.<name>``, a tensor (a weight); TypeError when it is not one (None included)."""
    value = getattr(module, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(module).__name__}.{name} is a {type(value).__name__}, not a tensor")
    return value


def submodule(module: nn.Module, name: str) -> nn.Module:
    """``module.<name>``, a module (a projection); TypeError when it is not one."""
    value = getattr(module, name)
    if not isinstance(value, nn.Module):
        raise TypeError(f"{type(module).__name__}.{name} is a {type(value).__name__}, not a module")
    return value
