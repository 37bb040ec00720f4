"""The lab's architectures behind one small interface: the lab's own GPT-MoE, or a transformers
Mixtral built from its config class — a model no one here wrote.

Both take the same dimensions (:class:`~foreshock.lab.model.GPTConfig`) and give the training
loop the same handles: the attention layers (each with a ``lowp`` switch for the FA faults and a
``logit_observer`` for ``max_logit``), the MoE layers (a ``drop_observer`` where dispatch is
capacity-limited), the router weights (for router-only faults) and the loss.

On Mixtral the lab's FlashAttention-backward function (:mod:`foreshock.lab.attention`) is the
model's attention implementation, registered through transformers' attention-function
registry as ``foreshock-lab-fa``: the fault lives in the backward of the model's own attention
call, exactly where a low-precision kernel would put it. Mixtral is GQA (``n_kv_head`` <
``n_head``): each key/value head serves ``n_head / n_kv_head`` query heads, as in the library's
own path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention import flash_attention
from .model import GPT, GPTConfig

__all__ = ["ARCHS", "LabModel", "build", "default_model"]

ARCHS = ("gpt-moe", "mixtral")
LAB_ATTENTION = "foreshock-lab-fa"


@dataclass
class LabModel:
    """A model with the handles the lab's training loop and faults need."""

    model: nn.Module
    attention: dict[str, nn.Module]  # name -> layer with .lowp and .logit_observer
    moe: dict[str, nn.Module]  # router name -> MoE layer with .drop_observer
    routers: list[nn.Parameter]  # the router weights (router-only learning-rate faults)
    aux_loss_weight: float

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Next-byte cross-entropy plus the load-balancing loss (weight ``aux_loss_weight``)."""
        if isinstance(self.model, GPT):
            return self.model(x, y)[1]
        out = self.model(input_ids=x, output_router_logits=self.aux_loss_weight > 0)
        loss = F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)), y.reshape(-1))
        if self.aux_loss_weight > 0:
            loss = loss + self.aux_loss_weight * out.aux_loss
        return loss


def default_model(arch: str, capacity_factor: float = 0.0) -> GPTConfig:
    """The lab's dimensions for ``arch``: Mixtral's attention is GQA (2 key/value heads)."""
    return GPTConfig(capacity_factor=capacity_factor, n_kv_head=2 if arch == "mixtral" else 0)


def build(arch: str, config: GPTConfig) -> LabModel:
    if arch == "gpt-moe":
        return _gpt_moe(config)
    if arch == "mixtral":
        return _mixtral(config)
    raise ValueError(f"unknown arch {arch!r}; choose from {ARCHS}")


def _gpt_moe(config: GPTConfig) -> LabModel:
    model = GPT(config)
    moe = {f"h.{i}.mlp.gate": b.mlp for i, b in enumerate(model.h) if hasattr(b.mlp, "gate")}
    return LabModel(
        model,
        attention={f"h.{i}.attn": b.attn for i, b in enumerate(model.h)},
        moe=moe,
        routers=[m.gate.weight for m in moe.values()],
        aux_loss_weight=0.0,  # GPT.forward adds its own Switch loss
    )


def _mixtral(config: GPTConfig) -> LabModel:
    from transformers import AttentionInterface, MixtralConfig, MixtralForCausalLM

    if config.capacity_factor:
        raise ValueError("mixtral: dispatch is dropless (transformers' MixtralSparseMoeBlock)")
    AttentionInterface.register(LAB_ATTENTION, lab_attention)
    hf = MixtralConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=config.expert_hidden or 4 * config.n_embd // config.top_k,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head or config.n_head,
        max_position_embeddings=config.block_size,
        num_local_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        router_aux_loss_coef=config.aux_loss_weight,
        initializer_range=0.02,
        tie_word_embeddings=True,
        attn_implementation=LAB_ATTENTION,
    )
    model = MixtralForCausalLM(hf)
    layers = model.model.layers
    attention = {f"model.layers.{i}.self_attn": layer.self_attn for i, layer in enumerate(layers)}
    for layer in attention.values():
        layer.lowp, layer.logit_observer = None, None
    return LabModel(
        model,
        attention=attention,
        moe={},
        routers=[layer.mlp.gate.weight for layer in layers],
        aux_loss_weight=config.aux_loss_weight,
    )


def lab_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over the lab's causal FlashAttention.

    query (B, H, T, d_h), key/value (B, H_kv, T, d_h) → output (B, T, H, d_h). Causal, no
    padding (the lab's batches are full windows); scale 1/√d_h, as Mixtral's own."""
    d_h = query.shape[-1]
    if scaling is not None and abs(scaling * d_h**0.5 - 1) > 1e-6:
        raise ValueError(f"{LAB_ATTENTION}: scale {scaling} is not 1/sqrt({d_h})")
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out, max_logit = flash_attention(query, key, value, getattr(module, "lowp", None))
    observer = getattr(module, "logit_observer", None)
    if observer is not None:
        observer(max_logit)
    return out.transpose(1, 2).contiguous(), None
