"""The always-on anchors (lab.anchors) the remediation table compares foreshock with."""

from __future__ import annotations

import math

import pytest
import torch

from foreshock.lab.anchors import FixedClip, SpikeAwareReset, ZClip, anchor


def _param(grad: list[float]) -> torch.nn.Parameter:
    weight = torch.nn.Parameter(torch.zeros(len(grad)))
    weight.grad = torch.tensor(grad)
    return weight


def test_zclip_passes_ordinary_norms_and_clips_a_spike_to_its_adaptive_bound():
    """After a warm-up of norms 1 and 3 (μ = 2, σ = 1), a norm of 2.5 passes; a norm of 12
    (z = 10 > 2.5) is cut to μ + z_t²σ/z = 2 + 6.25/10 = 2.625, and the EMA takes that."""
    guard = ZClip(alpha=0.5, z_thresh=2.5, warmup=2)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for norm in (1.0, 3.0):
        guard.before_step([_param([norm])], optimizer)
    assert guard.mean == pytest.approx(2.0) and guard.var == pytest.approx(1.0)
    ordinary = _param([2.5])
    guard.before_step([ordinary], optimizer)
    assert ordinary.grad.tolist() == pytest.approx([2.5]) and guard.clipped == 0
    mean, std = guard.mean, math.sqrt(guard.var)
    spike = _param([12.0])
    guard.before_step([spike], optimizer)
    z = (12.0 - mean) / std
    kept = mean + 2.5**2 * std / z
    assert spike.grad.tolist() == pytest.approx([kept]) and guard.clipped == 1
    assert guard.mean == pytest.approx(0.5 * mean + 0.5 * kept)


def test_fixed_clip_bounds_the_global_norm():
    a, b = _param([3.0]), _param([4.0])
    FixedClip(1.0).before_step([a, b], torch.optim.SGD([a, b], lr=0.1))
    assert math.hypot(a.grad.item(), b.grad.item()) == pytest.approx(1.0)


def test_spam_clips_spiking_elements_and_resets_the_moments_on_schedule():
    """An element with g² > θ·v is cut to sign(g)√(θv), the others kept; every reset_every
    steps Adam's moments and step count go back to zero."""
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    weight.grad = torch.tensor([1.0, 1.0])
    optimizer.step()  # v = 0.001·g² = 0.001 per element
    guard = SpikeAwareReset(theta=4.0, reset_every=2)
    weight.grad = torch.tensor([-1.0, 0.01])  # g² = 1 > 4·0.001 on the first element only
    guard.before_step([weight], optimizer)
    v = optimizer.state[weight]["exp_avg_sq"]
    assert weight.grad.tolist() == pytest.approx([-math.sqrt(4 * v[0].item()), 0.01])
    assert guard.clipped == 1 and guard.resets == 0
    optimizer.step()
    guard.before_step([weight], optimizer)
    state = optimizer.state[weight]
    assert guard.resets == 1 and float(state["step"]) == 0
    assert state["exp_avg"].abs().sum() == 0 and state["exp_avg_sq"].abs().sum() == 0


def test_an_unknown_anchor_is_named():
    with pytest.raises(ValueError, match="zclip"):
        anchor("clip-2.0")


def test_a_lab_run_with_an_anchor_says_so_in_its_labels(tmp_path):
    from foreshock.lab.model import GPTConfig
    from foreshock.lab.run import RunConfig, run_lab
    from foreshock.transport.run_files import load_run

    model = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, n_experts=4)
    config = RunConfig(steps=30, every=10, model=model, anchor="zclip")
    run_lab(config, tmp_path / "run.jsonl", progress=False)
    run = load_run(tmp_path / "run.jsonl")
    assert run.labels["anchor"] == "zclip" and len(run.records) == 3
