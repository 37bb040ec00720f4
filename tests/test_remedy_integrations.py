"""A remedy policy acting inside the Hugging Face and Lightning callbacks and a plain loop: the
action applied to the live training (the warned layer's attention switched, the learning rate
held against its schedule, training stopped), written to the sink as an ``action`` record; a
rollback bit for bit; a failing action reported while training runs to its end; a person's
approved request applied once and acknowledged.

The warnings come from the detectors run in the trainer process with the plumbing config of
``test_integrations`` (the tiniest threshold on the Δ2 entropy): one opens on cue at record
step 15, so every action lands at the boundary before step 16. Not a detection claim: the
detectors' own quality is measured elsewhere; here the point is what is done about a warning.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_integrations import BATCH, SEQ, WARNED, Tokens, plumbing_config

from foreshock.remediation.remedy import Action, RemedyPolicy
from foreshock.remediation.runner import Remediation
from foreshock.remediation.snapshots import SnapshotRing
from foreshock.remediation.trainer import TrainerRemedies
from foreshock.transport.warning import Role, RunWarning

torch.set_num_threads(1)

STEPS, EVERY = 30, 5
ACTED = WARNED + 1  # the boundary after the warned update


def lines(path: Path) -> list[dict[str, Any]]:
    """The raw JSON Lines of a run file (the run loader may not read ``action`` records)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def actions_in(path: Path) -> list[dict[str, Any]]:
    return [r for r in lines(path) if r.get("kind") == "action"]


def end_of(path: Path) -> dict[str, Any]:
    [end] = [r for r in lines(path) if r.get("kind") == "end"]
    return end


def warning(step: int, first_evidence: int, family: str = "attention-numerics") -> RunWarning:
    recent = [[first_evidence, 1.0, 3.0], [step, 1.2, 4.0]]
    return RunWarning(
        f"w-{step}", "r", family, None, "s", "up", step, Role.CAUSE, 1.0, 1.0, None, "v",
        {"recent": recent},
    )  # fmt: skip


# ---- Hugging Face: the warned layer's attention switched, live ----------------------------
def lab_mixtral() -> Any:
    """A transformers Mixtral on the lab's attention function (``foreshock-lab-fa``), the
    low-precision backward fault switched on in every layer; each layer counts its calls."""
    from foreshock.lab.arch import build
    from foreshock.lab.attention import LowPrecision
    from foreshock.lab.model import GPTConfig

    config = GPTConfig(block_size=SEQ, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, n_experts=4)
    lab = build("mixtral", config)
    calls: dict[str, int] = {}
    for name, layer in lab.attention.items():
        layer.lowp = LowPrecision(1, "truncate")
        calls[name] = 0
        layer.logit_observer = lambda _, name=name: calls.__setitem__(name, calls[name] + 1)
    return lab, calls


