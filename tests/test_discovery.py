"""Discovery of attention Q/K factors and MoE routers across the common model layouts.

Each layout is a small model written here the way its code base writes it. For every attention
layout the extracted per-head factors must *be* the circuit: with x̃ = [x, 1] when biases are
folded in, x̃ W_q^h (W_k^{g(h)})ᵀ x̃ᵀ must equal the scores q_h k_hᵀ the model itself computes
(g(h) = h // (H / H_kv) under grouped-query attention).
"""

from __future__ import annotations

import logging
import math
import types

import pytest
import torch
from torch import nn

from foreshock.producers import AttentionSpec, ListSink, Monitor, MonitorConfig, discover
from foreshock.transport.records import parse_series_key

torch.set_num_threads(1)

D = 32  # model width used by every layout below
T = 7  # tokens per test sequence


# ---- helpers ------------------------------------------------------------------------------


def folded_scores(spec: AttentionSpec, x: torch.Tensor) -> torch.Tensor:
    """Scores (H, T, T) from the discovered factors alone: x̃ W_q^h W_k^{g(h)ᵀ} x̃ᵀ."""
    q_heads, k_heads = spec.heads("q"), spec.heads("k")
    if spec.model_dim == x.shape[-1] + 1:
        x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=-1)
    assert spec.model_dim == x.shape[-1]
    group = spec.n_heads // spec.n_kv_heads
    return torch.stack([x @ q_heads[h] @ k_heads[h // group].T @ x.T for h in range(spec.n_heads)])


def only_attention(model: nn.Module) -> AttentionSpec:
    found = discover(model)
    assert len(found.attention) == 1, found.summary()
    assert not found.skipped, found.skipped
    return found.attention[0]


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def randomize_(module: nn.Module, seed: int) -> None:
    """Non-trivial values everywhere (biases and norm scales included), float64."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


class Wrapper(nn.Module):
    """Puts an attention (or MoE) module at a realistic path: ``layers.0.<child>``."""

    def __init__(self, child_name: str, child: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Module()])
        self.layers[0].add_module(child_name, child)
        self.embed = nn.Linear(D, D)


# ---- (a) nanoGPT: fused c_attn nn.Linear(d, 3d), attribute n_head ----------------------------


class NanoGPTAttention(nn.Module):
    def __init__(self, n_head: int, bias: bool) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(D, 3 * D, bias=bias)
        self.c_proj = nn.Linear(D, D, bias=bias)

    def scores(self, x: torch.Tensor) -> torch.Tensor:  # x (T, D) → (H, T, T)
        q, k, _ = self.c_attn(x).split(D, dim=-1)
        q, k = (t.view(x.shape[0], self.n_head, -1).transpose(0, 1) for t in (q, k))
        return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("bias", [False, True])
def test_nanogpt_fused_linear(bias: bool) -> None:
    attn = NanoGPTAttention(n_head=4, bias=bias).double()
    randomize_(attn, 1)
    spec = only_attention(Wrapper("attn", attn))
    assert spec.name == "layers.0.attn"
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim) == (4, 4, 8)
    assert spec.model_dim == D + bias
    assert spec.heads("q").shape == (4, D + bias, 8)
    x = torch.randn(T, D, dtype=torch.float64)
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


# ---- (b) HF GPT-2: Conv1D stored (in, out), attribute num_heads ------------------------------


class Conv1D(nn.Module):  # the name is what discovery keys on, as in transformers.pytorch_utils
    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(
            *x.shape[:-1], self.nf
        )


class GPT2Attention(nn.Module):
    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.c_attn = Conv1D(3 * D, D)
        self.c_proj = Conv1D(D, D)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        q, k, _ = self.c_attn(x).split(D, dim=-1)
        q, k = (t.view(x.shape[0], self.num_heads, -1).transpose(0, 1) for t in (q, k))
        return q @ k.transpose(-1, -2)


def test_gpt2_conv1d_transposed_with_bias() -> None:
    attn = GPT2Attention(num_heads=2).double()
    randomize_(attn, 2)
    assert attn.c_attn.weight.shape == (D, 3 * D) and attn.c_attn.bias.shape == (3 * D,)
    spec = only_attention(Wrapper("attn", attn))
    assert spec.transposed
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.model_dim) == (2, 2, 16, D + 1)
    # The factor of head 1 is columns 16:32 of the (in, out) weight, plus the bias as a last row.
    expected_q1 = torch.cat([attn.c_attn.weight[:, 16:32], attn.c_attn.bias[None, 16:32]])
    torch.testing.assert_close(spec.heads("q")[1], expected_q1.detach(), rtol=0, atol=0)
    x = torch.randn(T, D, dtype=torch.float64)
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


# ---- (c) Llama / Mistral: q_proj/k_proj/v_proj/o_proj, GQA, head counts in `config` ----------


class LlamaAttention(nn.Module):
    def __init__(self, config: types.SimpleNamespace, bias: bool = False) -> None:
        super().__init__()
        self.config = config
        heads = getattr(config, "num_attention_heads", None) or config.num_heads
        kv_heads, head_dim = config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(D, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(D, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(D, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, D, bias=False)
        self.n_rep = heads // kv_heads

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = self.config.head_dim
        q = self.q_proj(x).view(x.shape[0], -1, head_dim).transpose(0, 1)  # (H, T, d_h)
        k = self.k_proj(x).view(x.shape[0], -1, head_dim).transpose(0, 1)  # (H_kv, T, d_h)
        return q, k

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.project(x)
        k = k.repeat_interleave(self.n_rep, dim=0)  # transformers' repeat_kv
        return q @ k.transpose(-1, -2)


@pytest.mark.parametrize(
    "head_attrs",
    [
        {"num_attention_heads": 8, "num_key_value_heads": 2},  # transformers' LlamaConfig
        {"num_heads": 8, "num_key_value_heads": 2},
    ],
)
@pytest.mark.parametrize("bias", [False, True])  # Qwen2 has q/k/v biases
def test_llama_gqa_heads_from_config(head_attrs: dict[str, int], bias: bool) -> None:
    # head_dim = 6 on purpose: H·d_h = 48 ≠ d, so only the config's head_dim can be right.
    config = types.SimpleNamespace(head_dim=6, **head_attrs)
    attn = LlamaAttention(config, bias=bias).double()
    randomize_(attn, 3)
    assert not hasattr(attn, "num_heads") and not hasattr(attn, "num_key_value_heads")
    spec = only_attention(Wrapper("self_attn", attn))
    assert spec.name == "layers.0.self_attn"
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim) == (8, 2, 6)
    assert spec.heads("q").shape == (8, D + bias, 6)
    assert spec.heads("k").shape == (2, D + bias, 6)
    x = torch.randn(T, D, dtype=torch.float64)
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("biased", ["q", "k"])
def test_bias_on_one_side_only(biased: str) -> None:
    """A bias on q alone still adds the key-dependent term b_q W_kᵀ xᵀ: k gets a zero row."""
    config = types.SimpleNamespace(num_heads=4, num_key_value_heads=2, head_dim=8)
    attn = LlamaAttention(config, bias=True).double()
    randomize_(attn, 7)
    unbiased = attn.k_proj if biased == "q" else attn.q_proj
    unbiased.bias = None
    spec = only_attention(attn)
    assert spec.model_dim == D + 1
    other = "k" if biased == "q" else "q"
    assert spec.heads(other)[:, -1].abs().max() == 0
    x = torch.randn(T, D, dtype=torch.float64)
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


def test_llama_kv_heads_inferred_from_k_proj() -> None:
    """Without num_key_value_heads, H_kv is k_proj's outputs / head_dim."""
    attn = LlamaAttention(
        types.SimpleNamespace(num_heads=4, num_key_value_heads=2, head_dim=8)
    ).double()
    attn.config = types.SimpleNamespace(num_heads=4, head_dim=8)  # what discovery sees
    spec = only_attention(Wrapper("self_attn", attn))
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim) == (4, 2, 8)


# ---- (d) Qwen3: per-head RMSNorm on q and k (q_norm / k_norm), with and without biases ------


class Qwen3RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * rms(x, self.eps))


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: types.SimpleNamespace, bias: bool) -> None:
        super().__init__(config, bias=bias)
        self.q_norm = Qwen3RMSNorm(config.head_dim)
        self.k_norm = Qwen3RMSNorm(config.head_dim)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        k = k.repeat_interleave(self.n_rep, dim=0)
        return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("bias", [False, True])
