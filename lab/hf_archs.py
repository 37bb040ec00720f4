"""The lab's transformers architectures: one builder per model, each from its config class.

Every builder maps the lab's dimensions (:class:`~foreshock.lab.model.GPTConfig`) onto the
model's own config class — offline, random weights, nothing downloaded — and builds the causal
LM with the lab's FlashAttention backward as its attention implementation
(:mod:`foreshock.lab.hf_attention`). What they share, and why:

* **Widths.** d = ``n_embd``; a head is d_h = d / ``n_head`` wide. An expert is
  ``expert_hidden`` or 4d/k wide (k = ``top_k``): the k experts a token reaches cost one dense
  4d MLP, as in the lab's own model, and the dense model (Llama) gets that 4d MLP itself.
* **Embeddings tied**, as in the lab's own model: with a 256-byte vocabulary the output layer
  would otherwise be a sizeable share of a tiny model's parameters.
* **Init** std 0.02 (every config's ``initializer_range``), the lab's own.
* **Balancing loss** ``aux_loss_weight`` is the config's ``router_aux_loss_coef`` where the
  model has one (Mixtral, Qwen3-MoE, OLMoE); DeepSeek-V3 balances with its router bias.

Each builder returns a :class:`~foreshock.lab.lab_model.LabModel` whose ``settings`` are the
config class and the arguments it was built with (recorded in the run's labels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from foreshock.producers.module_attrs import submodule, tensor_attr

from .hf_attention import register
from .lab_model import LabModel, set_switch
from .model import GPTConfig
from .router_bias import BiasBalancer

__all__ = ["deepseek_v3", "llama", "mixtral", "olmoe", "qwen2", "qwen2_moe", "qwen3_moe"]


def mixtral(config: GPTConfig) -> LabModel:
    """Mixtral: GQA attention, softmax router over ``n_experts`` SwiGLU experts, top-k with
    renormalised weights (the model's own), balancing loss."""
    return _causal_lm(
        "Mixtral",
        config,
        intermediate_size=_expert_width(config),
        num_key_value_heads=config.n_kv_head or config.n_head,
        num_local_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        router_aux_loss_coef=config.aux_loss_weight,
    )


def llama(config: GPTConfig) -> LabModel:
    """Llama: dense (a 4d SwiGLU MLP), GQA attention, no router — the lab's dense control."""
    return _dense("Llama", config)


def qwen2(config: GPTConfig) -> LabModel:
    """Qwen2: dense like Llama, but q, k and v projections carry a bias (W x + b), so the
    monitored W_q, W_k are not the whole projection — a layout no profile was made on."""
    return _dense("Qwen2", config)


def qwen2_moe(config: GPTConfig) -> LabModel:
    """Qwen2-MoE: GQA attention with q/k/v biases, a softmax router whose top-k weights are
    not renormalised (``norm_topk_prob`` off, as released), and one shared expert of a dense
    4d MLP's width beside the routed ones, mixed in through its own sigmoid gate
    σ(w_s·x) — a gate the router monitors do not read (listed as skipped)."""
    return _causal_lm(
        "Qwen2Moe",
        config,
        num_key_value_heads=config.n_kv_head or config.n_head,
        intermediate_size=4 * config.n_embd,  # dense layers only; there are none
        moe_intermediate_size=_expert_width(config),
        shared_expert_intermediate_size=_expert_width(config),
        num_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        norm_topk_prob=False,
        router_aux_loss_coef=config.aux_loss_weight,
    )


def qwen3_moe(config: GPTConfig) -> LabModel:
    """Qwen3-MoE: GQA attention whose q and k pass an RMS norm per head (over d_h, with a
    learned scale) before the rotary embedding — the QK-norm that bounds |q|, |k| and so the
    logits q·k/√d_h — and a softmax router with renormalised top-k weights
    (``norm_topk_prob``, on in the released Qwen3-MoE models, off in the config class)."""
    return _causal_lm(
        "Qwen3Moe",
        config,
        head_dim=config.n_embd // config.n_head,  # the config class's default is 128
        num_key_value_heads=config.n_kv_head or config.n_head,
        intermediate_size=4 * config.n_embd,  # dense layers only; there are none
        moe_intermediate_size=_expert_width(config),
        num_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        norm_topk_prob=True,
        router_aux_loss_coef=config.aux_loss_weight,
    )


def olmoe(config: GPTConfig) -> LabModel:
    """OLMoE: QK-norm over the whole q and k projections (RMS over all heads' d, one learned
    scale per channel), multi-head attention as released (``n_kv_head`` applies if given), a
    softmax router whose top-k weights are not renormalised, balancing loss. No padding or
    end token: the config class's pad id 1 would freeze byte 0x01's embedding, and its end id
    lies outside the 256-byte vocabulary."""
    return _causal_lm(
        "Olmoe",
        config,
        num_key_value_heads=config.n_kv_head or config.n_head,
        intermediate_size=_expert_width(config),  # OLMoE's experts are this wide
        num_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        router_aux_loss_coef=config.aux_loss_weight,
        pad_token_id=None,
        eos_token_id=None,
    )


def deepseek_v3(config: GPTConfig) -> LabModel:
    """DeepSeek-V3: multi-head latent attention and a sigmoid router with a balancing bias.

    MLA at DeepSeek-V3's head proportions (its d_h = 128: d_nope 128, d_rope 64, d_v 128): per
    head a content part d_nope = d_h and a rotary part d_rope = d_h / 2 of q and k, so the
    kernel sees d_qk = 1.5·d_h and scale 1/√d_qk, and values of d_v = d_h. q comes through a
    latent of rank d/2, k_nope and v through a shared latent of rank d/2 (V3's 1536 and 512 of
    d = 7168 would leave a 128-wide model ranks 27 and 9); the rotary k is one head shared by
    all. There are no key/value head groups (``n_kv_head`` must be 0 or ``n_head``).

    The router: sigmoid scores, the experts chosen on score + bias within the best groups
    (:func:`_groups`), the chosen scores renormalised and scaled by 2.5 (V3's
    ``routed_scaling_factor``), one shared expert beside them. No balancing loss: the bias
    moves against the load after every step (:mod:`foreshock.lab.router_bias`). Every layer
    is MoE (V3's first three are dense): at two layers a dense first one would halve the
    routers the monitors compare."""
    d_h = config.n_embd // config.n_head
    n_group, topk_group = _groups(config.n_experts, config.top_k)
    lab = _causal_lm(
        "DeepseekV3",
        config,
        num_key_value_heads=config.n_head,
        intermediate_size=4 * config.n_embd,  # dense layers only; there are none
        moe_intermediate_size=_expert_width(config),
        n_routed_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        n_shared_experts=1,
        first_k_dense_replace=0,
        n_group=n_group,
        topk_group=topk_group,
        q_lora_rank=config.n_embd // 2,
        kv_lora_rank=config.n_embd // 2,
        qk_nope_head_dim=d_h,
        qk_rope_head_dim=d_h // 2,
        v_head_dim=d_h,
        # No YaRN: it would scale the logits by mscale², which the lab's kernel refuses.
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    gates = [submodule(submodule(layer, "mlp"), "gate") for layer in _layers(lab.model)]
    lab.after_step = BiasBalancer(gates).step
    return lab


def _groups(n_experts: int, top_k: int) -> tuple[int, int]:
    """DeepSeek-V3's node-limited routing, scaled down: (groups, groups kept per token).

    V3 splits its 256 experts into 8 groups, scores a group by the sum of its two best expert
    scores, keeps the best 4 groups (half) and picks the top-k experts among them. Here: the
    most groups of at least two experts, up to 4, with half of them kept — if their experts
    still number at least k; else one group (plain top-k)."""
    for n_group in (4, 2):
        size, kept = n_experts // n_group, n_group // 2
        if n_experts % n_group == 0 and size >= 2 and kept * size >= top_k:
            return n_group, kept
    return 1, 1


def _dense(family: str, config: GPTConfig) -> LabModel:
    """A dense model of ``family``: a 4d SwiGLU MLP, GQA attention, no router."""
    return _causal_lm(
        family,
        config,
        intermediate_size=4 * config.n_embd,
        num_key_value_heads=config.n_kv_head or config.n_head,
    )


def _expert_width(config: GPTConfig) -> int:
    return config.expert_hidden or 4 * config.n_embd // config.top_k


def _causal_lm(family: str, config: GPTConfig, **settings: Any) -> LabModel:
    """``<family>ForCausalLM`` from ``<family>Config``: the lab's shared settings (vocabulary,
    width, depth, heads, window, init, tied embeddings, attention) and the family's own."""
    import transformers

    settings = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "max_position_embeddings": config.block_size,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        **settings,
    }
    config_class: Callable[..., Any] = getattr(transformers, f"{family}Config")
    model_class: Callable[..., Any] = getattr(transformers, f"{family}ForCausalLM")
    hf_config = config_class(**settings, attn_implementation=register())
    model = model_class(hf_config)
    layers = _layers(model)
    attention = {
        f"model.layers.{i}.self_attn": submodule(layer, "self_attn")
        for i, layer in enumerate(layers)
    }
    for layer in attention.values():
        set_switch(layer, "lowp", None)
        set_switch(layer, "logit_observer", None)
    mlps = [submodule(layer, "mlp") for layer in layers]
    gates = [submodule(mlp, "gate") for mlp in mlps if hasattr(mlp, "gate")]  # MoE layers
    return LabModel(
        model,
        attention=attention,
        moe={},  # dropless dispatch: no drops to observe
        routers=[tensor_attr(gate, "weight") for gate in gates],
        aux_loss_weight=config.aux_loss_weight if "router_aux_loss_coef" in settings else 0.0,
        settings={"config_class": f"{family}Config", **settings},
    )


def _layers(model: nn.Module) -> list[nn.Module]:
    """A transformers causal LM's decoder layers, in order (``model.model.layers``)."""
    return list(submodule(submodule(model, "model"), "layers").children())