def hf_train(
    tmp_path: Path,
    model: Any,
    *callbacks: Any,
    steps: int = STEPS,
    data: int = STEPS,
    **arguments: Any,
) -> Any:
    """Train ``model`` with the Trainer for ``steps`` updates, on ``data`` steps' batches;
    ``arguments`` override its TrainingArguments."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    args = transformers.TrainingArguments(
        **{
            "output_dir": str(tmp_path / "hf-out"),
            "max_steps": steps,
            "per_device_train_batch_size": BATCH,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": "none",
            "use_cpu": True,
            "seed": 0,
            "disable_tqdm": True,
            "dataloader_num_workers": 0,
            **arguments,
        }
    )
    batches = [{"input_ids": t, "labels": t} for t in Tokens(max(steps, data) * BATCH, SEQ, 256)]
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=batches, callbacks=list(callbacks)
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        trainer.train()
    finally:
        transformers.logging.set_verbosity(verbosity)
    return trainer


@pytest.mark.slow
def test_hf_trainer_switches_the_warned_layer_to_precise_attention(tmp_path: Path) -> None:
    """The warning names a layer; from the next step on that layer alone runs transformers'
    sdpa (through foreshock's max_logit wrapper): the lab's faulty kernel is no longer called
    there, the other layer keeps it; the action record says which warning it answers."""
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback

    torch.manual_seed(0)
    lab, calls = lab_mixtral()
    path = tmp_path / "hf.jsonl"
    policy = RemedyPolicy(attention_scope="module")
    callback = ForeshockCallback(
        path, run_id="hf-remedy", every=EVERY, warnings=plumbing_config(), remedy=policy
    )
    trainer = hf_train(tmp_path, lab.model, callback)

    assert trainer.state.global_step == STEPS  # precise attention does not stop the run
    [record] = actions_in(path)
    assert (record["action"], record["step"], record["applied"]) == ("precise-attention", 16, True)
    assert record["run_id"] == "hf-remedy" and record["warning_id"] and record["error"] is None
    warned = record["module"]
    assert warned in lab.attention and record["detail"]["result"] == {warned: "foreshock+sdpa"}
    # the model's own config is left alone (the Monitor's close took its wrapper off again)
    assert lab.model.config._attn_implementation == "foreshock-lab-fa"
    for name, layer in lab.attention.items():
        switched = name == warned
        assert (layer.config is lab.model.config) is not switched
        assert calls[name] == (ACTED if switched else STEPS)  # the faulty kernel's calls
    assert lab.attention[warned].config._attn_implementation == "foreshock+sdpa"
    end = end_of(path)
    assert end["status"] == "finished" and end["remedy"]["errors"] == 0
    assert [a["kind"] for a in end["remedy"]["actions"]] == ["precise-attention"]
    max_logit = f"max_logit@{warned}"  # still measured through the wrapper after the switch
    assert [r for r in lines(path) if r.get("step") == 25 and max_logit in r.get("values", {})]


def captured(model: Any, optimizer: Any) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
    }


@pytest.mark.slow
@pytest.mark.parametrize("extend", [True, False])
def test_hf_trainer_rolls_back_bit_for_bit_before_the_warnings_evidence(
    tmp_path: Path, extend: bool
) -> None:
    """rollback = true: at the boundary after the warning, the model and the Trainer's
    optimizer are what they were at the newest snapshot before the warning's first evidence,
    tensor for tensor; training then goes on, the steps re-done counted. The horizon grows by
    them (``extend_horizon``, the default), so the linear schedule, rewound with the weights,
    still reaches its end; off, the run stops at ``max_steps`` with the schedule short of it.
    The first monitoring record after the rollback measures no ΔW (it would span the jump)."""
    transformers = pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback

    class Recorder(transformers.TrainerCallback):  # runs after foreshock's, in list order
        def __init__(self) -> None:
            self.at: dict[int, dict[str, Any]] = {}
            self.after: dict[str, Any] = {}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % EVERY == 0:
                self.at[state.global_step] = captured(kw["model"], kw["optimizer"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == ACTED:
                self.after = captured(kw["model"], kw["optimizer"])

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=32,
        vocab_size=256, max_position_embeddings=SEQ, attn_implementation="sdpa",
    )  # fmt: skip
    path = tmp_path / "hf.jsonl"
    policy = RemedyPolicy(rollback=True, actions={"attention-numerics": "hold-lr"})
    callback = ForeshockCallback(path, every=EVERY, warnings=plumbing_config(), remedy=policy)
    callback.remedy.snapshot_every = EVERY
    callback.remedy.extend_horizon = extend
    recorder = Recorder()
    model = transformers.LlamaForCausalLM(config)
    trainer = hf_train(
        tmp_path, model, callback, recorder, data=2 * STEPS, lr_scheduler_type="linear"
    )

    [record] = actions_in(path)
    back = record["rolled_back_to"]
    assert record["applied"] and back is not None and back < WARNED
    assert same(recorder.after["model"], recorder.at[back]["model"])
    assert not same(recorder.after["model"], recorder.at[WARNED // EVERY * EVERY]["model"])
    assert same(recorder.after["optimizer"]["state"], recorder.at[back]["optimizer"]["state"])
    assert end_of(path)["remedy"]["steps_redone"] == ACTED - back
    assert trainer.state.global_step == STEPS + (ACTED - back if extend else 0)
    scheduled = trainer.lr_scheduler.get_last_lr()[0]  # linear to 0 at its STEPS-th step
    assert (scheduled == pytest.approx(0.0, abs=1e-9)) == extend
    records = [r["values"] for r in lines(path) if "values" in r and r["step"] >= ACTED]
    assert not any(k.startswith("attn.dwq") for k in records[0])
    assert any(k.startswith("attn.dwq") for k in records[1])


# ---- Lightning: the learning rate held against the schedule; stop -----------------------
def lightning_fit(callback: Any, checkpoints: Path | None = None) -> tuple[Any, Any]:
    """Fit the lab's tiny GPT-MoE; its learning rate decays every step (LambdaLR: a schedule
    past its peak, so the detectors read from the first records). Returns the
    trainer and the module (``lrs``: the learning rate each update used). ``checkpoints``: a
    ``ModelCheckpoint`` there every ``EVERY`` steps, all kept."""
    L = pytest.importorskip("lightning.pytorch")
    from foreshock.lab.model import GPT, GPTConfig

    class LitGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=4))
            self.lrs: list[float] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            # inside optimizer.step(closure): after every step pre-hook
            self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            return self.model(batch[:, :-1], batch[:, 1:])[1]

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
            decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + s / 10))
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": decay, "interval": "step"},
            }

    torch.manual_seed(0)
    module = LitGPT()
    loader = torch.utils.data.DataLoader(Tokens(STEPS * BATCH, SEQ + 1, 256), batch_size=BATCH)
    saver = (
        []
        if checkpoints is None
        else [L.callbacks.ModelCheckpoint(checkpoints, every_n_train_steps=EVERY, save_top_k=-1)]
    )
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=checkpoints is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[callback, *saver],
    )
    trainer.fit(module, loader)
    return trainer, module


def lightning_callback(path: Path, policy: RemedyPolicy, sink: Any = None) -> Any:
    pytest.importorskip("lightning")
    from foreshock.integrations.lightning import ForeshockLightningCallback

    return ForeshockLightningCallback(
        sink if sink is not None else path,
        run_id="pl-remedy",
        every=EVERY,
        warnings=plumbing_config(),
        remedy=policy,
    )


def test_lightning_holds_the_learning_rate_against_its_schedule(tmp_path: Path) -> None:
    """hold-lr at the boundary before step 16: every later update uses half the learning
    rate the schedule had when the warning's evidence began, decaying from there as the
    schedule does (a hold does not stop a decay)."""
    path = tmp_path / "pl.jsonl"
    policy = RemedyPolicy(actions={"attention-numerics": "hold-lr"}, lr_scale=0.5)
    trainer, module = lightning_fit(lightning_callback(path, policy))

    scheduled = [1e-3 / (1.0 + s / 10) for s in range(STEPS)]
    assert trainer.global_step == STEPS
    assert module.lrs[:ACTED] == pytest.approx(scheduled[:ACTED], rel=1e-12)
    [record] = actions_in(path)
    since = record["detail"]["since"]  # the warning's first evidence
    assert since < ACTED
    held = 0.5 * scheduled[since]
    decayed = [held * scheduled[s] / scheduled[ACTED] for s in range(ACTED, STEPS)]
    assert module.lrs[ACTED:] == pytest.approx(decayed, rel=1e-9)
    assert (record["action"], record["step"], record["applied"]) == ("hold-lr", ACTED, True)
    assert record["detail"]["result"] == pytest.approx([held])
    assert end_of(path)["status"] == "finished"


def test_lightning_stops_at_the_boundary_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "pl.jsonl"
    trainer, module = lightning_fit(
        lightning_callback(path, RemedyPolicy(actions={"attention-numerics": "stop"}))
    )
    assert trainer.global_step == ACTED and len(module.lrs) == ACTED  # no update after it
    [record] = actions_in(path)
    assert (record["action"], record["step"], record["applied"]) == ("stop", ACTED, True)
    end = end_of(path)
    assert end["status"] == "stopped" and end["last_step"] == WARNED


def test_a_failing_action_is_reported_and_training_runs_to_its_end(tmp_path: Path) -> None:
    """The lab's GPT has no attention layer in transformers' registry: precise attention
    fails; the action record carries the error, training goes on to its last step."""
    path = tmp_path / "pl.jsonl"
    trainer, _ = lightning_fit(lightning_callback(path, RemedyPolicy()))
    assert trainer.global_step == STEPS
    [record] = actions_in(path)
    assert record["action"] == "precise-attention" and not record["applied"]
    assert "registry" in record["error"]
    end = end_of(path)
    assert end["status"] == "finished" and end["last_step"] == STEPS - 1
    assert end["remedy"]["actions"][0]["error"] == record["error"]


class RequestingSink:
    """A JSON Lines sink that delivers approved requests (as ``KafkaSink``'s
    ``poll_requests`` hands over verified ones): at its 5th poll, again at the 6th (a
    redelivery, refused with a record), then none;
    a poll that raises once on the way must not disturb training."""

    def __init__(self, path: Path, requests: list[dict[str, Any]]) -> None:
        from foreshock.producers.sinks import JsonlSink

        self.sink, self.requests, self.polls = JsonlSink(path), requests, 0

    def write(self, record: dict[str, Any]) -> None:
        self.sink.write(record)

    def close(self) -> None:
        self.sink.close()

    def poll_requests(self) -> list[dict[str, Any]]:
        self.polls += 1
        if self.polls == 3:
            raise ConnectionError("the broker went away for a moment")
        return [dict(r) for r in self.requests] if self.polls in (5, 6) else []


def test_an_approved_request_is_applied_once_and_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "pl.jsonl"
    request = {
        "request_id": "req-1",
        "run_id": "pl-remedy",
        "warning_id": "w-router",
        "family": "router",
        "module": "model.h.0.mlp.gate",
        "action": "scale-router-lr",
    }
    other = {**request, "request_id": "req-2", "run_id": "another-run", "action": "stop"}
    sink = RequestingSink(path, [request, other])  # another run's: not this one's to act on
    trainer, _ = lightning_fit(lightning_callback(path, RemedyPolicy(actions={}), sink))

    assert trainer.global_step == STEPS and sink.polls == STEPS  # one poll per boundary
    [record, again] = actions_in(path)  # applied once; the redelivery refused, on record
    assert (record["action"], record["step"], record["applied"]) == ("scale-router-lr", 5, True)
    assert (record["source"], record["request_id"]) == ("approved", "req-1")
    assert record["warning_id"] == "w-router" and record["detail"]["result"] == 0.1
    assert (again["step"], again["applied"], again["request_id"]) == (6, False, "req-1")
    assert again["detail"]["refused"] == "request req-1 was handled already"
    assert end_of(path)["remedy"]["errors"] == 1  # the poll that raised, counted


# ---- the remedies themselves, in a plain loop ---------------------------------------------
def small_training() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, schedule


def train_one(model: Any, optimizer: Any, schedule: Any) -> None:
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()


def same(a: Any, b: Any) -> bool:
    """Equal, tensors bit for bit, through nested dicts and lists."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_rollback_restores_model_optimizer_and_schedule_bit_for_bit() -> None:
    """The policy's rollback through the runner: the newest snapshot before the warning's
    first evidence, every tensor of the model and the optimizer equal to it, the schedule's
    state too; the steps trained since it are counted as re-done."""
    model, optimizer, schedule = small_training()
    remedies = TrainerRemedies(model, optimizer, schedule, snapshots=SnapshotRing(2, every=5))
    written: list[dict[str, Any]] = []
    policy = RemedyPolicy(rollback=True, actions={"attention-numerics": "hold-lr"})
    remediation = Remediation(policy, remedies, run_id="plain", write=written.append)
    saved: dict[str, Any] = {}
    for step in range(13):
        remediation.before_step(step)
        if step == 10:
            saved = {
                "model": {k: v.clone() for k, v in model.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()),
                "schedule": schedule.state_dict(),
            }
        train_one(model, optimizer, schedule)
    [action] = remediation.at_boundary(13, [warning(12, first_evidence=11)])
    assert action.rolled_back_to == 10 and action.applied and remedies.redone == 3
    assert same(model.state_dict(), saved["model"])
    assert same(optimizer.state_dict()["state"], saved["optimizer"]["state"])
    assert schedule.state_dict()["last_epoch"] == saved["schedule"]["last_epoch"] == 10
    # hold-lr after the rollback: half the lr the schedule gave at the first evidence (11)
    assert action.detail["since"] == 11
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 1e-2 / 12)
    assert [r["kind"] for r in written] == ["action"] and written[0]["rolled_back_to"] == 10
    assert remedies.ring is not None and remedies.ring.steps == [5, 10]


