"""Faults injected into the training computation — never into a metric.

Each scenario switches on at ``onset`` (after a healthy warm-up) with a ``magnitude``:

========== ============================================================== ===================
scenario   what changes in training                                        magnitude
========== ============================================================== ===================
healthy    nothing                                                         —
fa-lowprec backward's D = rowsum(dO∘O) uses O truncated toward zero         mantissa bits m
fa-noise   same place, round-to-nearest-even (unbiased control)            mantissa bits m
lr-high    whole-model learning rate ramps geometrically ×1 → ×magnitude   final factor
           over ``ramp`` steps (a schedule drifting to a too-high peak);
           ``lr_target="router"`` raises only the routers' learning rate
gbs-small  global batch size divided by magnitude                          divisor
combined   fa-lowprec (``bits``) and lr-high (magnitude) together          LR factor
router-    the routers' learning rate alone ramps ×1 → ×magnitude over     final factor
collapse   ``ramp`` steps; everything else trains normally. A fault that
           starts in the router: the stable-winner loop collapses routing
router-    the same at a magnitude that leaves routing healthy (control)   final factor
mild
========== ============================================================== ===================

On the lab's own architecture the router scenarios default to capacity-limited dispatch
(capacity factor 1.0, :class:`~foreshock.lab.model.MoE`): drops are what a collapsing router
costs. ``default_capacity`` says which dispatch a scenario runs with unless told.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from .attention import LowPrecision
from .lab_model import set_switch

__all__ = ["DEFAULTS", "ROUTER_SCENARIOS", "SCENARIOS", "Fault", "default_capacity"]

from .scenarios import SCENARIOS

# scenario -> (onset, magnitude); chosen by the lab experiments reported in the README
DEFAULTS: dict[str, tuple[int, float]] = {
    "healthy": (0, 0.0),
    "fa-lowprec": (300, 1.0),
    "fa-noise": (300, 1.0),
    "lr-high": (300, 100.0),
    "gbs-small": (300, 8.0),
    "combined": (300, 100.0),
    "router-collapse": (300, 100.0),
    "router-mild": (300, 2.0),
}
ROUTER_SCENARIOS = ("router-collapse", "router-mild")
LR_SCENARIOS = ("lr-high", "combined", *ROUTER_SCENARIOS)


def default_capacity(scenario: str, arch: str) -> float:
    """The capacity factor a scenario runs with by default (0 = dropless dispatch)."""
    return 1.0 if scenario in ROUTER_SCENARIOS and arch == "gpt-moe" else 0.0


@dataclass(frozen=True)
class Fault:
    """A scenario with its onset step and magnitude (see the module table)."""

    scenario: str = "healthy"
    onset: int = 0
    magnitude: float = 0.0
    ramp: int = 1000  # lr-high/combined: steps from ×1 to ×magnitude
    bits: int = 1  # combined: the fa-lowprec mantissa bits
    layers: tuple[int, ...] | None = None  # fa-*: which attention layers (None = all)
    lr_target: str = "model"  # lr-high/combined: "model" (every parameter) or "router" only

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; choose from {SCENARIOS}")
        if self.onset < 0 or self.ramp < 1:
            raise ValueError("onset must be >= 0 and ramp >= 1")
        if self.scenario.startswith("fa-") and not 0 <= self.magnitude <= 23:
            raise ValueError(f"{self.scenario}: magnitude is mantissa bits in [0, 23]")
        if self.scenario in (*LR_SCENARIOS, "gbs-small") and self.magnitude < 1:
            raise ValueError(f"{self.scenario}: magnitude is a factor >= 1")
        if self.scenario.startswith("fa-") and self.magnitude != int(self.magnitude):
            raise ValueError(f"{self.scenario}: mantissa bits must be whole, got {self.magnitude}")
        if not 0 <= self.bits <= 23:
            raise ValueError(f"bits must be in [0, 23], got {self.bits}")
        if self.lr_target not in ("model", "router"):
            raise ValueError(f"lr_target must be 'model' or 'router', got {self.lr_target!r}")

    @classmethod
    def default(
        cls, scenario: str, onset: int | None = None, magnitude: float | None = None, **more: Any
    ) -> Fault:
        """The scenario with its default onset and magnitude unless given; ``more`` sets the
        other fields (ramp, bits, layers, lr_target)."""
        d_onset, d_mag = DEFAULTS.get(scenario, (0, 0.0))
        return cls(
            scenario,
            d_onset if onset is None else onset,
            d_mag if magnitude is None else magnitude,
            **more,
        )

    def labels(self) -> dict[str, Any]:
        return asdict(self)

    def lowprec(self) -> LowPrecision | None:
        """The rounding the attention backward sees once the fault is on."""
        if self.scenario == "fa-lowprec":
            return LowPrecision(int(self.magnitude), "truncate")
        if self.scenario == "fa-noise":
            return LowPrecision(int(self.magnitude), "nearest")
        if self.scenario == "combined":
            return LowPrecision(self.bits, "truncate")
        return None

    @property
    def router_only(self) -> bool:
        """True when the learning-rate fault acts on the routers alone."""
        return self.scenario in ROUTER_SCENARIOS or self.lr_target == "router"

    def lr_factor(self, step: int) -> float:
        """Multiplier on the faulted param groups' base learning rate at ``step``."""
        if self.scenario not in LR_SCENARIOS or step < self.onset:
            return 1.0
        progress = min(1.0, (step - self.onset) / self.ramp)
        return self.magnitude**progress

    def batch_size(self, base: int, step: int) -> int:
        if self.scenario != "gbs-small" or step < self.onset:
            return base
        return max(1, round(base / self.magnitude))

    def apply_attention(self, layers: Sequence[nn.Module], step: int) -> None:
        """Switch the attention layers' backward rounding on from the onset (idempotent);
        ``layers`` in model order, each with a ``lowp`` attribute."""
        if step < self.onset or self.lowprec() is None:
            return
        for i, layer in enumerate(layers):
            if self.layers is None or i in self.layers:
                set_switch(layer, "lowp", self.lowprec())
