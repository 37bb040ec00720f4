"""The remedy policy: which warning acts, bounded and never raising; snapshots that restore
bit for bit; the lab's remedies acting on its training computation."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from foreshock.lab.faults import Fault
from foreshock.lab.model import GPTConfig
from foreshock.lab.run import RunConfig, run_lab
from foreshock.remediation.remedy import CAUSES, Remediator, RemedyPolicy, cause_of
from foreshock.remediation.snapshots import SnapshotRing
from foreshock.transport.run_files import load_run
from foreshock.transport.warning import EventKind, Role, RunWarning


def _warning(family: str, role: Role, module: str | None = "h.1.attn", step: int = 450):
    recent = [[step - 50, 1.0, 3.0], [step - 25, 1.1, 3.5], [step, 1.2, 4.0]]
    return RunWarning(
        f"w-{family}-{role}-{step}",
        "r",
        family,
        module,
        "s",
        "up",
        step,
        role,
        1.0,
        1.0,
        None,
        "v",
        {"recent": recent},
    )


class Trainer:
    """Records what the policy asked for."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def precise_attention(self, module):
        if self.fail:
            raise RuntimeError("the attention registry refused")
        self.calls.append(("precise", module))

    def hold_lr(self, scale, since=None):
        self.calls.append(("hold", scale))

    def scale_router_lr(self, scale):
        self.calls.append(("router", scale))

    def rollback(self, before):
        self.calls.append(("rollback", before))
        return before - 30


def test_the_cause_names_the_action_and_nothing_else_acts():
    assert cause_of(_warning("attention-numerics", Role.CAUSE)) == "attention-numerics"
    assert cause_of(_warning("router", Role.OPTIMIZER)) == "optimizer"
    assert cause_of(_warning("optimizer", Role.OPTIMIZER, None)) == "optimizer"
    assert cause_of(_warning("router", Role.SECONDARY)) is None
    assert cause_of(_warning("symptom", Role.SYMPTOM, None)) is None
    cleared = _warning("router", Role.CAUSE)
    cleared.event = EventKind.CLEARED
    assert cause_of(cleared) is None


def test_actions_are_bounded_by_count_and_backoff():
    trainer = Trainer()
    remediator = Remediator(RemedyPolicy(max_actions=2, backoff_steps=100), trainer)
    first = remediator.act(450, [_warning("attention-numerics", Role.CAUSE)])
    too_soon = remediator.act(500, [_warning("router", Role.OPTIMIZER, step=500)])
    later = remediator.act(600, [_warning("router", Role.OPTIMIZER, step=600)])
    spent = remediator.act(900, [_warning("router", Role.OPTIMIZER, step=900)])
    assert [len(first), len(too_soon), len(later), len(spent)] == [1, 0, 1, 0]
    assert trainer.calls == [("precise", None), ("hold", 0.5)]


def test_a_failing_remedy_is_reported_not_raised_and_a_dry_run_does_nothing():
    failing = Remediator(RemedyPolicy(), Trainer(fail=True))
    (action,) = failing.act(450, [_warning("attention-numerics", Role.CAUSE)])
    assert not action.applied and "refused" in action.error
    missing = Remediator(RemedyPolicy(), object())
    (action,) = missing.act(450, [_warning("router", Role.CAUSE, "h.0.mlp.gate")])
    assert not action.applied and "scale_router_lr" in action.error
    assert "rollback" in action.detail["rollback_error"]  # the default rolls a router back
    trainer = Trainer()
    (action,) = Remediator(RemedyPolicy(dry_run=True), trainer).act(
        450, [_warning("attention-numerics", Role.CAUSE)]
    )
    assert action.dry_run and not action.applied and trainer.calls == []


def test_an_action_with_no_remedy_call_is_an_error_never_a_stop():
    """A decision naming an action no remedy module declares (a request from a newer
    command) is reported as the action's error; it used to fall through to ``stop``."""
    trainer = Trainer()
    trainer.stop = lambda: trainer.calls.append(("stop",))  # type: ignore[attr-defined]
    remediator = Remediator(RemedyPolicy(), trainer)
    (decision,) = remediator.decide(450, [_warning("attention-numerics", Role.CAUSE)])
    action = remediator.apply(replace(decision, kind="new-remedy"))
    assert not action.applied and "new-remedy" in action.error and trainer.calls == []


