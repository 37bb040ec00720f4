"""The lab's architectures by name, and what each one can run — torch-free, so that the CLI can
list them and refuse a run before torch is imported.

An entry says what the architecture is (the CLI's help), whether it routes tokens to experts
(the router scenarios need a router to fault), and how its dimensions depart from the lab's
defaults (:class:`~foreshock.lab.model.GPTConfig`: 2 layers, d = 128, 4 heads, 8 experts
top-2). The builders, one function per architecture, are in :mod:`foreshock.lab.arch` (the
lab's own model) and :mod:`foreshock.lab.hf_archs` (transformers models).

>>> [a for a in ARCHS if not ARCHS[a].moe]
['llama', 'qwen2']
>>> ARCHS["deepseek-v3"].defaults
{'aux_loss_weight': 0.0}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ARCHS", "ArchInfo", "check_fault", "info"]


@dataclass(frozen=True)
class ArchInfo:
    """One architecture: its summary, and the constraints its builder relies on."""

    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)  # GPTConfig fields it changes
    moe: bool = True  # routes tokens to experts: router scenarios apply
    min_experts: int = 1  # the fewest experts it builds with (MoE only)
    gqa: bool = True  # key/value heads may be fewer than query heads
    aux_loss: bool = True  # trains with a load-balancing loss (GPTConfig.aux_loss_weight)
    capacity: bool = False  # supports capacity-limited dispatch (GPTConfig.capacity_factor)
    head_dim_multiple: int = 2  # rotary embeddings rotate pairs of a head's dimensions


ARCHS: dict[str, ArchInfo] = {
    "gpt-moe": ArchInfo(
        "the lab's own GPT-MoE: learned positions, GELU experts, optional expert capacity",
        gqa=False,
        min_experts=0,  # 0 experts: a dense GELU MLP
        capacity=True,
        head_dim_multiple=1,  # no rotary embedding
    ),
    "mixtral": ArchInfo("transformers Mixtral: GQA, softmax top-k router", {"n_kv_head": 2}),
    "llama": ArchInfo(
        "transformers Llama: dense, GQA, no router (router scenarios refused)",
        {"n_kv_head": 2, "n_experts": 0, "aux_loss_weight": 0.0},
        moe=False,
        aux_loss=False,
    ),
    "qwen2": ArchInfo(
        "transformers Qwen2: dense, GQA with q/k/v biases, no router (router scenarios refused)",
        {"n_kv_head": 2, "n_experts": 0, "aux_loss_weight": 0.0},
        moe=False,
        aux_loss=False,
    ),
    "qwen2-moe": ArchInfo(
        "transformers Qwen2-MoE: GQA with q/k/v biases, softmax top-k router, gated shared expert",
        {"n_kv_head": 2},
    ),
    "qwen3-moe": ArchInfo(
        "transformers Qwen3-MoE: GQA, per-head QK-norm, softmax top-k router",
        {"n_kv_head": 2},
    ),
    "olmoe": ArchInfo(
        "transformers OLMoE: multi-head, whole-projection QK-norm, softmax top-k router",
    ),
    "deepseek-v3": ArchInfo(
        "transformers DeepSeek-V3: MLA, sigmoid grouped top-k router with a balancing bias",
        {"aux_loss_weight": 0.0},
        min_experts=2,  # a group of experts is scored by its two best
        gqa=False,
        aux_loss=False,
        head_dim_multiple=4,  # the rotary part of a head is half of it, rotated in pairs
    ),
}


def info(arch: str) -> ArchInfo:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    return ARCHS[arch]


def check_fault(arch: str, fault: Any, n_experts: int | None = None) -> None:
    """Refuse a fault the architecture has no place for: a router-only learning-rate fault
    (``router-collapse``, ``router-mild``, ``lr-high --lr-target router``) on a dense model —
    a dense architecture, or the lab's own with ``n_experts`` = 0. ``fault`` is a
    :class:`~foreshock.lab.faults.Fault` (read through ``router_only``)."""
    if fault.router_only and (not info(arch).moe or n_experts == 0):
        model = f"{arch} with 0 experts" if info(arch).moe else arch
        what = f"scenario {fault.scenario!r}" + (
            " with lr_target='router'" if fault.lr_target == "router" else ""
        )
        moe = ", ".join(a for a, i in ARCHS.items() if i.moe)
        raise ValueError(
            f"{model} is a dense model with no router: {what} faults the routers' learning "
            f"rate and has nothing to act on; run it on an MoE architecture ({moe})"
        )