def test_qwen3_qk_norm_scale_folded(bias: bool) -> None:
    config = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    attn = Qwen3Attention(config, bias=bias).double()
    randomize_(attn, 4)  # the norm scales g_q, g_k are random too, not ones
    spec = only_attention(Wrapper("self_attn", attn))
    assert spec.q_scale is attn.q_norm.weight and spec.k_scale is attn.k_norm.weight
    assert spec.model_dim == D + bias

    # The folded factors are exactly [W; b]^h · diag(g).
    for which, proj, norm, n in (
        ("q", attn.q_proj, attn.q_norm, 4),
        ("k", attn.k_proj, attn.k_norm, 2),
    ):
        w = proj.weight.detach()  # (n·d_h, d)
        if bias:
            w = torch.cat([w, proj.bias.detach()[:, None]], dim=1)
        expected = w.view(n, 8, -1).transpose(1, 2) * norm.weight.detach()
        torch.testing.assert_close(spec.heads(which), expected, rtol=0, atol=0)

    # And they are the circuit: the model's scores are the folded bilinear form, rescaled by
    # each token's RMS factors (which the normalization computes from the unscaled projections).
    x = torch.randn(T, D, dtype=torch.float64)
    q, k = attn.project(x)
    r_q = rms(q, attn.q_norm.eps)  # (H, T, 1)
    r_k = rms(k, attn.k_norm.eps).repeat_interleave(2, dim=0)  # (H, T, 1)
    expected_scores = r_q * folded_scores(spec, x) * r_k.transpose(-1, -2)
    torch.testing.assert_close(expected_scores, attn.scores(x), rtol=1e-10, atol=1e-9)


