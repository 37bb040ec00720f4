"""Watching a model's attention must not change what it computes: its mask included.

Foreshock routes a transformers model's attention through its ``max_logit`` wrapper
(``foreshock+<impl>``). transformers builds the mask with its mask registry's function for the
configured implementation, and none for a name it does not hold; an eager attention given no
mask attends to every position — the future too. A tiny Mixtral on eager attention trained
that way with the HF callback (training loss 1.1 nats, causal held-out loss 5.6).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")


def _llama(implementation: str) -> object:
    config = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=32,
        vocab_size=64, max_position_embeddings=16, attn_implementation=implementation,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_a_watched_model_computes_what_it_did_and_stays_causal(implementation, tmp_path):
    from foreshock.producers.hf_attention import record_max_logit, switch_layer
    from foreshock.producers.monitor import Monitor
    from foreshock.producers.sinks import JsonlSink

    model = _llama(implementation)
    x = torch.randint(0, 64, (2, 16))
    before = model(input_ids=x).logits
    monitor = Monitor(model, JsonlSink(tmp_path / "r.jsonl"), run_id="mask")
    assert set(record_max_logit(model, monitor).values()) == {"registry"}
    assert model.config._attn_implementation == f"foreshock+{implementation}"
    watched = model(input_ids=x).logits
    assert torch.allclose(watched, before, atol=1e-5)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64  # only the last token differs
    assert torch.allclose(model(input_ids=changed).logits[:, :-1], watched[:, :-1], atol=1e-5)
    # a layer switched to the other implementation (the precise-attention remedy) too
    # (an sdpa model builds no mask: the wrapper gives a layer switched to eager its own)
    other = "sdpa" if implementation == "eager" else "eager"
    switch_layer(model.model.layers[0].self_attn, other)
    assert torch.allclose(model(input_ids=x).logits, before, atol=1e-5)
    monitor.close()