def test_a_rollback_goes_before_the_warnings_first_evidence():
    trainer = Trainer()
    policy = RemedyPolicy(rollback=True, attention_scope="module")
    (action,) = Remediator(policy, trainer).act(451, [_warning("attention-numerics", Role.CAUSE)])
    assert trainer.calls == [("rollback", 400), ("precise", "h.1.attn")]
    assert action.rolled_back_to == 370 and action.applied


def test_rollback_can_be_asked_for_some_causes_only(tmp_path):
    """rollback = ["router"]: a router action restores a snapshot first, an attention one
    does not; the list is read from a policy file and a cause it misspells is named."""
    trainer = Trainer()
    remediator = Remediator(RemedyPolicy(rollback=["router"], backoff_steps=0), trainer)
    remediator.act(451, [_warning("attention-numerics", Role.CAUSE)])
    remediator.act(452, [_warning("router", Role.CAUSE, "h.0.mlp.gate")])
    assert [c[0] for c in trainer.calls] == ["precise", "rollback", "router"]
    path = tmp_path / "policy.toml"
    path.write_text('[remedy]\nrollback = ["router"]\n')
    policy = RemedyPolicy.from_file(path)
    assert policy.snapshots and policy.rolls_back("router") and not policy.rolls_back("optimizer")
    with pytest.raises(ValueError, match="routr"):
        RemedyPolicy(rollback=["routr"])
    assert not RemedyPolicy(rollback=False).snapshots
    assert RemedyPolicy(rollback=True).rolls_back("optimizer")


def test_the_default_rolls_back_a_router_only_where_a_router_can_warn():
    """The default policy restores a snapshot before a router action only; a model that can
    name no router cause (dense) keeps none, nor does a policy without a router action."""
    policy = RemedyPolicy()
    assert policy.rolls_back("router") and not policy.rolls_back("attention-numerics")
    assert policy.keeps_snapshots(CAUSES)
    assert not policy.keeps_snapshots(["attention-numerics", "optimizer"])
    no_router = RemedyPolicy(actions={"attention-numerics": "precise-attention"})
    assert not no_router.keeps_snapshots(CAUSES)


def test_a_two_sided_series_acts_only_the_way_it_names_a_fault():
    """Router ε rising (rows spreading: an LR ramp, some healthy runs) opens a warning but
    takes no action; ε falling (rows aligning) acts, as does a one-sided router series."""
    trainer = Trainer()
    remediator = Remediator(RemedyPolicy(rollback=False, backoff_steps=0), trainer)
    rising = replace(
        _warning("router", Role.CAUSE, "h.0.mlp.gate"), series="router.epsilon@h.0.mlp.gate"
    )
    assert remediator.act(450, [rising]) == [] and trainer.calls == []
    falling = replace(rising, id="w-fall", direction="down")
    assert [a.kind for a in remediator.act(460, [falling])] == ["scale-router-lr"]
    entropy = replace(rising, id="w-ent", series="router.token_entropy_norm@h.0.mlp.gate")
    assert [a.kind for a in remediator.act(470, [entropy])] == ["scale-router-lr"]


def test_a_policy_file_is_read_and_its_mistakes_named(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[remedy]\nlr_scale = 0.25\nactions = {optimizer = "stop"}\n')
    policy = RemedyPolicy.from_file(path)
    assert policy.lr_scale == 0.25 and dict(policy.actions) == {"optimizer": "stop"}
    path.write_text("[remedy]\nlr_scael = 0.25\n")
    with pytest.raises(ValueError, match="lr_scael"):
        RemedyPolicy.from_file(path)
    with pytest.raises(ValueError, match="unknown remedy action"):
        RemedyPolicy(actions={"router": "reboot"})


def test_a_snapshot_restores_model_and_optimizer_bit_for_bit():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ring = SnapshotRing(capacity=2, every=5)

    def train(step):
        ring.maybe_take(step, model, optimizer)
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for step in range(5):
        train(step)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    for step in range(5, 12):
        train(step)
    assert ring.steps == [5, 10]
    assert ring.restore_before(8, model, optimizer) == 5
    assert all(torch.equal(v, saved_model[k]) for k, v in model.state_dict().items())
    moments = [s["exp_avg"] for s in optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, saved_moments, strict=True))
    assert ring.steps == [5] and ring.nbytes > 0  # the future it replaced is gone


