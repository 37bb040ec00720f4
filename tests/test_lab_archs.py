"""The lab beyond its own model: capacity-limited dispatch, the router-collapse scenario, and
transformers models (Mixtral, Llama, Qwen3-MoE, OLMoE, DeepSeek-V3) trained with the lab's
FlashAttention backward through the registry, at sizes the run chooses."""

import dataclasses
import json
import math

import pytest
import torch

from foreshock.app.cli import main
from foreshock.lab.arch import ARCHS, build, check_model, default_model
from foreshock.lab.faults import Fault, default_capacity
from foreshock.lab.model import GPTConfig, MoE
from foreshock.lab.router_bias import BIAS_UPDATE_SPEED
from foreshock.lab.run import RunConfig, _param_groups, config_from_labels, run_lab

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


# ---- the support matrix in the lab: dense, QK-norm, MLA ------------------------------------
NEW_ARCHS = ("llama", "qwen2", "qwen2-moe", "qwen3-moe", "olmoe", "deepseek-v3")


def _tiny(arch: str, **sizes: int) -> GPTConfig:
    """The arch's own defaults at a test's size: 2 layers, d = 32, 2 heads, 4 experts."""
    dense = arch in ("llama", "qwen2")
    given = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_experts": 0 if dense else 4, **sizes}
    return dataclasses.replace(default_model(arch, **given), block_size=16)


def _records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_new_archs_train_with_the_fa_fault_in_their_own_attention(arch: str, tmp_path) -> None:
    """Each trains (finite loss) with fa-lowprec from step 5: the fault reaches the gradient
    (the loss leaves a healthy twin's from step 6, equal before), every attention layer and
    router is found (nothing skipped), and the records carry their series."""
    model = _tiny(arch)
    runs, configs = {}, {}
    for scenario in ("fa-lowprec", "healthy"):
        fault = Fault(scenario, onset=5, magnitude=1 if scenario != "healthy" else 0)
        configs[scenario] = RunConfig(
            fault=fault, seed=1, steps=41, every=10, batch_size=4, model=model, arch=arch
        )
        runs[scenario] = run_lab(configs[scenario], tmp_path / f"{scenario}.jsonl", progress=False)
    faulty, healthy = runs["fa-lowprec"].losses, runs["healthy"].losses
    assert all(math.isfinite(x) for x in faulty) and len(faulty) == 41
    assert faulty[:6] == healthy[:6] and faulty[6] != healthy[6]

    lines = _records(tmp_path / "fa-lowprec.jsonl")
    start, end, last = lines[0], lines[-1], lines[-2]
    moe = arch not in ("llama", "qwen2")
    discovery = start["monitor"]["discovery"]
    assert discovery.startswith(f"attention layers: 2, routers: {2 if moe else 0}")
    skipped = [line for line in discovery.splitlines() if "skipped:" in line]
    said = ("shared expert(s)", "a shared expert's gate")  # DeepSeek's and Qwen2-MoE's
    assert all(any(why in line for why in said) for line in skipped), skipped
    assert start["monitor"]["refused"] == []
    labels = start["labels"]
    assert (labels["arch"], labels["profile"], start["run_id"]) == (
        arch,
        arch,
        f"{arch}-fa-lowprec-s1",
    )
    assert labels["model"]["n_embd"] == 32 and labels["arch_config"]["hidden_size"] == 32
    assert config_from_labels(labels) == configs["fa-lowprec"]  # the run rebuilds from them
    assert end["monitor_errors"] == 0 and end["last_step"] == 40
    values = last["values"]
    for i in range(2):
        for series in ("attn.d2.entropy_mean", "attn.dwq.entropy", "max_logit"):
            key = f"{series}@model.layers.{i}.self_attn"
            assert values[key] is not None and math.isfinite(values[key]), key
        routers = [k for k in values if k.startswith(f"router.token_entropy_norm@model.layers.{i}")]
        assert len(routers) == moe, routers


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_lab_attention_matches_eager_on_the_new_archs(arch: str) -> None:
    """Without a fault the registered function is the model's exact attention, in forward and
    in every parameter's gradient — MLA included, whose q·k heads (1.5·d_h) are wider than
    its value heads (d_h)."""
    torch.manual_seed(3)
    lab = build(arch, _tiny(arch))
    if arch == "deepseek-v3":
        attn = lab.model.model.layers[0].self_attn
        assert (attn.qk_head_dim, attn.v_head_dim) == (24, 16)
    x = torch.randint(0, 256, (2, 16))
    params = [p for p in lab.model.parameters() if p.requires_grad]
    ours = lab.model(input_ids=x).logits
    ours_grad = torch.autograd.grad(ours.square().sum(), params)
    lab.model.set_attn_implementation("eager")
    eager = lab.model(input_ids=x).logits
    eager_grad = torch.autograd.grad(eager.square().sum(), params)
    assert torch.allclose(ours, eager, atol=1e-5)
    for mine, theirs in zip(ours_grad, eager_grad, strict=True):  # float32 summation order
        assert (mine - theirs).norm() <= 1e-5 * theirs.norm()