# ---- (e) fused qkv_proj with GQA sizes (Phi-3 style) ----------------------------------------


class FusedGQAAttention(nn.Module):
    def __init__(self, with_head_dim: bool, bias: bool) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads = 4, 2
        if with_head_dim:
            self.head_dim = 8
        self.qkv_proj = nn.Linear(D, (4 + 2 * 2) * 8, bias=bias)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        q, k, _ = self.qkv_proj(x).split([32, 16, 16], dim=-1)
        q = q.view(x.shape[0], 4, 8).transpose(0, 1)
        k = k.view(x.shape[0], 2, 8).transpose(0, 1).repeat_interleave(2, dim=0)
        return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("with_head_dim", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_qkv_proj_gqa(with_head_dim: bool, bias: bool) -> None:
    attn = FusedGQAAttention(with_head_dim, bias).double()
    randomize_(attn, 5)
    spec = only_attention(Wrapper("self_attn", attn))
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim) == (4, 2, 8)
    assert (spec.q_rows, spec.k_rows) == (slice(0, 32), slice(32, 48))
    x = torch.randn(T, D, dtype=torch.float64)
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


def test_fused_qkv_inconsistent_sizes_skipped() -> None:
    attn = FusedGQAAttention(with_head_dim=True, bias=False)
    attn.num_key_value_heads = 1  # 64 outputs ≠ (4 + 2·1)·8
    found = discover(Wrapper("self_attn", attn))
    assert not found.attention
    assert any("layers.0.self_attn" in s and "fused qkv" in s for s in found.skipped)