@pytest.mark.slow
def test_a_lab_run_with_a_policy_acts_on_its_own_computation(monkeypatch, tmp_path):
    """The lab's remedies change the training computation: the fault's rounding switched off
    on every layer, the learning rate held; the end record says what was done."""
    from foreshock.lab import remedies as lab_remedies

    opened = {}

    def act_at_step_50(self, step, record):  # the detectors' warning, at a known step
        opened.setdefault("remedies", self)
        if record is not None and record["step"] == 50 and "step" not in opened:
            opened["step"] = step
            return self.remediator.act(step + 1, [_warning("attention-numerics", Role.CAUSE)])
        return []

    monkeypatch.setattr(lab_remedies.LabRemedies, "after_record", act_at_step_50)
    model = GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, n_experts=4)
    config = RunConfig(
        fault=Fault.default("fa-lowprec", onset=10),
        steps=80,
        every=25,
        batch_size=4,
        model=model,
        policy=RemedyPolicy(),
    )
    out = tmp_path / "run.jsonl"
    run_lab(config, out, progress=False)
    run = load_run(out)
    (action,) = run.end["actions"]
    assert action["kind"] == "precise-attention" and action["applied"] and action["step"] == 51
    assert run.start["labels"]["remedy"]["attention_scope"] == "all"
    assert run.end["steps_redone"] == 0 and run.end["status"] == "finished"
    layers = opened["remedies"].lab.attention.values()
    assert all(layer.lowp is None for layer in layers)  # the backward exact again, every layer


@pytest.mark.slow
def test_a_loss_triggered_rollback_rewinds_the_run_and_applies_its_fix(monkeypatch, tmp_path):
    """The baseline a remedy is judged against: once the loss trigger fires, the newest
    snapshot ``back`` steps before the divergence is restored, the history and the schedule
    rewind to it, 200 batches are skipped, the fix (if any) is applied, and the run still
    trains its whole horizon; the monitoring records keep counting updates."""
    from foreshock.lab.loss_trigger import LossTrigger, LossTriggerPolicy

    def fire_at_60(self, step, loss):  # the rule's confirmation, at a known step
        if step == 60 and not self.fired:
            self.fired.append(50)
            return 50
        return None

    monkeypatch.setattr(LossTrigger, "observe", fire_at_60)
    model = GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, n_experts=4)
    trigger = LossTriggerPolicy(back=20, max_rollbacks=1, fix="precise-attention")
    config = RunConfig(
        fault=Fault.default("fa-lowprec", onset=10),
        steps=80,
        every=25,
        batch_size=4,
        model=model,
        loss_trigger=trigger,
    )
    out = tmp_path / "run.jsonl"
    run_lab(config, out, progress=False)
    run = load_run(out)
    end = run.end
    assert end["rollbacks"] == 1 and end["steps_redone"] == 61  # steps 0..60 trained again
    assert end["status"] == "finished" and end["last_step"] == 79  # the whole horizon
    assert [r["step"] for r in run.records] == [0, 25, 50, 75, 100, 125]  # 141 updates
    assert end["snapshot_bytes"] > 0
    assert run.start["labels"]["loss_trigger"]["fix"] == "precise-attention"


