"""The fault-injection lab: FlashAttention backward, rounding, fault schedules, labelled runs."""

import json
import math

import pytest
import torch

from foreshock.detectors.divergence import DivergenceRule, divergence_step
from foreshock.lab.arch import build
from foreshock.lab.attention import LowPrecision, flash_attention, round_mantissa
from foreshock.lab.faults import Fault
from foreshock.lab.model import GPT, GPTConfig
from foreshock.lab.run import RunConfig, _param_groups, config_from_labels, run_lab

torch.set_num_threads(1)

TINY = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, n_experts=4, top_k=2)


def _qkv(seed: int, shape=(2, 3, 24, 8)):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, requires_grad=True) for _ in range(3)]


def _grads(out: torch.Tensor, tensors, d_out: torch.Tensor):
    return torch.autograd.grad(out, tensors, d_out)


@pytest.mark.parametrize("seed", range(5))
def test_flash_backward_equals_autograd_of_standard_attention(seed: int) -> None:
    q, k, v = _qkv(seed)
    out, _ = flash_attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    d_out = torch.randn_like(out)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    mine_all, theirs_all = _grads(out, (q, k, v), d_out), _grads(ref, (q, k, v), d_out)
    for mine, theirs in zip(mine_all, theirs_all, strict=True):
        assert (mine - theirs).abs().max().item() <= 1e-5


def test_max_logit_is_the_max_of_the_causal_scores() -> None:
    q, k, v = _qkv(7)
    _, max_logit = flash_attention(q, k, v)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    assert max_logit.item() == pytest.approx(scores.masked_fill(~causal, -1e9).max().item())


def test_round_mantissa_nearest_at_7_bits_is_bfloat16() -> None:
    x = torch.randn(100_000) * 10.0 ** torch.randint(-5, 5, (100_000,))
    assert torch.equal(round_mantissa(x, 7, "nearest"), x.to(torch.bfloat16).float())


def test_truncation_is_biased_toward_zero_and_nearest_is_not() -> None:
    x = torch.rand(200_000) + 0.5  # positive, spread across mantissas
    trunc_err = round_mantissa(x, 2, "truncate") - x
    near_err = round_mantissa(x, 2, "nearest") - x
    assert (trunc_err <= 0).all()
    assert (round_mantissa(-x, 2, "truncate") + x >= 0).all()  # toward zero for negatives too
    ulp = 2.0**-2
    assert trunc_err.mean().item() < -0.2 * ulp  # about half an ulp of bias
    assert abs(near_err.mean().item()) < 0.01 * ulp
    assert torch.equal(round_mantissa(x, 23), x)


def test_fault_changes_only_the_query_key_gradients() -> None:
    q, k, v = _qkv(3)
    exact, _ = flash_attention(q, k, v)
    faulty, _ = flash_attention(q, k, v, LowPrecision(1, "truncate"))
    assert torch.equal(exact, faulty)  # the forward stays exact
    d_out = torch.randn_like(exact)
    g_exact = _grads(exact, (q, k, v), d_out)
    g_faulty = _grads(faulty, (q, k, v), d_out)
    assert torch.equal(g_exact[2], g_faulty[2])  # dV does not use D
    assert (g_exact[0] - g_faulty[0]).abs().max() > 1e-3
    assert (g_exact[1] - g_faulty[1]).abs().max() > 1e-3


def test_truncation_error_in_d_is_coherent_and_nearest_error_is_not() -> None:
    """The mechanism: truncating O shifts D = rowsum(dO∘O) coherently, rounding does not."""
    q, k, v = _qkv(4, shape=(1, 2, 64, 16))
    out, _ = flash_attention(q, k, v)
    d_out = out.detach()  # a dO aligned with O, as when the loss pushes O further its way
    errors = {}
    for rounding in ("truncate", "nearest"):
        rounded = round_mantissa(out.detach(), 2, rounding)
        errors[rounding] = ((rounded - out.detach()) * d_out).sum(-1)  # δD per row
    assert (errors["truncate"] <= 0).all()  # one sign on every row: piles up
    assert errors["truncate"].mean().abs() > 5 * errors["nearest"].mean().abs()


def test_fault_schedules() -> None:
    lr = Fault("lr-high", onset=100, magnitude=16.0, ramp=40)
    assert [lr.lr_factor(s) for s in (0, 99, 100, 120, 140, 500)] == [1, 1, 1, 4.0, 16.0, 16.0]
    gbs = Fault("gbs-small", onset=10, magnitude=8.0)
    assert (gbs.batch_size(16, 9), gbs.batch_size(16, 10)) == (16, 2)
    assert Fault("healthy").lowprec() is None
    assert Fault("fa-noise", magnitude=2).lowprec() == LowPrecision(2, "nearest")
    with pytest.raises(ValueError):
        Fault("nope")
    with pytest.raises(ValueError):
        Fault("lr-high", magnitude=0.5)