@pytest.mark.parametrize("schedule_after", [None, 4e-2])
def test_router_learning_rate_is_held_under_any_optimizer(schedule_after) -> None:
    """scale-router-lr: the routers' update as if their learning rate were held at scale × its
    value at the warning — under AdamW, and with the schedule raising the group's lr after the
    warning (a rising router learning rate is what collapses routing) — the rest unchanged."""
    from foreshock.lab.model import GPT, GPTConfig

    config = GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=4)
    batch = Tokens(BATCH, SEQ + 1, 256).ids

    def one_step(scaled: bool, router_lr: float) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = GPT(config)
        router = model.h[0].mlp.gate.weight
        rest = [p for p in model.parameters() if p is not router]
        groups = [{"params": rest}, {"params": [router], "lr": router_lr}]
        optimizer = torch.optim.AdamW(groups, lr=1e-2)
        if scaled:
            assert TrainerRemedies(model, optimizer).scale_router_lr(0.1) == 0.1
            if schedule_after is not None:  # the schedule moves on after the warning
                optimizer.param_groups[1]["lr"] = schedule_after
        model(batch[:, :-1], batch[:, 1:])[1].backward()
        optimizer.step()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    before = one_step(False, 0.0)  # a zero router lr: the weights before (AdamW: no decay)
    scaled, reference = one_step(True, 1e-2), one_step(False, 1e-3)
    gate = "h.0.mlp.gate.weight"
    assert not torch.equal(scaled[gate], before[gate])
    assert torch.allclose(scaled[gate], reference[gate], rtol=0, atol=1e-7)
    assert all(torch.equal(scaled[k], reference[k]) for k in scaled if k != gate)


