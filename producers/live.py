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

__all__ = ["Binding", "parameter_origins"]

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
