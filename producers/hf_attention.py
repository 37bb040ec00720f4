"""``max_logit`` for transformers models, through the library's attention-function registry.

``record_max_logit(model, monitor)`` registers ``foreshock+<impl>`` in transformers'
``AttentionInterface`` — a function that, on a monitoring step, computes the layer's largest
pre-softmax logit from the query and key it receives (``masked_max_logit``: the call's scaling
and mask) and then calls the configured implementation ``<impl>`` (sdpa, eager, flash…) with
the same arguments; on other steps it only checks a flag. The model is switched to it with
``set_attn_implementation``, so its outputs are those of ``<impl>`` unchanged.

Models whose attention does not dispatch through the registry (transformers' Falcon calls
``F.scaled_dot_product_attention`` itself) are watched at that call instead
(``Monitor.watch_sdpa``). Which layers go which way is decided by whether the layer's modeling
module uses ``ALL_ATTENTION_FUNCTIONS``.

Cost: nothing extra off monitoring steps beyond a dict lookup and a flag per layer call; on a
monitoring step one extra Q Kᵀ per layer in float32, in blocks of query rows
(``python -m benchmarks.overhead --model mixtral-tiny`` measures it).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from torch import nn

from foreshock.extras import missing_extra
from foreshock.producers.max_logit import masked_max_logit

try:
    from transformers import AttentionInterface, PretrainedConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError as exc:
    raise missing_extra(__name__, "transformers", "hf") from exc

if TYPE_CHECKING:
    from foreshock.producers.monitor import Monitor

__all__ = ["check_switchable", "record_max_logit", "switch_layer"]

PREFIX = "foreshock+"
_OBSERVER = "_foreshock_max_logit"  # attribute on a watched attention module: (monitor, name)


def record_max_logit(model: nn.Module, monitor: Monitor) -> dict[str, str]:
    """Record ``max_logit@<layer>`` for every discovered attention layer of ``model``.

    Returns {layer: "registry" | "sdpa"}: how each layer is watched. Layers reached neither
    way (an attention module with its own kernel call) get no ``max_logit``.
    """
    layers = monitor.attention_modules()
    via_registry = {n: m for n, m in layers.items() if _uses_registry(m)}
    via_sdpa = {n: m for n, m in layers.items() if n not in via_registry}
    restore: list[Callable[[], None]] = []
    if via_registry:
        for name, module in via_registry.items():
            setattr(module, _OBSERVER, (monitor, name))
        restore = [_switch_implementation(m) for m in _pretrained_roots(model)]
    if via_sdpa:
        monitor.watch_sdpa(via_sdpa)

    def forget() -> None:
        for module in via_registry.values():
            if hasattr(module, _OBSERVER):
                delattr(module, _OBSERVER)
        for undo in restore:
            undo()

    monitor.on_close(forget)
    return {name: "registry" if name in via_registry else "sdpa" for name in layers}


def switch_layer(layer: nn.Module, implementation: str) -> str:
    """Switch one attention layer alone to ``implementation`` (a remedy: precise attention).

    Why a copy of the config: a transformers layer reads ``self.config._attn_implementation``
    at every call, and its config is the model's, shared by every layer; the layer gets its
    own copy with the new implementation, so the named layer switches and the others do not.
    The mask the model builds is unchanged (it follows the model's config): the precise
    implementation must take the one the model's implementation does (causal, no padding in
    the common case: none). A layer on foreshock's ``max_logit`` wrapper keeps it
    (``foreshock+<implementation>``). Returns the layer's implementation now; raises for a
    layer that does not dispatch through the registry or an unknown implementation."""
    check_switchable(layer, implementation)
    config: Any = layer.config  # a PretrainedConfig (checked)
    current = getattr(config, "_attn_implementation", None)
    target = implementation
    if isinstance(current, str) and current.startswith(PREFIX):
        target = PREFIX + implementation
        if target not in ALL_ATTENTION_FUNCTIONS:
            _register(target, implementation)
    if current != target:
        own = copy.copy(config)
        own._attn_implementation_internal = target
        layer.config = own
    return target


def check_switchable(layer: nn.Module, implementation: str) -> None:
    """Raise, saying why, where :func:`switch_layer` cannot switch ``layer``: checked for
    every layer before any switches, so a remedy never leaves a model half switched."""
    config = getattr(layer, "config", None)
    if not (isinstance(config, PretrainedConfig) and _uses_registry(layer)):
        raise TypeError(
            f"{type(layer).__name__} does not call transformers' attention registry: its "
            "implementation cannot be switched"
        )
    if implementation != "eager" and implementation not in ALL_ATTENTION_FUNCTIONS:
        raise KeyError(f"no attention implementation {implementation!r} in transformers")


def _pretrained_roots(model: nn.Module) -> list[nn.Module]:
    """The outermost transformers models in ``model`` (itself, or e.g. inside a wrapper)."""
    roots: list[nn.Module] = []
    for _, module in model.named_modules():
        if hasattr(module, "set_attn_implementation") and not any(
            any(m is module for m in root.modules()) for root in roots
        ):
            roots.append(module)
    return roots


def _uses_registry(module: nn.Module) -> bool:
    source = sys.modules.get(type(module).__module__)
    return source is not None and "ALL_ATTENTION_FUNCTIONS" in vars(source)


class _Switchable(Protocol):
    """A transformers model (``PreTrainedModel``): its attention implementation switches."""

    def set_attn_implementation(self, attn_implementation: str) -> None: ...


def _switch_implementation(model: nn.Module) -> Callable[[], None]:
    """Route ``model``'s attention through the wrapper; returns how to switch back."""
    current = getattr(model.config, "_attn_implementation", None) or "eager"
    if current.startswith(PREFIX):
        return lambda: None  # already wrapped (a second monitor on the same model)
    key = PREFIX + current
    _register(key, current)
    switchable = cast(_Switchable, model)  # _pretrained_roots chose it for this method
    switchable.set_attn_implementation(key)
    return lambda: switchable.set_attn_implementation(current)