def test_unknown_or_unswitchable_attention_is_a_clear_error() -> None:
    transformers = pytest.importorskip("transformers")
    from foreshock.lab.model import GPT, GPTConfig

    lab = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32))
    remedies = TrainerRemedies(lab, torch.optim.SGD(lab.parameters(), lr=0.1))
    with pytest.raises(KeyError, match="no attention layer"):
        remedies.precise_attention("h.7.attn")
    with pytest.raises(TypeError, match="registry"):
        remedies.precise_attention(None)
    config = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32,
        vocab_size=64, attn_implementation="eager",
    )  # fmt: skip
    llama = transformers.LlamaForCausalLM(config)
    switched = TrainerRemedies(llama, torch.optim.SGD(llama.parameters(), lr=0.1))
    assert switched.precise_attention(None) == {"model.layers.0.self_attn": "sdpa"}
    assert llama.model.layers[0].self_attn.config._attn_implementation == "sdpa"
    assert llama.config._attn_implementation == "eager"


def test_a_callback_refuses_a_remedy_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback

    with pytest.raises(ValueError, match="in-process warnings"):
        ForeshockCallback(tmp_path / "r.jsonl", warnings=False, remedy=RemedyPolicy())
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('[remedy]\nactions = {optimizer = "stop"}\n')
    callback = ForeshockCallback(tmp_path / "r.jsonl", remedy=policy_file)
    assert callback.remedy.policy is not None
    assert dict(callback.remedy.policy.actions) == {"optimizer": "stop"}


