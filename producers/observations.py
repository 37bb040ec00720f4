"""What a monitoring step's forward and backward report: routing, largest logits, drops.

Why apart: the Monitor's readings of weights happen after the optimizer step, on its own
call; these arrive *during* the training step, from forward hooks on the routers and from
observers inside the model (``observe_max_logit``, ``observe_router_drops``,
:class:`~foreshock.producers.max_logit.SdpaLogitWatch`). They are gathered only on an *armed*
step (the one that will be measured), kept on the device until the step's one host transfer,
and cleared after it. A hook or observer that fails is recorded per module once per step
(``errors``: flagged ``monitor_error@<module>`` in that step's record) and never raises into
the model's forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .layouts import RouterSpec
from .router import RoutingAccumulator, router_output

__all__ = ["StepObservations"]


class StepObservations:
    """One step's observations; ``armed`` says whether this step gathers them.

    ``on_error(module, exc)`` hears the first failure of each module in a step."""

    def __init__(self, on_error: Callable[[str, Exception], None]) -> None:
        self.on_error = on_error
        self.armed = True
        self.accumulators: dict[str, RoutingAccumulator] = {}  # router -> routing statistics
        self.max_logits: dict[str, torch.Tensor] = {}  # layer -> its largest logit
        self.drops: dict[str, tuple[torch.Tensor, int]] = {}  # router -> (dropped, assigned)
        self.errors: dict[str, str] = {}  # module -> its error in this step's forward
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def hook_router(self, spec: RouterSpec) -> None:
        """Accumulate ``spec``'s routing from its module's forward, on armed training steps."""
        acc = RoutingAccumulator(spec.n_experts, spec.top_k, scoring=spec.scoring)
        self.accumulators[spec.name] = acc

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not (self.armed and module.training):
                return
            try:
                acc.update(*router_output(output, spec.n_experts, spec.top_k))
            except Exception as exc:  # never break the forward pass
                self.failed(spec.name, exc)

        self._hooks.append(spec.module.register_forward_hook(hook))

    def max_logit(self, name: str, value: torch.Tensor) -> None:
        """The largest of ``value`` joins layer ``name``'s for this step."""
        try:
            value = value.detach().float().amax()
            old = self.max_logits.get(name)
            self.max_logits[name] = value if old is None else torch.maximum(old, value)
        except Exception as exc:  # called from the model's forward: never break it
            self.failed(name, exc)

    def router_drops(self, name: str, dropped: torch.Tensor | int, assigned: int) -> None:
        """``dropped`` of ``assigned`` token→expert assignments overflowed router ``name``."""
        try:
            dropped = torch.as_tensor(dropped).detach().float().sum()
            old = self.drops.get(name)
            self.drops[name] = (
                (dropped, assigned) if old is None else (old[0] + dropped, old[1] + assigned)
            )
        except Exception as exc:  # called from the model's forward: never break it
            self.failed(name, exc)

    def failed(self, module: str, exc: Exception) -> None:
        """A hook or observer failed: recorded once per module and step, never raised."""
        if module in self.errors:
            return  # a hook fires once per micro-batch
        self.errors[module] = repr(exc)[:500]
        self.on_error(module, exc)

    def clear(self) -> None:
        """Forget this step's observations (the accumulators are reset, not removed)."""
        for acc in self.accumulators.values():
            acc.reset()
        self.max_logits.clear()
        self.drops.clear()
        self.errors.clear()

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
