"""The lab's architectures behind one small interface: the lab's own GPT-MoE, or a
transformers model built from its config class — models no one here wrote (Mixtral, Llama,
Qwen3-MoE, OLMoE, DeepSeek-V3; :mod:`foreshock.lab.hf_archs`).

All take the same dimensions (:class:`~foreshock.lab.model.GPTConfig`) and give the training
loop the same handles (:class:`~foreshock.lab.lab_model.LabModel`): the attention layers (each
with a ``lowp`` switch for the FA faults and a ``logit_observer`` for ``max_logit``), the MoE
layers (a ``drop_observer`` where dispatch is capacity-limited), the router weights (for
router-only faults) and the loss.

On the transformers models the lab's FlashAttention-backward function is the model's attention
implementation, registered through transformers' attention-function registry as
``foreshock-lab-fa`` (:mod:`foreshock.lab.hf_attention`): the fault lives in the backward of
the model's own attention call, exactly where a low-precision kernel would put it.

What each architecture is and can run (dense or MoE, GQA or not, ...) is in the torch-free
table :data:`foreshock.lab.arch_table.ARCHS`; :func:`default_model` and :func:`build` check a
model's dimensions against it, so a run that cannot be built is refused with a reason.
"""

from __future__ import annotations

from collections.abc import Callable

from foreshock.producers.module_attrs import submodule, tensor_attr

from . import hf_archs
from .arch_table import ARCHS as TABLE
from .arch_table import check_fault, info
from .hf_attention import LAB_ATTENTION, lab_attention
from .lab_model import LabModel
from .model import GPT, GPTConfig

__all__ = [
    "ARCHS",
    "LAB_ATTENTION",
    "SIZES",
    "LabModel",
    "build",
    "check_fault",
    "check_model",
    "default_model",
    "lab_attention",
]

ARCHS = tuple(TABLE)
# The dimensions a run may set (GPTConfig fields), each with the CLI option that sets it.
SIZES = {
    "n_layer": "--n-layers",
    "n_embd": "--hidden",
    "n_head": "--heads",
    "n_kv_head": "--kv-heads",
    "n_experts": "--experts",
    "top_k": "--top-k",
}


def _gpt_moe(config: GPTConfig) -> LabModel:
    """The lab's own model (:mod:`foreshock.lab.model`)."""
    model = GPT(config)
    mlps = [submodule(block, "mlp") for block in model.h.children()]
    moe = {f"h.{i}.mlp.gate": m for i, m in enumerate(mlps) if hasattr(m, "gate")}
    return LabModel(
        model,
        attention={f"h.{i}.attn": submodule(b, "attn") for i, b in enumerate(model.h.children())},
        moe=moe,
        routers=[tensor_attr(submodule(m, "gate"), "weight") for m in moe.values()],
        aux_loss_weight=0.0,  # GPT.forward adds its own Switch loss
    )


BUILDERS: dict[str, Callable[[GPTConfig], LabModel]] = {
    "gpt-moe": _gpt_moe,
    "mixtral": hf_archs.mixtral,
    "llama": hf_archs.llama,
    "qwen2": hf_archs.qwen2,
    "qwen2-moe": hf_archs.qwen2_moe,
    "qwen3-moe": hf_archs.qwen3_moe,
    "olmoe": hf_archs.olmoe,
    "deepseek-v3": hf_archs.deepseek_v3,
}
assert set(BUILDERS) == set(TABLE), "every architecture has a builder"


def default_model(arch: str, capacity_factor: float = 0.0, **sizes: int | None) -> GPTConfig:
    """The lab's dimensions for ``arch`` — GPTConfig's defaults with the architecture's own
    departures (Mixtral's 2 key/value heads, Llama's dense MLP, ...) — with ``sizes`` (the
    GPTConfig fields of :data:`SIZES`; None = the default) on top, checked (:func:`check_model`).
    """
    unknown = set(sizes) - set(SIZES)
    if unknown:
        raise TypeError(f"not a size: {', '.join(sorted(unknown))}; sizes are {list(SIZES)}")
    given = {name: value for name, value in sizes.items() if value is not None}
    config = GPTConfig(**{**info(arch).defaults, "capacity_factor": capacity_factor, **given})
    check_model(arch, config)
    return config


def check_model(arch: str, config: GPTConfig) -> None:
    """Refuse dimensions the architecture cannot build, with every reason at once."""
    entry, problems = info(arch), []
    if min(config.n_layer, config.n_embd, config.n_kv_head + 1, config.top_k) < 1:
        problems.append("layers, hidden, heads and top-k must be positive, kv-heads not negative")
    if config.n_head < 1 or config.n_embd % config.n_head:
        problems.append(f"hidden {config.n_embd} is not a multiple of heads {config.n_head}")
    elif (config.n_embd // config.n_head) % entry.head_dim_multiple:
        problems.append(
            f"the head width hidden/heads = {config.n_embd // config.n_head} must be a "
            f"multiple of {entry.head_dim_multiple}"
        )
    kv_heads = config.n_kv_head or config.n_head
    if kv_heads != config.n_head and not entry.gqa:
        problems.append("it has no key/value head groups: kv-heads must equal heads")
    elif config.n_head % kv_heads:
        problems.append(f"heads {config.n_head} is not a multiple of kv-heads {kv_heads}")
    if not entry.moe and config.n_experts:
        problems.append("it is dense: experts must be 0")
    elif entry.moe and config.n_experts < entry.min_experts:
        problems.append(f"it is an MoE model: experts must be at least {entry.min_experts}")
    elif config.n_experts and not 1 <= config.top_k <= config.n_experts:
        problems.append(f"top-k {config.top_k} must be in [1, experts = {config.n_experts}]")
    if config.capacity_factor and not entry.capacity:
        problems.append("its dispatch is dropless (no expert capacity)")
    if config.aux_loss_weight and not entry.aux_loss:
        problems.append("it trains without a load-balancing loss: aux_loss_weight must be 0")
    if problems:
        raise ValueError(f"{arch}: " + "; ".join(problems))


def build(arch: str, config: GPTConfig) -> LabModel:
    """The architecture ``arch`` at ``config``'s dimensions, with the lab's handles."""
    check_model(arch, config)
    return BUILDERS[arch](config)