def test_attention_fault_switches_on_at_onset_in_chosen_layers() -> None:
    model = GPT(TINY)
    fault = Fault("fa-lowprec", onset=5, magnitude=1, layers=(1,))
    fault.apply_attention([b.attn for b in model.h], 4)
    assert [b.attn.lowp for b in model.h] == [None, None]
    fault.apply_attention([b.attn for b in model.h], 5)
    assert [b.attn.lowp for b in model.h] == [None, LowPrecision(1, "truncate")]


def test_divergence_rule() -> None:
    rule = DivergenceRule(margin=0.5, patience=10, ema=0.2, warmup=20)
    healthy = [3.0 - 0.01 * i for i in range(100)]
    assert divergence_step(healthy, rule) is None
    spike = [*healthy[:50], 9.0, *healthy[51:]]  # one bad batch is not a divergence
    assert divergence_step(spike, rule) is None
    diverging = [*healthy[:60], *(2.4 + 0.1 * i for i in range(40))]
    step = divergence_step(diverging, rule)
    assert step is not None and 60 < step < 80
    assert divergence_step([*healthy[:30], math.inf], rule) == 30


def test_lab_run_writes_labelled_records(tmp_path) -> None:
    fault = Fault("fa-lowprec", onset=10, magnitude=1)
    config = RunConfig(fault=fault, seed=3, steps=41, every=10, batch_size=4, model=TINY)
    result = run_lab(config, tmp_path / "run.jsonl", progress=False)
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    start, metrics, end = records[0], records[1:-1], records[-1]
    assert start["kind"] == "start" and start["run_id"] == "fa-lowprec-s3"
    assert start["labels"]["scenario"] == "fa-lowprec"
    assert (start["labels"]["onset"], start["labels"]["magnitude"]) == (10, 1.0)
    assert [r["step"] for r in metrics] == [0, 10, 20, 30, 40]
    assert "attn.d2.entropy_mean@h.1.attn" in metrics[-1]["values"]
    assert "max_logit@h.0.attn" in metrics[-1]["values"]
    assert end["kind"] == "end" and end["last_step"] == 40
    assert end["divergence_step"] == result.divergence_step
    assert len(result.losses) == 41 and end["monitor_errors"] == 0
    assert start["labels"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()

    # The labels describe the run completely: retrained from them, here, it is the same run.
    assert config_from_labels(start["labels"]) == config
    again = run_lab(config_from_labels(start["labels"]), tmp_path / "again.jsonl", progress=False)
    assert again.losses == result.losses and again.divergence_step == result.divergence_step


@pytest.mark.parametrize(
    "fault",
    [Fault("lr-high", magnitude=10, lr_target="router"), Fault("router-collapse", magnitude=10)],
)
def test_router_only_learning_rate_fault_targets_only_the_gates(fault: Fault) -> None:
    lab = build("gpt-moe", TINY)
    model = lab.model
    groups = _param_groups(lab, fault)
    router_ids = {id(block.mlp.gate.weight) for block in model.h}
    assert {id(p) for p in groups[0]["params"]} == router_ids and groups[0]["faulted"]
    assert not groups[1]["faulted"]
    assert router_ids.isdisjoint(id(p) for p in groups[1]["params"])
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(model.parameters()))


def test_lab_trains_a_recipe_and_records_its_learning_rates(tmp_path) -> None:
    """Warm-up then WSD decay: each update uses the recipe's learning rate, times the fault's
    (an lr-high ramp from step 30), and every record carries it; the labels give it back."""
    fault = Fault("lr-high", onset=30, magnitude=4, ramp=10)
    config = RunConfig(
        fault=fault, steps=60, every=10, batch_size=4, model=TINY,
        lr=2e-3, schedule="wsd", warmup=10, decay_start=40,
    )  # fmt: skip
    run_lab(config, tmp_path / "run.jsonl", progress=False)
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    start, metrics = records[0], records[1:-1]
    assert start["labels"]["recipe"]["schedule"] == "wsd"
    recipe = config.recipe
    for record in metrics:
        step = record["step"]
        expected = recipe.lr_at(step) * fault.lr_factor(step)
        assert record["values"]["lr"] == pytest.approx(expected, rel=1e-9), step
        assert record["values"]["lr@group.0"] == record["values"]["lr"]
    assert metrics[0]["values"]["lr"] < metrics[1]["values"]["lr"]  # warming up
    assert config_from_labels(start["labels"]) == config