def test_an_action_record_write_failure_is_counted_not_raised() -> None:
    model, optimizer, schedule = small_training()

    def broken(record: dict[str, Any]) -> None:
        raise OSError("disk full")

    remedies = TrainerRemedies(model, optimizer, schedule)
    policy = RemedyPolicy(actions={"attention-numerics": "stop"})
    remediation = Remediation(policy, remedies, write=broken)
    taken = remediation.at_boundary(5, [warning(4, 2)])
    assert [a.kind for a in taken] == ["stop"] and remediation.stopped
    assert remediation.errors == 1 and isinstance(taken[0], Action)


def test_a_plain_loop_gets_the_same_runner() -> None:
    """The module docstring's loop: the runner runs the detectors on the Monitor's records,
    and ``after_step`` says when the policy stopped the run."""
    from foreshock.lab.model import GPT, GPTConfig
    from foreshock.producers.monitor import Monitor, MonitorConfig
    from foreshock.producers.sinks import ListSink

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sink = ListSink()
    monitor = Monitor(model, sink, run_id="plain", config=MonitorConfig(every=EVERY))
    policy = RemedyPolicy(actions={"attention-numerics": "stop"})
    remediation = Remediation.for_monitor(policy, monitor, optimizer, warnings=plumbing_config())
    assert remediation is not None
    data = Tokens(STEPS * BATCH, SEQ + 1, 256).ids.split(BATCH)
    trained = 0
    for step, batch in enumerate(data):
        remediation.before_step(step)
        loss = model(batch[:, :-1], batch[:, 1:])[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        trained += 1
        if remediation.after_step(step, monitor.step(step, loss=loss.detach())):
            break
    monitor.close()
    assert trained == ACTED and remediation.stopped
    [record] = [r for r in sink.records if r.get("kind") == "action"]
    assert (record["action"], record["step"], record["run_id"]) == ("stop", ACTED, "plain")