def _register(key: str, base: str) -> None:
    """Register the wrapper of ``base`` as ``key``, with ``base``'s mask.

    Why the mask too: transformers builds the model's attention mask with the function its
    mask registry holds for the configured implementation, and for a name it does not hold it
    builds none. An ``sdpa`` call with no mask is still causal (it sets ``is_causal``), but the
    ``eager`` one adds only the mask it is given: wrapped without its mask, a model on eager
    attention trained attending to the future (a tiny Mixtral's training loss fell to 1.1
    nats while its causal held-out loss stayed at 5.6). A base the mask registry does not hold
    (a custom kernel that is causal on its own) is left without one, as it was unwrapped."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(key, _wrapper(base))
    if base in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(key, ALL_MASK_ATTENTION_FUNCTIONS[base])


def _wrapper(base: str) -> Callable[..., Any]:
    """The registered function: measure on monitoring steps, then call ``base`` unchanged."""

    def attention(
        module: nn.Module, query: Any, key: Any, value: Any, mask: Any, *args: Any, **kwargs: Any
    ) -> Any:
        observer = getattr(module, _OBSERVER, None)
        if observer is not None and observer[0].measuring:
            _observe(observer, module, query, key, mask, kwargs)
        if base == "eager" and mask is None:
            mask = _causal_mask(module, query, key)
        return _base_function(base, module)(module, query, key, value, mask, *args, **kwargs)

    return attention


def _causal_mask(module: nn.Module, query: Any, key: Any) -> Any:
    """The additive causal mask an eager call needs where the model built none: a layer
    switched to eager in a model whose implementation (sdpa) leaves causality to the kernel's
    ``is_causal``. None for a module that is not causal, or a single query (decoding)."""
    import torch

    q_len, k_len = query.shape[-2], key.shape[-2]
    if not getattr(module, "is_causal", False) or q_len == 1:
        return None
    future = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device)
    future = future.triu(k_len - q_len + 1)
    blocked = torch.finfo(query.dtype).min
    return torch.zeros(q_len, k_len, dtype=query.dtype, device=query.device).masked_fill(
        future, blocked
    )[None, None]


def _observe(
    observer: tuple[Monitor, str],
    module: nn.Module,
    query: Any,
    key: Any,
    mask: Any,
    kwargs: dict[str, Any],
) -> None:
    monitor, name = observer
    try:
        causal = mask is None and getattr(module, "is_causal", False) and query.shape[-2] > 1
        value = masked_max_logit(query, key, kwargs.get("scaling"), mask, causal)
        monitor.observe_max_logit(name, value)
    except Exception as exc:  # never break the forward pass
        monitor._fail_hook(name, exc)


def _base_function(base: str, module: nn.Module) -> Callable[..., Any]:
    """The configured implementation: the registry's, or the model's own ``eager`` function."""
    if base in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[base]
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise RuntimeError(f"no attention function {base!r} for {type(module).__name__}")
    return eager