def test_a_policy_can_refuse_to_act_on_rules_its_profile_says_are_often_wrong():
    """``max_false_alarm_rate``: a warning whose rule states a per-run false-alarm rate above
    the bound opens, but nothing acts on it unasked; one below acts; a person's request for
    the same warning is applied (approval is the person's call)."""
    from dataclasses import replace

    trainer = Trainer()
    policy = RemedyPolicy(max_false_alarm_rate=0.2)
    often_wrong = replace(_warning("attention-numerics", Role.CAUSE), false_alarm_rate=0.31)
    trusted = replace(_warning("attention-numerics", Role.CAUSE, step=700), false_alarm_rate=0.1)
    remediator = Remediator(policy, trainer)
    assert remediator.act(450, [often_wrong]) == []
    (action,) = remediator.act(700, [trusted])
    assert action.applied and trainer.calls == [("precise", None)]
    request = {"request_id": "q1", "warning_id": often_wrong.id, "family": "attention-numerics"}
    approved = remediator.approve(900, request)
    assert approved is not None and approved.applied and approved.source == "approved"
    with pytest.raises(ValueError, match="max_false_alarm_rate"):
        RemedyPolicy(max_false_alarm_rate=1.5)


def test_the_lab_holds_the_faulted_groups_rate_and_a_second_hold_scales_the_held_one():
    """The lab's ``scale-router-lr`` is a hold on the routers' own (faulted) group: the
    schedule's factor fixed × scale at the next step whatever the ramp does after, the other
    groups on schedule; a second action holds at scale × the held value."""
    from foreshock.lab.remedies import LabRemedies

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [weight], "faulted": True}], lr=0.1)
    lab = LabRemedies(None, lab=None, optimizer=optimizer, start={})  # type: ignore[arg-type]
    assert lab.lr_factor(4.0, True) == 4.0
    lab.scale_router_lr(0.1)
    assert lab.lr_factor(8.0, True) == pytest.approx(0.8)
    assert lab.lr_factor(64.0, True) == pytest.approx(0.8) and lab.lr_factor(64.0, False) == 64.0
    lab.scale_router_lr(0.5)
    assert lab.lr_factor(100.0, True) == pytest.approx(0.4)
    shared = torch.optim.SGD([weight], lr=0.1)
    with pytest.raises(NotImplementedError, match="share"):
        LabRemedies(None, lab=None, optimizer=shared, start={}).scale_router_lr(0.1)  # type: ignore[arg-type]


def test_a_hold_scales_the_rate_from_when_the_evidence_began():
    """A learning-rate ramp warned late has already multiplied the rate: ``hold-lr`` holds
    ``lr_scale`` × the rate at the warning's first evidence (``hold_from = "evidence"``, the
    default), not at the warning; ``"warning"`` keeps the old reading."""
    warning = _warning("optimizer", Role.OPTIMIZER, module=None, step=450)
    evidence = Remediator(RemedyPolicy(), Trainer()).decide(451, [warning])
    at_warning = Remediator(RemedyPolicy(hold_from="warning"), Trainer()).decide(451, [warning])
    assert (evidence[0].since, at_warning[0].since) == (400, None)
    with pytest.raises(ValueError, match="hold_from"):
        RemedyPolicy(hold_from="peak")


def _ramp_then_decay(step: int) -> float:
    """Flat for 10 steps, ×1.1 a step to step 45 (a ramp), then decaying to 1 % by step 60."""
    if step < 10:
        return 1.0
    top = 1.1 ** (min(step, 45) - 10)
    return top if step <= 45 else top * max(0.01, 1 - (step - 45) / 15)


def _trained(lam, steps: int = 40):
    from foreshock.remediation.trainer import TrainerRemedies

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
    remedies = TrainerRemedies(model, optimizer, schedule)
    for step in range(steps):
        remedies.before_step(step)
        optimizer.step()
        schedule.step()
    remedies.before_step(steps)
    return remedies, optimizer, schedule


def test_a_trainer_holds_the_rate_from_before_the_ramp_that_the_evidence_caught():
    """Through a real optimizer and scheduler: evidence at step 20 of a ramp that began at
    step 10 holds 0.5 × the rate before the ramp (a ramp is caught after it began: holding
    the ramped rate left HF runs 0.2 nats above the healthy band); no scheduler step raises
    it; a flat schedule holds its own rate; the floor is a share of the rate at the evidence."""
    from foreshock.remediation.trainer import HOLD_FLOOR

    remedies, optimizer, schedule = _trained(_ramp_then_decay)
    assert remedies.hold_lr(0.5, since=20) == pytest.approx([0.5 * 0.01], rel=1e-9)
    optimizer.step()
    schedule.step()
    remedies.before_step(41)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 0.01, rel=1e-9)
    at_41 = 0.01 * 1.1**31
    assert remedies.hold_lr(1e-9, since=41) == pytest.approx([HOLD_FLOOR * 0.01 * 1.1**10])
    assert at_41 > 0.01
    flat, _, _ = _trained(lambda step: 1.0)
    assert flat.hold_lr(0.5, since=20) == pytest.approx([0.005], rel=1e-9)
    for r in (remedies, flat):
        r.close()


