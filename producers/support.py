"""The support matrix: which model architectures the monitors read, and how.

Each entry builds a tiny model of that architecture offline from its transformers config class
(random weights, nothing downloaded). ``tests/test_support_matrix.py`` checks every entry
against a dense float64 reference and the model's own attention inputs, and the support
table of ``docs/monitoring.md`` is ``render_table()`` (a docs test compares them), so the
table can't drift.

    python -m foreshock.producers.support      # print the table (needs the hf extra)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ARCHITECTURES", "Architecture", "build", "render_table", "support_rows"]

_SMALL = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_size=64,
    vocab_size=128,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


@dataclass(frozen=True)
class Architecture:
    """One row of the matrix: a transformers config class, its tiny settings, what is covered."""

    name: str
    config_class: str
    settings: dict[str, Any]
    attention: str  # the layout, and what of the score the monitor covers
    router: str = "—"  # the router and its scoring, or "—" for a dense model


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        "GPT-2",
        "GPT2Config",
        dict(
            n_embd=64,
            n_head=4,
            n_layer=2,
            vocab_size=128,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        ),
        "fused `c_attn` Conv1D [q, k, v], biases folded: exact",
    ),
    Architecture(
        "Llama (GQA)",
        "LlamaConfig",
        dict(_SMALL, num_key_value_heads=2),
        "`q_proj`/`k_proj`, 4 heads / 2 kv: exact",
    ),
    Architecture(
        "Qwen3",
        "Qwen3Config",
        dict(_SMALL, num_key_value_heads=2, head_dim=16),
        "`q_proj`/`k_proj` + per-head RMS QK-norm scale folded: exact",
    ),
    Architecture(
        "Phi-3",
        "Phi3Config",
        dict(_SMALL, num_key_value_heads=2, pad_token_id=0),
        "fused `qkv_proj` [q, k, v], GQA: exact",
    ),
    Architecture(
        "GPT-NeoX / Pythia",
        "GPTNeoXConfig",
        dict(_SMALL),
        "fused `query_key_value`, per-head [q k v] interleaved, biases: exact",
    ),
    Architecture(
        "Falcon (multi-query)",
        "FalconConfig",
        dict(_SMALL, multi_query=True, new_decoder_architecture=False),
        "fused `query_key_value` [q heads, k, v], 1 kv head: exact",
    ),
    Architecture(
        "Falcon (new decoder)",
        "FalconConfig",
        dict(_SMALL, new_decoder_architecture=True, num_kv_heads=2),
        "fused `query_key_value`, per group [q q k v]: exact",
    ),
    Architecture(
        "Mixtral",
        "MixtralConfig",
        dict(_SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        "`q_proj`/`k_proj`, GQA: exact",
        "`MixtralTopKRouter`, softmax, top-2",
    ),
    Architecture(
        "Qwen2-MoE",
        "Qwen2MoeConfig",
        dict(
            _SMALL,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        "`q_proj`/`k_proj` with biases: exact",
        "`Qwen2MoeTopKRouter`, softmax, top-2 (shared-expert gate: not a router)",
    ),
    Architecture(
        "Qwen3-MoE",
        "Qwen3MoeConfig",
        dict(
            _SMALL,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            head_dim=16,
        ),
        "`q_proj`/`k_proj` + per-head QK-norm: exact",
        "`Qwen3MoeTopKRouter`, softmax, top-2",
    ),
    Architecture(
        "OLMoE",
        "OlmoeConfig",
        dict(_SMALL, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2),
        "`q_proj`/`k_proj` + whole-projection QK-norm: exact",
        "`OlmoeTopKRouter`, softmax, top-2",
    ),
    Architecture(
        "GPT-OSS",
        "GptOssConfig",
        dict(
            _SMALL,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            head_dim=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "`q_proj`/`k_proj` with biases: exact (attention sinks not in max_logit)",
        "`GptOssTopKRouter` with bias, softmax, top-2",
    ),
    Architecture(
        "DeepSeek-V3 (MLA)",
        "DeepseekV3Config",
        dict(
            _SMALL,
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_group=2,
            topk_group=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=16,
            first_k_dense_replace=1,
            n_shared_experts=1,
            rope_parameters=_ROPE,
        ),
        "MLA: content score q_nope·k_nope from x through both latents (norm scales "
        "folded): exact; the RoPE part q_rope·k_rope: not covered",
        "`DeepseekV3TopkRouter`, sigmoid (normalised), grouped top-2 as selected",
    ),
)


def build(arch: Architecture, seed: int = 0) -> Any:
    """A tiny causal LM of ``arch`` with random weights (needs transformers)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, arch.config_class)(**arch.settings)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # tiny configs trip token-id warnings
    try:
        return transformers.AutoModelForCausalLM.from_config(config)
    finally:
        transformers.logging.set_verbosity(verbosity)


def support_rows(
    build_model: Callable[[Architecture], Any] = build,
) -> list[dict[str, Any]]:
    """Per architecture: what discovery finds (counts, skipped) and how max_logit is taken."""
    from foreshock.producers.discovery import discover
    from foreshock.producers.hf_attention import _uses_registry
    from foreshock.producers.names import named_modules

    rows = []
    for arch in ARCHITECTURES:
        model = build_model(arch)
        found = discover(model)
        modules = dict(named_modules(model))
        paths = {
            "registry" if _uses_registry(modules[a.name]) else "SDPA call" for a in found.attention
        }
        rows.append(
            {
                "architecture": arch.name,
                "attention": arch.attention,
                "router": arch.router,
                "layers": len(found.attention),
                "routers": len(found.routers),
                "max_logit": " + ".join(sorted(paths)),
                "skipped": list(found.skipped),
            }
        )
    return rows


def render_table(rows: list[dict[str, Any]] | None = None) -> str:
    """The support table of docs/monitoring.md (markdown)."""
    rows = support_rows() if rows is None else rows
    header = (
        "architecture",
        "attention layers",
        "routers",
        "max_logit via",
        "attention covered",
        "router",
    )
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for r in rows:
        lines.append(
            f"| {r['architecture']} | {r['layers']} | {r['routers']} | {r['max_logit']} "
            f"| {r['attention']} | {r['router']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_table())