def test_router_scenarios_are_refused_on_the_dense_llama(tmp_path, capsys) -> None:
    """Before anything is written: the output file a refused run names stays as it was."""
    out = tmp_path / "kept.jsonl"
    out.write_text("earlier run\n")
    for fault in (
        Fault.default("router-collapse"),
        Fault.default("router-mild"),
        Fault.default("lr-high", lr_target="router"),
    ):
        config = RunConfig(fault=fault, steps=5, model=_tiny("llama"), arch="llama")
        with pytest.raises(ValueError, match="llama is a dense model with no router"):
            run_lab(config, out, progress=False)
    assert out.read_text() == "earlier run\n"
    argv = ["lab", "run", "--arch", "llama", "--scenario", "router-collapse", "--out", str(out)]
    assert main(argv) == 2
    assert "dense model with no router" in capsys.readouterr().err
    # the learning-rate fault on the whole model has a place: it runs
    lr_high = Fault("lr-high", onset=2, magnitude=10, ramp=4)
    config = RunConfig(fault=lr_high, steps=8, every=4, batch_size=4, model=_tiny("llama"))
    result = run_lab(dataclasses.replace(config, arch="llama"), out, progress=False)
    assert all(math.isfinite(x) for x in result.losses)


def test_router_faults_reach_the_moe_archs_routers() -> None:
    for arch in ("qwen3-moe", "olmoe", "deepseek-v3"):
        lab = build(arch, _tiny(arch))
        faulted = _param_groups(lab, Fault.default("router-collapse"))[0]["params"]
        assert [tuple(w.shape) for w in faulted] == [(4, 32), (4, 32)], arch


def test_defaults_are_todays_lab_dimensions() -> None:
    """Recorded gpt-moe and Mixtral runs rebuild the same models."""
    assert default_model("gpt-moe") == GPTConfig()
    assert default_model("gpt-moe", 1.0) == GPTConfig(capacity_factor=1.0)
    assert default_model("mixtral") == GPTConfig(n_kv_head=2)
    assert default_model("llama").n_experts == 0
    assert default_model("deepseek-v3").aux_loss_weight == 0.0
    assert set(ARCHS) == {"gpt-moe", "mixtral", *NEW_ARCHS}


@pytest.mark.parametrize("arch", ["mixtral", *NEW_ARCHS])
def test_size_options_change_the_models_dimensions(arch: str) -> None:
    dense, mla = arch in ("llama", "qwen2"), arch == "deepseek-v3"
    sizes = {"n_layer": 3, "n_embd": 48, "n_head": 4, "n_kv_head": 4 if mla else 2}
    lab = build(arch, _tiny(arch, **sizes, **({} if dense else {"n_experts": 6, "top_k": 3})))
    hf = lab.model.config
    assert (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads) == (3, 48, 4)
    assert len(lab.attention) == 3 and hf.num_key_value_heads == sizes["n_kv_head"]
    assert hf.num_experts_per_tok == 3 if not dense else not lab.routers
    for w in lab.routers:
        assert tuple(w.shape) == (6, 48)
    if not mla:
        k_proj = lab.model.model.layers[0].self_attn.k_proj
        assert k_proj.out_features == sizes["n_kv_head"] * 12  # kv heads × d/heads


def test_size_options_reach_the_labels_through_the_cli(tmp_path) -> None:
    out = tmp_path / "q.jsonl"
    size = ["--n-layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "1"]
    argv = ["lab", "run", "--arch", "qwen3-moe", *size, "--experts", "4", "--top-k", "1"]
    assert main([*argv, "--steps", "2", "--every", "1", "--quiet", "--out", str(out)]) == 0
    labels = _records(out)[0]["labels"]
    assert {k: labels["model"][k] for k in ("n_layer", "n_embd", "n_head", "n_kv_head")} == {
        "n_layer": 1,
        "n_embd": 32,
        "n_head": 4,
        "n_kv_head": 1,
    }
    assert (labels["model"]["n_experts"], labels["model"]["top_k"]) == (4, 1)
    built = labels["arch_config"]
    assert (built["config_class"], built["head_dim"], built["num_experts"]) == (
        "Qwen3MoeConfig",
        8,
        4,
    )
    assert labels["parameters"] > 0 and labels["transformers"]


@pytest.mark.parametrize(
    ("arch", "sizes", "reason"),
    [
        ("llama", {"n_experts": 4}, "dense: experts must be 0"),
        ("deepseek-v3", {"n_kv_head": 2}, "no key/value head groups"),
        ("deepseek-v3", {"n_embd": 40, "n_head": 4}, "multiple of 4"),
        ("qwen3-moe", {"n_embd": 100, "n_head": 3}, "not a multiple of heads"),
        ("olmoe", {"n_experts": 2, "top_k": 3}, "top-k 3 must be in"),
        ("gpt-moe", {"n_kv_head": 2}, "no key/value head groups"),
    ],
)
def test_sizes_an_arch_cannot_build_are_refused(arch: str, sizes: dict, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        default_model(arch, **sizes)
    with pytest.raises(ValueError, match="dropless"):
        check_model("olmoe", GPTConfig(capacity_factor=1.0))


def test_deepseek_router_bias_moves_against_the_load() -> None:
    """b_e ← b_e + γ·sign(c̄ − c_e) after each step, from the step's assignments."""
    torch.manual_seed(0)
    lab = build("deepseek-v3", _tiny("deepseek-v3"))
    gates = [layer.mlp.gate for layer in lab.model.model.layers]
    seen = []
    hook = gates[0].register_forward_hook(lambda m, a, out: seen.append(out[2].reshape(-1)))
    lab.loss(*(torch.randint(0, 256, (4, 16)) for _ in range(2))).backward()
    hook.remove()
    counts = torch.bincount(seen[0], minlength=4).float()
    assert lab.after_step is not None
    lab.after_step()
    expected = BIAS_UPDATE_SPEED * torch.sign(counts.mean() - counts)
    assert torch.equal(gates[0].e_score_correction_bias, expected)
    lab.model.eval()  # an evaluation forward loads no experts: the next update is zero
    with torch.no_grad():
        lab.model(input_ids=torch.randint(0, 256, (2, 16)))
    lab.after_step()
    assert torch.equal(gates[0].e_score_correction_bias, expected)
