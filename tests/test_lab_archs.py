"""The lab beyond its own model: capacity-limited dispatch, the router-collapse scenario, and a
transformers Mixtral trained with the lab's FlashAttention backward through the registry."""

import json
import math

import pytest
import torch

from foreshock.lab.arch import build
from foreshock.lab.faults import Fault, default_capacity
from foreshock.lab.model import GPTConfig, MoE
from foreshock.lab.run import RunConfig, config_from_labels, run_lab

torch.set_num_threads(1)

TINY = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, n_experts=4, top_k=2)


def _capacity_by_hand(moe: MoE, x: torch.Tensor, factor: float) -> torch.Tensor:
    """Every top-1 assignment before any top-2 one, then token order, ⌈c·N·k/E⌉ per expert."""
    flat = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(moe.gate(flat), -1)
    top_p, top_i = probs.topk(moe.top_k, -1)
    top_p = top_p / top_p.sum(-1, keepdim=True)
    capacity = math.ceil(factor * flat.shape[0] * moe.top_k / moe.n_experts)
    used, out = [0] * moe.n_experts, torch.zeros_like(flat)
    for slot in range(moe.top_k):
        for t in range(flat.shape[0]):
            e = int(top_i[t, slot])
            if used[e] < capacity:
                used[e] += 1
                out[t] += top_p[t, slot] * moe.experts[e](flat[t : t + 1])[0]
    return out


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
def test_capacity_dispatch_keeps_each_experts_first_assignments(factor: float) -> None:
    torch.manual_seed(0)
    moe = MoE(GPTConfig(n_embd=32, n_experts=4, top_k=2, capacity_factor=factor))
    x = torch.randn(2, 24, 32)
    drops = []
    moe.drop_observer = lambda dropped, assigned: drops.append((int(dropped), assigned))
    got = moe(x).reshape(-1, 32)
    assert torch.allclose(got, _capacity_by_hand(moe, x, factor), atol=1e-5)
    capacity = math.ceil(factor * 48 * 2 / 4)
    assert drops[0][1] == 96 and drops[0][0] >= 96 - 4 * capacity


def test_a_capacity_no_expert_reaches_is_dropless() -> None:
    torch.manual_seed(1)
    moe = MoE(GPTConfig(n_embd=32, n_experts=4, top_k=2))
    x = torch.randn(2, 24, 32)
    dropless = moe(x)
    moe.capacity_factor = 4.0  # capacity = every assignment: nothing can overflow
    assert torch.allclose(moe(x), dropless, atol=1e-6)


def test_router_scenarios_default_to_capacity_on_the_lab_model_only() -> None:
    assert default_capacity("router-collapse", "gpt-moe") == 1.0
    assert default_capacity("router-collapse", "mixtral") == 0.0
    assert default_capacity("healthy", "gpt-moe") == 0.0
    collapse = Fault.default("router-collapse")
    assert collapse.router_only and (collapse.onset, collapse.magnitude) == (300, 100.0)
    assert collapse.lr_factor(299) == 1.0 and collapse.lr_factor(1300) == pytest.approx(100.0)


def test_capacity_run_reports_the_dropped_fraction_as_a_router_series(tmp_path) -> None:
    model = GPTConfig(**{**TINY.__dict__, "capacity_factor": 0.5})
    config = RunConfig(
        fault=Fault("router-collapse", onset=5, magnitude=10),
        seed=2,
        steps=21,
        every=10,
        batch_size=4,
        model=model,
    )
    run_lab(config, tmp_path / "run.jsonl", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    labels, values = lines[0]["labels"], lines[-2]["values"]
    assert (labels["arch"], labels["dispatch"], labels["profile"]) == (
        "gpt-moe",
        "capacity-0.5",
        "gpt-moe+capacity-0.5",
    )
    fraction = values["router.dropped_fraction@h.0.mlp.gate"]
    assert 0.0 < fraction < 1.0  # half the capacity a balanced router needs must drop some
    assert config_from_labels(labels) == config


def test_mixtral_trains_with_the_lab_attention_and_its_faults(tmp_path) -> None:
    """A transformers Mixtral: GQA attention through the registry, the FA fault switched on in
    the backward of the model's own attention call, routers and max_logit monitored."""
    model = GPTConfig(**{**TINY.__dict__, "n_head": 4, "n_kv_head": 2})
    lab = build("mixtral", model)
    assert lab.model.config._attn_implementation == "foreshock-lab-fa"
    fault = Fault("fa-lowprec", onset=10, magnitude=1)
    config = RunConfig(
        fault=fault, seed=1, steps=21, every=10, batch_size=4, model=model, arch="mixtral"
    )
    result = run_lab(config, tmp_path / "mx.jsonl", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "mx.jsonl").read_text().splitlines()]
    assert lines[0]["run_id"] == "mixtral-fa-lowprec-s1"
    assert lines[0]["labels"]["profile"] == "mixtral"
    values = lines[-2]["values"]
    for key in (
        "attn.d2.entropy_mean@model.layers.1.self_attn",
        "max_logit@model.layers.0.self_attn",
        "router.token_entropy_norm@model.layers.0.mlp.gate",
    ):
        assert values[key] is not None, key
    assert lines[-1]["monitor_errors"] == 0 and all(math.isfinite(x) for x in result.losses)
    assert [layer.lowp for layer in lab.attention.values()] == [None, None]  # a fresh build


def test_lab_attention_matches_eager_attention_forward_and_backward() -> None:
    """Without a fault, the registered function is exact attention: same outputs and grads as
    transformers' eager implementation on the same weights."""
    model = GPTConfig(**{**TINY.__dict__, "n_head": 4, "n_kv_head": 2})
    torch.manual_seed(3)
    lab = build("mixtral", model)
    x = torch.randint(0, 256, (2, 16))
    logits = lab.model(input_ids=x).logits
    grad = torch.autograd.grad(
        logits.square().sum(), lab.model.model.layers[0].self_attn.q_proj.weight
    )
    lab.model.set_attn_implementation("eager")
    eager = lab.model(input_ids=x).logits
    eager_grad = torch.autograd.grad(
        eager.square().sum(), lab.model.model.layers[0].self_attn.q_proj.weight
    )
    assert torch.allclose(logits, eager, atol=1e-5)
    assert torch.allclose(grad[0], eager_grad[0], rtol=1e-4, atol=1e-6)