def test_factors_track_live_parameters() -> None:
    """The spec reads the live parameters (bias slices included), not a copy at discovery."""
    attn = NanoGPTAttention(n_head=2, bias=True).double()
    randomize_(attn, 6)
    spec = only_attention(attn)
    before_q, before_k = spec.heads("q"), spec.heads("k")
    opt = torch.optim.AdamW(attn.parameters(), lr=0.1)
    x = torch.randn(T, D, dtype=torch.float64)
    attn.scores(x).square().mean().backward()
    opt.step()
    assert not torch.equal(spec.heads("q"), before_q)
    assert not torch.equal(spec.heads("k")[:, -1], before_k[:, -1])  # the bias row moved
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("layout", ["c_attn", "conv1d", "q_proj"])
def test_factors_survive_module_to(layout: str) -> None:
    """Discovered before ``model.to(dtype)``: the spec still reads the live weights and biases.

    ``Module.to`` swaps each parameter's storage (``param.data = ...``); a bias view taken at
    discovery kept the old storage and silently froze the bias term (on a GPU, a device
    mismatch instead).
    """
    attn = {
        "c_attn": lambda: NanoGPTAttention(n_head=2, bias=True),
        "conv1d": lambda: GPT2Attention(num_heads=2),
        "q_proj": lambda: LlamaAttention(
            types.SimpleNamespace(num_heads=4, num_key_value_heads=2, head_dim=8), bias=True
        ),
    }[layout]()
    spec = only_attention(attn)  # float32 parameters at discovery
    attn.double()
    randomize_(attn, 8)  # in place, as an optimizer would
    assert spec.heads("q").dtype == spec.heads("k").dtype == torch.float64
    x = torch.randn(T, D, dtype=torch.float64)
    torch.testing.assert_close(folded_scores(spec, x), attn.scores(x), rtol=1e-10, atol=1e-9)


def test_bias_must_be_the_whole_projection_bias() -> None:
    weight, bias = torch.randn(3 * D, D), torch.randn(3 * D)
    spec = AttentionSpec(
        "fused",
        4,
        4,
        8,
        weight,
        weight,
        q_rows=slice(0, D),
        k_rows=slice(D, 2 * D),
        q_bias=bias,
        k_bias=bias,
    )
    torch.testing.assert_close(spec.heads("k")[:, -1].flatten(), bias[D : 2 * D])
    with pytest.raises(ValueError, match=r"k_bias has shape \(32,\)"):
        AttentionSpec(
            "fused",
            4,
            4,
            8,
            weight,
            weight,
            q_rows=slice(0, D),
            k_rows=slice(D, 2 * D),
            q_bias=bias,
            k_bias=bias[D : 2 * D],
        )


def test_heads_are_detached_copies() -> None:
    attn = NanoGPTAttention(n_head=2, bias=False)
    spec = only_attention(attn)
    q = spec.heads("q")
    assert not q.requires_grad
    q.zero_()
    assert attn.c_attn.weight.abs().sum() > 0


# ---- (f) Mixtral-style MoE: block_sparse_moe.gate + experts + top_k -------------------------


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(D, 2 * D, bias=False)
        self.w2 = nn.Linear(2 * D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))


class SparseMoeBlock(nn.Module):
    def __init__(self, n_experts: int = 4, top_k: int | None = 2) -> None:
        super().__init__()
        if top_k is not None:
            self.top_k = top_k
        self.gate = nn.Linear(D, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1)
        k = getattr(self, "top_k", 1)
        top_p, top_i = probs.topk(k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (top_i == e).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(x[token]) * top_p[token, slot, None])
        return out


class MixtralLayer(nn.Module):
    def __init__(self, top_k: int | None) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(
            types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        )
        self.block_sparse_moe = SparseMoeBlock(top_k=top_k)