def test_the_lab_holds_the_faulted_factor_it_had_when_the_evidence_began():
    """The lab's hold reads the factor the faulted groups trained with at the evidence's
    step (the newest step at or before it), whatever the ramp reached by the warning."""
    from foreshock.lab.remedies import LabRemedies

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [weight], "faulted": True}], lr=0.1)
    lab = LabRemedies(None, lab=None, optimizer=optimizer, start={})  # type: ignore[arg-type]
    for step in range(10):
        lab.before_step(step)
        assert lab.lr_factor(float(step + 1), True) == step + 1
    lab.hold_lr(0.5, since=3)
    lab.before_step(10)
    assert lab.lr_factor(11.0, True) == pytest.approx(0.5 * 4.0)
    lab.before_step(11)
    assert lab.lr_factor(12.0, True) == pytest.approx(2.0)


class RisingTrainer(Trainer):
    """A trainer that says whether its rate rose (``hold_if_risen``), as TrainerRemedies does."""

    def __init__(self, risen: bool) -> None:
        super().__init__()
        self.risen = risen

    def hold_if_risen(self, since, rise):
        self.calls.append(("risen?", since, rise))
        return [0.002] if self.risen else None


@pytest.mark.parametrize("risen", [True, False])
def test_a_mechanisms_remedy_also_holds_a_rate_that_rose_since_the_evidence(risen):
    """A ramp caught through the router (or the attention it drives) is not stopped by the
    router's remedy alone (a Qwen2-MoE through the HF Trainer diverged 5 steps after it): with
    ``hold_rising_lr`` the trainer is asked whether the rate rose since the evidence began, and
    the action records the held rate only where it did; ``hold-lr`` itself is not asked twice,
    and the setting off asks nothing."""
    from foreshock.remediation.policy import RATE_RISE

    warning = _warning("router", Role.CAUSE, module="h.1.mlp.gate", step=450)
    trainer = RisingTrainer(risen)
    (action,) = Remediator(RemedyPolicy(rollback=False), trainer).act(451, [warning])
    assert trainer.calls == [("router", 0.1), ("risen?", 400, RATE_RISE)]
    assert action.detail.get("held_lr") == ([0.002] if risen else None)
    off = RisingTrainer(True)
    Remediator(RemedyPolicy(rollback=False, hold_rising_lr=False), off).act(451, [warning])
    assert off.calls == [("router", 0.1)]
    hold = RisingTrainer(True)
    optimizer_warning = _warning("optimizer", Role.OPTIMIZER, module=None, step=450)
    Remediator(RemedyPolicy(), hold).act(451, [optimizer_warning])
    assert hold.calls == [("hold", 0.5)]


def test_a_trainer_holds_a_risen_rate_from_before_the_rise_and_follows_the_schedules_decay():
    """A rate 1.1× a step since step 10 has risen past 1.25× its value at step 30: it is held
    at the rate before the rise; a flat rate has not risen and nothing is held. Once held, the
    schedule's own decay (WSD's, cosine's) is followed: the held rate × (the scheduler's rate
    now / at the hold)."""
    flat, _, _ = _trained(lambda step: 1.0)
    assert flat.hold_if_risen(30, 1.25) is None and flat.held is None
    rising, optimizer, schedule = _trained(_ramp_then_decay)
    assert rising.hold_if_risen(30, 1.25) == pytest.approx([0.01], rel=1e-9)
    for step in range(40, 55):
        optimizer.step()
        schedule.step()
        rising.before_step(step + 1)
    decayed = _ramp_then_decay(55) / _ramp_then_decay(40)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * decayed, rel=1e-6)
    for remedies in (flat, rising):
        remedies.close()
