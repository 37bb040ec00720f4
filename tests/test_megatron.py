"""Megatron-core models, built and run on CPU: discovery, the linear_qkv factors, the router.

Megatron assumes CUDA in four places; the shims below (the test's, never the product's) send
them to the CPU: ``torch.cuda.current_device`` (weights are moved to it), the CUDA RNG state
get/set (the model-parallel RNG tracker forks it around dropout), and Megatron 0.16's
``te_general_gemm`` left undefined without Transformer Engine. The causal mask is passed
explicitly (its default is built on "cuda"). Skipped when megatron-core is not installed
(the ``megatron`` extra).
"""

from __future__ import annotations

import math
import os
import socket

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from foreshock.producers.discovery import discover  # noqa: E402
from foreshock.producers.monitor import Monitor, MonitorConfig  # noqa: E402
from foreshock.producers.sinks import ListSink  # noqa: E402

H, GROUPS, D, E, K, SEQ, BATCH = 4, 2, 32, 4, 2, 8, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_shims(mp: pytest.MonkeyPatch) -> None:
    """The four CUDA shims (see the module docstring)."""
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.transformer.moe.moe_utils as moe_utils

    mp.setattr(torch.cuda, "current_device", lambda: "cpu")
    mp.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    mp.setattr(torch.cuda.random, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    mp.setattr(mrandom, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state))
    mp.setattr(moe_utils, "te_general_gemm", None, raising=False)


@pytest.fixture(scope="module")
def megatron_world():
    """A gloo process group of world 1 and Megatron's parallel state (TP = EP = 1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    with pytest.MonkeyPatch.context() as mp:
        cpu_shims(mp)
        owned = not dist.is_initialized()
        if owned:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            mp.setenv("MASTER_PORT", str(_free_port()))
            dist.init_process_group("gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(0)
        yield
        parallel_state.destroy_model_parallel()
        if owned:
            dist.destroy_process_group()


def build_gpt_moe(**overrides):
    """A 2-layer GPT with MoE MLPs: 4 query heads in 2 groups, RMS QK-norm, 4 experts, top-2."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    options = dict(
        num_layers=2,
        hidden_size=D,
        num_attention_heads=H,
        num_query_groups=GROUPS,
        num_moe_experts=E,
        moe_router_topk=K,
        moe_ffn_hidden_size=16,
        ffn_hidden_size=64,
        qk_layernorm=True,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        add_bias_linear=False,
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather",
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    options.update(overrides)
    config = TransformerConfig(**options)
    spec = get_gpt_layer_local_spec(num_experts=E, qk_layernorm=True, normalization="RMSNorm")
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=16
    )


def run(model) -> torch.Tensor:
    ids = torch.randint(0, 64, (BATCH, SEQ))
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.triu(torch.ones(SEQ, SEQ), 1).bool()[None, None]  # True: masked
    return model(ids, positions, causal, labels=ids)


def test_discovery_finds_everything(megatron_world):
    found = discover(build_gpt_moe())
    assert found.skipped == []
    assert [a.name for a in found.attention] == [
        f"decoder.layers.{i}.self_attention" for i in (0, 1)
    ]
    assert [(a.n_heads, a.n_kv_heads, a.head_dim) for a in found.attention] == [(H, GROUPS, 8)] * 2
    assert [r.name for r in found.routers] == [f"decoder.layers.{i}.mlp.router" for i in (0, 1)]
    assert [(r.n_experts, r.top_k, r.scoring) for r in found.routers] == [(E, K, "softmax")] * 2
    again = discover(build_gpt_moe())
    assert len(again.routers) == 2  # a fresh model, fresh taps
    model = build_gpt_moe()
    assert discover(model).routers[0].module is discover(model).routers[0].module  # one tap


