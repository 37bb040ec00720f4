"""OLMo-core models, built on CPU: discovery, the w_q/w_k factors, the flat linear router.

The dropless MoE's expert kernels need Triton, so the attention and the router are run as
modules on their own. Skipped when ai2-olmo-core is not installed: it is not a project extra
(installing it downgrades huggingface_hub, rich and filelock under transformers 5.13).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("olmo_core.nn.transformer")

from foreshock.producers.discovery import discover  # noqa: E402
from foreshock.producers.monitor import Monitor, MonitorConfig  # noqa: E402
from foreshock.producers.sinks import ListSink  # noqa: E402

D, H, KV, E, K = 32, 4, 2, 4, 2


def build_moe():
    """A 2-layer OLMo-core MoE transformer: 4 heads over 2 kv heads, whole-projection RMS
    QK-norm, 4 experts, top-2."""
    from olmo_core.nn.transformer import TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig.llama_like_moe(
        d_model=D,
        vocab_size=64,
        n_layers=2,
        n_heads=H,
        n_kv_heads=KV,
        num_experts=E,
        top_k=K,
        expert_hidden_size=16,
        dropless=True,
        qk_norm=True,
        lb_loss_weight=None,
        z_loss_weight=None,
    )
    return config.build(init_device="cpu")


def test_discovery_finds_everything_once():
    model = build_moe()
    found = discover(model)
    assert found.skipped == []
    assert [a.name for a in found.attention] == ["blocks.0.attention", "blocks.1.attention"]
    assert [(a.n_heads, a.n_kv_heads, a.head_dim) for a in found.attention] == [(H, KV, 8)] * 2
    names = [r.name for r in found.routers]
    assert names == ["blocks.0.feed_forward_moe.router", "blocks.1.feed_forward_moe.router"]
    router = found.routers[0]
    flat = model.blocks["0"].feed_forward_moe.router.weight
    assert router.weight is flat and router.matrix().shape == (E, D)  # the parameter, viewed
    assert router.matrix().data_ptr() == flat.data_ptr()
    assert (router.n_experts, router.top_k, router.scoring) == (E, K, "softmax")
    model.to(torch.float64)  # swaps the storage: the view is taken at every read
    assert router.rows().dtype == torch.float64 and router.rows().shape == (E, D)


def test_w_q_w_k_factors_reproduce_the_scores():
    """q^h·k^gᵀ of the normalised projections equals x M^h xᵀ (folded scales) divided by the
    per-token RMS of the whole un-normalised q (and k) projections."""
    model = build_moe()
    attn = model.blocks["0"].attention
    spec = discover(model).attention[0]
    x = torch.randn(2, 6, D, dtype=torch.float64)
    attn.to(torch.float64)
    with torch.no_grad():
        q = attn.q_norm(attn.w_q(x)).view(2, 6, H, 8)  # what forward computes before RoPE
        k = attn.k_norm(attn.w_k(x)).view(2, 6, KV, 8)
        wq, wk = spec.heads("q"), spec.heads("k")  # (H, d, d_h), (KV, d, d_h)
        q_f = torch.einsum("btd,hde->bthe", x, wq)
        k_f = torch.einsum("btd,hde->bthe", x, wk)
        eps = attn.q_norm.eps
        q_rms = (attn.w_q(x).square().mean(-1) + eps).sqrt()  # (b, t): whole projection
        k_rms = (attn.w_k(x).square().mean(-1) + eps).sqrt()
    for h in range(H):
        g = h // (H // KV)
        kernel = torch.einsum("bte,bse->bts", q[:, :, h], k[:, :, g])
        bilinear = torch.einsum("bte,bse->bts", q_f[:, :, h], k_f[:, :, g])
        expected = bilinear / (q_rms[:, :, None] * k_rms[:, None, :])
        torch.testing.assert_close(kernel, expected, rtol=1e-5, atol=1e-6)  # norm in fp32


def test_collapsed_router_reports_the_true_entropy():
    """Each token's routing collapsed onto one expert: foreshock's token entropy is that of
    softmax(get_expert_logits(x)), not of the top-k weights the router returns."""
    model = build_moe()
    router = model.blocks["0"].feed_forward_moe.router
    with torch.no_grad():
        router.weight.mul_(400.0)
    monitor = Monitor(model, ListSink(), config=MonitorConfig(every=2, weight_spectra=False))
    assert monitor.discovery.skipped == []
    x = torch.randn(2, 8, D)
    router.train()
    router(x)
    record = monitor.step(0)
    monitor.close()
    assert monitor.errors == 0
    logp = torch.log_softmax(x.double() @ router.weight.detach().double().view(E, D).T, -1)
    true = (-(logp.exp() * logp).sum(-1) / math.log(E)).mean().item()
    assert true < 0.1
    values = record["values"]
    name = "blocks.0.feed_forward_moe.router"
    assert values[f"router.token_entropy_norm@{name}"] == pytest.approx(true, abs=1e-5)
    _, indices, *_ = router(x)
    load = torch.bincount(indices.flatten(), minlength=E).double()
    q = load / load.sum()
    expected = (-(q * q.clamp_min(1e-300).log()).sum() / math.log(E)).item()
    assert values[f"router.load_entropy@{name}"] == pytest.approx(expected, abs=1e-5)
