"""A hook point for routers whose logits never leave their forward (Megatron, OLMo-core).

Why: the Monitor reads a router through a forward hook on ``RouterSpec.module``, and expects
that module's output to hold the logits z (…, E). Megatron's ``TopKRouter`` returns
(probs, routing_map) and OLMo-core's routers (top-k weights, indices, …): their floating
outputs are sparse top-k probabilities, whose entropy is not H(softmax(z)) — a collapsed router
(true normalised entropy 0.03) read that way reports 0.96. The logits exist only as the return
value of one method inside the forward (``gating``, ``get_expert_logits``).

A :class:`RouterTap` is a parameterless module outside the model's tree. Once something hooks
it, it wraps that method on the router instance to keep the logits of the current forward, and
a forward hook on the router then calls the tap with (logits, selection), the selection being
what the router's own output says it dispatched to. The tap's output is what
``router.router_output`` reads. Nothing is installed until a hook is registered, so discovery
itself leaves the model untouched; one tap per router, however often discovery runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["RouterTap", "router_tap"]

Selector = Callable[[Any], torch.Tensor | None]

_TAPS: weakref.WeakKeyDictionary[nn.Module, RouterTap] = weakref.WeakKeyDictionary()


class _KeepLogits:
    """Stands in for the router's logits method: calls it and hands the result to the tap."""

    def __init__(self, tap: RouterTap, method: Callable[..., torch.Tensor]) -> None:
        self.tap, self.method = tap, method

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        logits = self.method(*args, **kwargs)
        self.tap.pending = logits
        return logits


class RouterTap(nn.Module):
    """Yields (logits (…, E), selection) of ``router``'s forward to whatever hooks it.

    ``method`` names the router's method that returns the logits; ``select`` takes the router's
    forward output to the experts it chose: an integer (…, k) tensor or a boolean (…, E)
    routing map (see ``router.router_output``), or None to count the top-k of the logits.
    """

    def __init__(self, router: nn.Module, method: str, select: Selector) -> None:
        super().__init__()
        self.__dict__["router"] = router  # not a child: the tap stays out of state dicts
        self.method, self.select = method, select
        self.pending: torch.Tensor | None = None
        self._installed = False

    def register_forward_hook(self, hook: Any, **kwargs: Any) -> Any:
        self._install()
        return super().register_forward_hook(hook, **kwargs)

    def _install(self) -> None:
        if self._installed:
            return
        router = self.__dict__["router"]
        router.__dict__[self.method] = _KeepLogits(self, getattr(router, self.method))
        router.register_forward_hook(self._after_router)
        self._installed = True

    def _after_router(self, module: nn.Module, inputs: Any, output: Any) -> None:
        logits, self.pending = self.pending, None
        if logits is None:
            return
        self.training = module.training  # hooks on the tap check it, as on any router
        self(logits, self.select(output))

    def forward(
        self, logits: torch.Tensor, selected: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return logits if selected is None else (logits, selected)

    def extra_repr(self) -> str:
        return f"{type(self.__dict__['router']).__name__}.{self.method}"


def router_tap(router: nn.Module, method: str, select: Selector) -> RouterTap:
    """The one tap of ``router`` (made on first use: discovery may run more than once)."""
    tap = _TAPS.get(router)
    if tap is None:
        tap = _TAPS[router] = RouterTap(router, method, select)
    return tap