def test_linear_qkv_factors_reproduce_the_scores(megatron_world):
    """Per head h: the kernel's scores q^h·k^gᵀ (g = h // (H/G)) equal x M^h xᵀ with
    M^h = W_q^h diag(g_q) (W_k^g diag(g_k))ᵀ, divided by the per-(token, head) RMS of the
    un-normalised projections (the RMS QK-norm's only other effect)."""
    model = build_gpt_moe()
    attn = model.decoder.layers[0].self_attention
    spec = discover(model).attention[0]
    seen = {}

    def keep(key):
        def hook(module, args):
            seen.setdefault(key, args[0] if key == "x" else args[:2])

        return hook

    attn.linear_qkv.register_forward_pre_hook(keep("x"))
    attn.core_attention.register_forward_pre_hook(keep("qk"))
    with torch.no_grad():
        run(model)
    x = seen["x"].double()  # (s, b, d)
    q_kernel, k_kernel = (t.double() for t in seen["qk"])  # (s, b, H, d_h), (s, b, G, d_h)
    wq, wk = spec.heads("q").double(), spec.heads("k").double()  # (H, d, d_h), (G, d, d_h)
    q_scale = attn.q_layernorm.weight.double()
    k_scale = attn.k_layernorm.weight.double()
    q_f = torch.einsum("sbd,hde->sbhe", x, wq)  # folded: (x W_q^h) ⊙ g_q
    k_f = torch.einsum("sbd,hde->sbhe", x, wk)
    eps = attn.config.layernorm_epsilon
    q_rms = ((q_f / q_scale).square().mean(-1) + eps).sqrt()  # (s, b, H)
    k_rms = ((k_f / k_scale).square().mean(-1) + eps).sqrt()
    r = H // GROUPS
    for h in range(H):
        g = h // r
        kernel = torch.einsum("tbe,sbe->bts", q_kernel[:, :, h], k_kernel[:, :, g])
        bilinear = torch.einsum("tbe,sbe->bts", q_f[:, :, h], k_f[:, :, g])
        expected = bilinear / (q_rms[:, :, h].T[:, :, None] * k_rms[:, :, g].T[:, None, :])
        torch.testing.assert_close(kernel, expected, rtol=1e-5, atol=1e-6)


def _true_entropy_norm(router, captured: list[torch.Tensor]) -> float:
    """Mean over tokens of H(softmax(x Wᵀ)) / ln E, in float64, from the router's inputs."""
    w = router.weight.detach().double()
    h = []
    for x in captured:
        logp = torch.log_softmax(x.detach().double().reshape(-1, D) @ w.T, dim=-1)
        h.append(-(logp.exp() * logp).sum(-1) / math.log(E))
    return torch.cat(h).mean().item()


def test_collapsed_router_reports_the_true_entropy(megatron_world):
    """A router scaled until each token has one dominant expert: foreshock's token entropy is
    the entropy of softmax(logits) from ``gating``, not of the sparse top-k probabilities."""
    model = build_gpt_moe()
    router = model.decoder.layers[0].mlp.router
    with torch.no_grad():
        router.weight.mul_(400.0)
    captured: list[torch.Tensor] = []
    router.register_forward_pre_hook(lambda m, a: captured.append(a[0]))
    monitor = Monitor(model, ListSink(), config=MonitorConfig(every=2, weight_spectra=False))
    assert monitor.discovery.skipped == []
    model.train()
    run(model).mean().backward()
    record = monitor.step(0)
    monitor.close()
    assert monitor.errors == 0
    values = record["values"]
    name = "decoder.layers.0.mlp.router"
    true = _true_entropy_norm(router, captured)
    assert true < 0.1  # collapsed
    assert values[f"router.token_entropy_norm@{name}"] == pytest.approx(true, abs=1e-5)
    # the load counts the routing_map: every token sends K assignments, E experts see them
    assert 0.0 <= values[f"router.load_entropy@{name}"] <= 1.0


def test_routing_map_is_the_selection(megatron_world):
    """The tap hands on (logits, routing_map): the map's column sums are the load."""
    from foreshock.producers.router import RoutingAccumulator, router_output

    model = build_gpt_moe()
    router = model.decoder.layers[1].mlp.router
    spec = discover(model).routers[1]
    got = []
    spec.module.register_forward_hook(lambda m, a, out: got.append(out))
    maps = []
    router.register_forward_hook(lambda m, a, out: maps.append(out[1]))
    model.train()
    run(model)
    logits, selected = router_output(got[0], E, K)
    assert logits.shape == (SEQ, BATCH, E) and selected.dtype == torch.bool
    assert torch.equal(selected, maps[0])
    acc = RoutingAccumulator(E, K)
    acc.update(logits, selected)
    assert acc._load.tolist() == maps[0].sum(0).float().tolist()
