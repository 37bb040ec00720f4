"""Specs that follow the model's live parameters, not the tensors seen at discovery.

Why: wrapping a model after the Monitor was built replaces its parameters — FSDP2's
``fully_shard`` and DTensor tensor parallel register new (DTensor) parameters on the same
modules, ``module.to()`` may swap storage. A spec holding the old tensors would measure a
frozen copy: every ΔW spectrum 0, the weight norm constant. So each spec tensor that was a
parameter of the model is remembered by where it lives, (module, attribute), and read from
there at every monitoring step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
from torch import nn

from .layouts import TENSOR_FIELDS, AttentionSpec, RouterSpec
from .names import named_modules

__all__ = ["Binding", "LiveModel", "named_origins", "parameter_origins"]

Origin = tuple[nn.Module, str]
Spec = TypeVar("Spec", AttentionSpec, RouterSpec)

_LATENTS = ("q_latent", "k_latent")


def parameter_origins(model: nn.Module) -> dict[int, Origin]:
    """id(parameter) → (module that registers it, its attribute name), for every parameter."""
    origins: dict[int, Origin] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                origins.setdefault(id(param), (module, name))
    return origins


def named_origins(
    model: nn.Module, origins: dict[int, tuple[nn.Module, str]]
) -> list[tuple[str, tuple[nn.Module, str]]]:
    """Each parameter's origin with its name as the unwrapped model names it (``names``): the
    same on every rank that holds it, which is how ranks count a parameter's holders."""
    prefix: dict[int, str] = {}
    for name, module in named_modules(model):
        prefix.setdefault(id(module), name)
    return [
        (f"{prefix[id(module)]}.{attr}".lstrip("."), (module, attr))
        for module, attr in origins.values()
    ]


def _live(origin: Origin) -> Any:
    module, name = origin
    return module._parameters.get(name)


class Binding:
    """One spec and, for each of its tensor fields that is a model parameter, its origin.

    ``current()`` is the spec rebuilt from the live parameters (the same object while nothing
    was swapped, so the common case costs a few dict lookups)."""

    def __init__(self, spec: Any, origins: dict[int, Origin]) -> None:
        self.original = self.spec = spec
        self._fields = {
            f: origins[id(getattr(spec, f))]
            for f in TENSOR_FIELDS[type(spec)]
            if id(getattr(spec, f)) in origins
        }
        self._latents = {
            f: Binding(getattr(spec, f), origins)
            for f in _LATENTS
            if isinstance(spec, AttentionSpec) and getattr(spec, f) is not None
        }

    @property
    def name(self) -> str:
        return self.spec.name

    def current(self) -> Any:
        changes: dict[str, Any] = {}
        for field, origin in self._fields.items():
            live = _live(origin)
            if isinstance(live, torch.Tensor) and live is not getattr(self.spec, field):
                changes[field] = live
        for field, latent in self._latents.items():
            now = latent.current()
            if now is not getattr(self.spec, field):
                changes[field] = now
        if changes:
            self.spec = dataclasses.replace(self.spec, **changes)
        return self.spec


class LiveModel:
    """A model read through its live parameters: specs rebound where a wrapper swapped them
    (``Binding``), and every parameter by the name the unwrapped model gives it. The module
    walk is done once, here (``named_modules()`` is slow on a large model)."""

    def __init__(self, model: nn.Module) -> None:
        self._origins = parameter_origins(model)
        self._named = named_origins(model, self._origins)
        self._bindings: dict[str, Binding] = {}

    def spec(self, spec: Spec) -> Spec:
        """``spec`` read from the live parameters (the same object while nothing changed)."""
        binding = self._bindings.get(spec.name)
        if binding is None or binding.original is not spec:
            binding = self._bindings[spec.name] = Binding(spec, self._origins)
        return binding.current()

    def specs(
        self, attention: list[AttentionSpec], routers: list[RouterSpec]
    ) -> tuple[list[AttentionSpec], list[RouterSpec]]:
        return [self.spec(a) for a in attention], [self.spec(r) for r in routers]

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        """(name as the unwrapped model names it, live parameter), for every parameter."""
        live = ((n, module._parameters.get(a)) for n, (module, a) in self._named)
        return [(name, p) for name, p in live if isinstance(p, torch.Tensor)]

    def params(self) -> list[torch.Tensor]:
        return [p for _, p in self.named_params()]