class TinyMixtral(nn.Module):
    def __init__(self, top_k: int | None = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MixtralLayer(top_k) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer.block_sparse_moe(x)
        return x.square().mean()


def test_mixtral_router_discovered() -> None:
    found = discover(TinyMixtral(top_k=2))
    assert not found.skipped
    assert [a.name for a in found.attention] == ["layers.0.self_attn", "layers.1.self_attn"]
    assert [r.name for r in found.routers] == [
        "layers.0.block_sparse_moe.gate",
        "layers.1.block_sparse_moe.gate",
    ]
    model_gate = found.routers[0].module
    assert isinstance(model_gate, nn.Linear) and found.routers[0].weight is model_gate.weight
    assert all(r.n_experts == 4 and r.top_k == 2 for r in found.routers)
    assert "router layers.0.block_sparse_moe.gate: 4 experts, top_k=2" in found.summary()


def test_mixtral_top_k_from_config_name() -> None:
    model = TinyMixtral(top_k=None)
    for layer in model.layers:
        layer.block_sparse_moe.config = types.SimpleNamespace(num_experts_per_tok=2)
    found = discover(model)
    assert [r.top_k for r in found.routers] == [2, 2] and not found.skipped


def test_router_without_top_k_skips_load_metrics() -> None:
    torch.manual_seed(0)
    model = TinyMixtral(top_k=None)
    found = discover(model)
    assert [r.top_k for r in found.routers] == [None, None]
    assert len(found.skipped) == 2
    assert all("no top_k" in s for s in found.skipped)
    assert "layers.0.block_sparse_moe.gate" in found.skipped[0]

    monitor = Monitor(model, ListSink(), config=MonitorConfig(every=1))
    model(torch.randn(12, D)).backward()
    record = monitor.step(0)
    assert record is not None and monitor.errors == 0
    metrics = {parse_series_key(k).metric for k in record["values"]}
    assert "router.token_entropy" in metrics and "router.token_entropy_norm_p05" in metrics
    assert not metrics & {"router.load_entropy", "router.load_maxvio"}
    monitor.close()


def test_router_not_linear_or_wrong_size_is_skipped() -> None:
    moe = SparseMoeBlock()
    moe.gate = nn.Sequential(nn.Linear(D, 4))  # no weight of its own: the logits are inside
    found = discover(Wrapper("mlp", moe))
    assert not found.routers
    assert any("layers.0.mlp" in s and "no 2-D weight" in s for s in found.skipped)

    moe = SparseMoeBlock(n_experts=4)
    moe.gate = nn.Linear(D, 3, bias=False)  # 3 logits for 4 experts
    found = discover(Wrapper("mlp", moe))
    assert not found.routers
    assert any("one row per expert (4 experts)" in s for s in found.skipped)


# ---- (g) nothing recognisable; (h) q/k without a head count ---------------------------------


def test_nothing_recognised(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
    found = discover(model)
    assert (found.attention, found.routers, found.skipped) == ([], [], [])
    summary = found.summary()
    assert summary.startswith("attention layers: 0, routers: 0")
    assert "nothing recognised" in summary and "register_attention" in summary
    with caplog.at_level(logging.WARNING, logger="foreshock.monitor"):
        Monitor(model, ListSink()).close()
    assert "found no attention or router" in caplog.text


class HeadlessAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)


def test_qk_without_head_count_is_skipped_with_reason() -> None:
    found = discover(Wrapper("self_attn", HeadlessAttention()))
    assert found.attention == []
    assert len(found.skipped) == 1
    assert found.skipped[0].startswith("layers.0.self_attn:")
    assert "head-count" in found.skipped[0]
    assert "skipped: layers.0.self_attn" in found.summary()


def test_head_count_contradicting_shapes_is_skipped() -> None:
    attn = HeadlessAttention()
    attn.num_heads = 5  # 32 outputs are not 5 heads of 32 // 5
    found = discover(attn)
    assert found.attention == [] and len(found.skipped) == 1
    assert "expected 5 heads" in found.skipped[0]


# ---- explicit registration ------------------------------------------------------------------


class CustomLayer(nn.Module):
    """Attention weights as bare parameters (stored (in, out)), nothing discovery can read."""

    def __init__(self, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.wq_param = nn.Parameter(torch.randn(D, n_heads * head_dim) * 0.1)
        self.wk_param = nn.Parameter(torch.randn(D, n_heads * head_dim) * 0.1)
        self.n_heads, self.head_dim = n_heads, head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = (x @ self.wq_param).view(x.shape[0], self.n_heads, -1).transpose(0, 1)
        k = (x @ self.wk_param).view(x.shape[0], self.n_heads, -1).transpose(0, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        return x + (torch.softmax(scores, -1).mean(0) @ x)


class CustomModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CustomLayer(n_heads=4, head_dim=8) for _ in range(4))
        self.route_logits = nn.Linear(D, 6, bias=False)  # no `experts` sibling: not discovered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        weights = torch.softmax(self.route_logits(x), -1)
        return (x.square().mean(-1) * weights.amax(-1)).mean()


def test_register_attention_and_router() -> None:
    torch.manual_seed(0)
    model = CustomModel()
    monitor = Monitor(model, ListSink(), config=MonitorConfig(spectra_worker=False, every=2))
    assert not monitor.discovery.attention and not monitor.discovery.routers

    layer = model.layers[3]
    spec = monitor.register_attention(
        "layers.3", layer.wq_param, layer.wk_param, n_heads=4, head_dim=8, transposed=True
    )
    assert (spec.n_heads, spec.n_kv_heads, spec.model_dim) == (4, 4, D)
    x = torch.randn(T, D)
    q = (x @ layer.wq_param).view(T, 4, 8).transpose(0, 1)
    k = (x @ layer.wk_param).view(T, 4, 8).transpose(0, 1)
    torch.testing.assert_close(folded_scores(spec, x), q @ k.transpose(-1, -2))

    router = monitor.register_router("route_logits", model.route_logits, n_experts=6, top_k=1)
    assert router.weight is model.route_logits.weight
    assert len(monitor.discovery.routers) == 1
    # Registering the same name again replaces, not duplicates.
    monitor.register_attention(
        "layers.3", layer.wq_param, layer.wk_param, n_heads=4, head_dim=8, transposed=True
    )
    assert [a.name for a in monitor.discovery.attention] == ["layers.3"]

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    records = []
    for step in range(5):
        model(torch.randn(16, D)).backward()
        opt.step()
        records.append(monitor.step(step))
        opt.zero_grad()
    assert monitor.errors == 0
    assert [r is not None for r in records] == [True, False, True, False, True]
    last = records[-1]["values"]
    assert last["attn.d2.entropy_mean@layers.3"] is not None
    assert 0 <= last["attn.d2.entropy@layers.3#h3"] <= 1
    assert not any("layers.0" in key for key in last)
    assert 0 <= last["router.token_entropy_norm@route_logits"] <= 1
    assert 0 <= last["router.load_entropy@route_logits"] <= 1
    assert records[-1]["flags"] == []
    monitor.close()
    assert not model.route_logits._forward_hooks


def test_register_attention_rejects_wrong_sizes() -> None:
    model = CustomModel()
    monitor = Monitor(model, ListSink())
    layer = model.layers[0]
    with pytest.raises(ValueError, match="expected 8 heads"):
        monitor.register_attention(
            "layers.0", layer.wq_param, layer.wk_param, n_heads=8, head_dim=8, transposed=True
        )
    with pytest.raises(ValueError, match="not a multiple"):
        monitor.register_attention(
            "layers.0", layer.wq_param, layer.wk_param, n_heads=4, head_dim=8, n_kv_heads=3
        )
    monitor.close()


@pytest.mark.parametrize("names", [("q_norm", "k_norm"), ("q_ln", "k_ln"), ("norm_q", "norm_k")])
def test_every_qk_norm_discovery_folds_is_in_the_signature(names: tuple[str, str]) -> None:
    """One list of QK-norm names (``layouts.QK_NORM_PAIRS``): a model whose norms discovery
    folds is signed ``qk_norm: true``, whatever they are called (profiles are chosen by it)."""
    config = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    attn = Qwen3Attention(config, bias=False)
    q_norm, k_norm = attn.q_norm, attn.k_norm
    del attn.q_norm, attn.k_norm
    setattr(attn, names[0], q_norm)
    setattr(attn, names[1], k_norm)
    model = Wrapper("self_attn", attn)
    monitor = Monitor(model, ListSink(), run_id="qk")
    (spec,) = monitor.discovery.attention
    assert spec.q_scale is q_norm.weight and spec.k_scale is k_norm.weight
    assert monitor.signature()["qk_norm"] is True


def test_a_shared_expert_and_its_gate_are_listed_as_skipped_with_the_reason() -> None:
    """Qwen2-MoE's shared expert and its sigmoid gate are not routers: said, never silent."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2MoeConfig(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
        intermediate_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        num_experts=4, num_experts_per_tok=2, vocab_size=64,
    )  # fmt: skip
    found = discover(transformers.Qwen2MoeForCausalLM(config))
    assert [r.name for r in found.routers] == ["model.layers.0.mlp.gate"]
    skipped = "\n".join(found.skipped)
    assert "model.layers.0.mlp.shared_expert_gate: a shared expert's gate" in skipped
    assert "model.layers.0.mlp.shared_expert: shared expert(s)" in skipped
