"""The architecture signature a Monitor writes into its run's ``start`` record.

The detectors pick a calibrated profile only for runs of the architecture and size it was
calibrated on (:mod:`foreshock.detectors.signatures` says why and compares them); this reads
the signature off the model as discovery found it, so a user's run needs no labels.
Fields the model cannot tell (a model without a transformers config has no ``model_type``)
are None; the detectors fill the model type from the run's ``arch`` label where there is one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from .layouts import QK_NORM_PAIRS, AttentionSpec, RouterSpec

__all__ = ["model_signature", "signature_or_none"]


def model_signature(
    model: nn.Module,
    attention: list[AttentionSpec],
    routers: list[RouterSpec],
    modules: dict[str, nn.Module],
) -> dict[str, Any]:
    """The signature of ``model`` from its discovered layers (``modules``: attention layer
    name -> module, for QK-norm). Per-layer values are the first layer's (a model whose
    layers differ is still told apart by its layer count and width)."""
    first = attention[0] if attention else None
    router = routers[0] if routers else None
    return {
        "model_type": _model_type(model),
        "layers": len(attention),
        "hidden": _hidden(model, first),
        "heads": first.n_heads if first else None,
        "kv_heads": first.n_kv_heads if first else None,
        "head_dim": first.head_dim if first else None,
        "experts": router.n_experts if router else None,
        "top_k": router.top_k if router else None,
        "qk_norm": any(_has_qk_norm(m) for m in modules.values()),
        "attention": _attention_kind(first),
        "dispatch": None,  # the labels say (a capacity factor is the trainer's, not the model's)
    }


def _config(model: nn.Module) -> Any:
    inner = getattr(model, "module", model)  # DDP and friends wrap the model
    return getattr(model, "config", None) or getattr(inner, "config", None)


def _model_type(model: nn.Module) -> str | None:
    value = getattr(_config(model), "model_type", None)
    return value if isinstance(value, str) and value else None


def _hidden(model: nn.Module, first: AttentionSpec | None) -> int | None:
    """The residual width: the config's ``hidden_size``, else the query projection's input."""
    value = getattr(_config(model), "hidden_size", None)
    if isinstance(value, int):
        return value
    if first is None or first.q_latent is not None:
        return None
    return int(first.q_weight.shape[0 if first.transposed else -1])


def _has_qk_norm(module: nn.Module) -> bool:
    """A (query, key) pair of the QK-norm names discovery folds (``layouts``) is a child."""
    children = {name for name, _ in module.named_children()}
    return any(q in children and k in children for q, k in QK_NORM_PAIRS)


def _attention_kind(first: AttentionSpec | None) -> str | None:
    if first is None:
        return None
    if first.q_latent is not None or first.k_latent is not None:
        return "mla"
    return "gqa" if first.n_kv_heads < first.n_heads else "mha"


def signature_or_none(
    model: nn.Module,
    attention: list[AttentionSpec],
    routers: list[RouterSpec],
    modules: Callable[[], dict[str, nn.Module]],
) -> dict[str, Any] | None:
    """``model_signature``, or None (logged) for a model it cannot read: the zero-shot profile
    then applies. Never raises (``modules`` is called inside, for the same reason)."""
    try:
        return model_signature(model, attention, routers, modules())
    except Exception as exc:
        logging.getLogger("foreshock.monitor").warning(
            "foreshock: no architecture signature: %r", exc
        )
        return None
