"""The runner's two newer duties, in one process: acting together under torch.distributed
(rank 0 decides, every rank applies: the collective faked, the join through a real store) and
resolving a warning in the in-process detectors once an action was applied.

The real collective, two ranks under ``torchrun``, is ``test_remedy_distributed``.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_integrations import BATCH, SEQ, WARNED, Tokens, plumbing_config
from test_remedy_integrations import lightning_callback, lightning_fit, small_training, warning

from foreshock.producers.monitor import MonitorConfig
from foreshock.remediation import ranks as remedy_ranks
from foreshock.remediation.hooks import RemedyHooks
from foreshock.remediation.ranks import RemedyRanks
from foreshock.remediation.remedy import Remediator, RemedyPolicy
from foreshock.remediation.runner import Remediation
from foreshock.remediation.snapshots import SnapshotRing
from foreshock.remediation.trainer import TrainerRemedies

torch.set_num_threads(1)

EVERY = 5
HOLD = RemedyPolicy(actions={"attention-numerics": "hold-lr"})


class Ranks(RemedyRanks):
    """Two ranks with the broadcast faked: rank 0's decisions go out as they are; another
    rank receives ``sent``; ``fail`` makes the collective raise."""

    def __init__(self, rank: int, sent: Any = None, fail: bool = False) -> None:
        super().__init__(rank, 2, EVERY)
        self.sent, self.fail, self.calls = sent, fail, []

    def share(self, decided: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls.append(decided)
        if self.fail:
            raise RuntimeError("gloo: connection closed by peer")
        return decided if self.decides else self.sent


def test_rank_zero_decides_at_the_boundaries_after_monitoring_steps_only() -> None:
    """Rank 0 shares its decisions (the policy's, then the approved requests') at boundaries
    6, 11, … (after monitoring steps 5, 10, …) and nowhere else: an approved request waits
    there, polled at the next one; it applies and writes what it shared."""
    model, optimizer, schedule = small_training()
    polls: list[int] = []
    stop = {"request_id": "q1", "run_id": "r", "warning_id": "w", "family": "x", "action": "stop"}

    def requests() -> list[dict[str, Any]]:
        polls.append(1)
        return [stop] if len(polls) == 2 else []

    ranks, written = Ranks(0), []
    runner = Remediation(
        HOLD, TrainerRemedies(model, optimizer, schedule), run_id="r",
        write=written.append, requests=requests, ranks=ranks,
    )  # fmt: skip
    assert [runner.at_boundary(step) for step in (2, 3, 4, 5)] == [[], [], [], []]
    assert ranks.calls == [] and polls == []  # no collective, no poll off those boundaries
    [held] = runner.at_boundary(6, [warning(5, 1)])
    assert (
        held.kind == "hold-lr" and held.applied and [d.kind for d in ranks.calls[0]] == ["hold-lr"]
    )
    assert runner.at_boundary(7) == [] and len(ranks.calls) == 1
    [stopped] = runner.at_boundary(11)
    assert (stopped.kind, stopped.source, stopped.request_id) == ("stop", "approved", "q1")
    assert runner.stopped and len(polls) == 2
    assert [(r["action"], r["step"]) for r in written] == [("hold-lr", 6), ("stop", 11)]


def test_another_rank_applies_rank_zeros_decisions_and_writes_nothing() -> None:
    model, optimizer, schedule = small_training()
    lr = optimizer.param_groups[0]["lr"]
    sent = Remediator(HOLD, object()).decide(6, [warning(5, 1)])
    remedies = TrainerRemedies(model, optimizer, schedule)
    runner = Remediation(HOLD, remedies, run_id="r", rank=1, ranks=Ranks(1, sent=sent))
    [action] = runner.at_boundary(6, [warning(5, 2, family="router")])  # its own: not acted on
    assert (action.kind, action.step, action.applied) == ("hold-lr", 6, True)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * lr)
    assert runner.write is None and runner.actions == [action]


def test_a_failed_collective_turns_remediation_off_on_that_rank_without_raising() -> None:
    model, optimizer, schedule = small_training()
    remedies = TrainerRemedies(model, optimizer, schedule, snapshots=SnapshotRing(2, EVERY))
    ranks = Ranks(0, fail=True)
    runner = Remediation(HOLD, remedies, ranks=ranks)
    assert runner.at_boundary(6, [warning(5, 1)]) == []
    assert runner.off and runner.errors == 1 and remedies.held is None and runner.actions == []
    assert runner.at_boundary(11, [warning(10, 1)]) == [] and len(ranks.calls) == 1
    runner.before_step(15)  # no snapshots for a remediation that is off
    assert remedies.ring is not None and remedies.ring.steps == []


def joining(rank: int, *, peers: bool = True, timeout_s: float = 30.0) -> Any:
    """What ``RemedyRanks.join`` reads of a Monitor (rank ``rank`` of two)."""
    config = MonitorConfig(every=EVERY, join_timeout_s=timeout_s)
    return SimpleNamespace(peers=SimpleNamespace(rank=rank, world=2) if peers else None,
                           config=config)  # fmt: skip


@pytest.fixture
def one_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both simulated ranks of this process join the same key (each real rank counts its own)."""
    monkeypatch.setattr(remedy_ranks, "_RUNNERS", itertools.repeat(7))


def test_the_ranks_join_once_every_one_is_ready(one_key: None) -> None:
    store = torch.distributed.HashStore()
    joined: dict[int, RemedyRanks | None] = {}

    def join(rank: int) -> None:
        joined[rank] = RemedyRanks.join(joining(rank), True, store)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert joined[0] is not None and joined[1] is not None
    assert (joined[0].decides, joined[1].decides, joined[1].every) == (True, False, EVERY)


def test_a_rank_without_a_runner_turns_every_rank_off_at_once(one_key: None) -> None:
    """Its optimizer not found, or its runner failed to build: it says ``apart`` and the
    others stop waiting (no broadcast ever left without a peer); without the word, they
    wait the Monitor's ``join_timeout_s``; Monitors that did not join: off at once."""
    store = torch.distributed.HashStore()
    assert RemedyRanks.join(joining(1), False, store) is None
    started = time.monotonic()
    assert RemedyRanks.join(joining(0, timeout_s=30.0), True, store) is None
    assert time.monotonic() - started < 5
    assert RemedyRanks.join(joining(0, timeout_s=0.2), True, torch.distributed.HashStore()) is None
    assert RemedyRanks.join(joining(0, peers=False), True, store) is None


# ---- an applied action resolves its warning in the detectors run in the process ----------
def test_an_applied_action_resolves_its_warning_in_process() -> None:
    """The plain loop's detectors (``feed``): the warning opened at record 15; the action at
    the boundary before 16 clears it there (``resolved_by: action``), the open count back to
    0, the cleared event handed to the trackers (``RemedyHooks.take_updates``)."""
    from foreshock.lab.model import GPT, GPTConfig
    from foreshock.producers.monitor import Monitor
    from foreshock.producers.sinks import ListSink

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = Monitor(model, ListSink(), run_id="plain", config=MonitorConfig(every=EVERY))
    runner = Remediation.for_monitor(HOLD, monitor, optimizer, warnings=plumbing_config())
    assert runner is not None and runner.feed is not None
    hooks = RemedyHooks(HOLD, True, runner.feed)
    hooks.runner = runner
    opened_at = None
    for step, batch in enumerate(Tokens((WARNED + 1) * BATCH, SEQ + 1, 256).ids.split(BATCH)):
        runner.before_step(step)
        loss = model(batch[:, :-1], batch[:, 1:])[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        record = monitor.step(step, loss=loss.detach())
        update = runner.feed.update(record) if record is not None else None
        if update is not None and any(e.event == "opened" for e in update.events):
            opened_at = (step, runner.feed.open["attention-numerics"])
        hooks.at_boundary(step + 1, update)
    monitor.close()
    assert opened_at == (WARNED, 1)
    [action] = runner.actions
    assert (action.kind, action.step, action.applied) == ("hold-lr", WARNED + 1, True)
    assert runner.feed.open["attention-numerics"] == 0
    [resolved] = hooks.take_updates()
    [cleared] = resolved.events
    assert (cleared.event, cleared.id, cleared.cleared_step) == (
        "cleared",
        action.warning_id,
        WARNED + 1,
    )
    assert cleared.evidence["resolved_by"] == "action"
    assert resolved.step == WARNED + 1
    assert resolved.scalars["foreshock/warnings_open/attention-numerics"] == 0.0
    assert hooks.take_updates() == []  # handed over once


@pytest.mark.slow
def test_the_lightning_callback_reports_the_resolution_to_its_trackers(tmp_path: Path) -> None:
    """Through the callback's own detectors: its trackers get the cleared event and the open
    count at the action's boundary (after the record step's update that opened it)."""
    callback = lightning_callback(tmp_path / "pl.jsonl", HOLD)
    reported: list[Any] = []
    callback._report = lambda trainer, update: reported.append(update)
    lightning_fit(callback)
    key = "foreshock/warnings_open/attention-numerics"
    opened = [u for u in reported if any(e.event == "opened" for e in u.events)]
    assert [(u.step, u.scalars[key]) for u in opened[:1]] == [(WARNED, 1.0)]
    [resolved] = [u for u in reported if u.step == WARNED + 1]
    assert resolved.scalars[key] == 0.0
    assert [e.evidence.get("resolved_by") for e in resolved.events] == ["action"]


def test_on_the_fallback_profile_every_action_rolls_back_first() -> None:
    """A model no profile was calibrated on (a transformers Qwen2: the zero-shot profile
    judges it) gets a policy that rolls back for every cause, and the snapshots that needs;
    ``rollback_uncalibrated = false`` keeps the policy as given (a dense model then keeps no
    snapshot); a model its profile knows (the lab's GPT-MoE) keeps it too."""
    transformers = pytest.importorskip("transformers")
    from foreshock.lab.model import GPT, GPTConfig
    from foreshock.producers.monitor import Monitor
    from foreshock.producers.sinks import ListSink

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
        intermediate_size=32, vocab_size=256, max_position_embeddings=32,
    )  # fmt: skip
    qwen2 = transformers.Qwen2ForCausalLM(config)

    def runner(model: torch.nn.Module, policy: RemedyPolicy, **labels: str) -> Remediation:
        monitor = Monitor(model, ListSink(), run_id="r")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        built = Remediation.for_monitor(policy, monitor, optimizer, labels=labels)
        assert built is not None and built.feed is not None
        return built

    unseen = runner(qwen2, RemedyPolicy())
    assert unseen.feed.uncalibrated and unseen.policy.rollback is True
    assert unseen.remedies.ring is not None and unseen.remediator.policy.rollback is True
    asked = runner(qwen2, RemedyPolicy(rollback_uncalibrated=False))
    assert asked.policy.rollback == ("router",) and asked.remedies.ring is None
    known = runner(GPT(GPTConfig()), RemedyPolicy(), arch="gpt-moe")  # its profile's size
    assert not known.feed.uncalibrated and known.policy.rollback == ("router",)


def test_the_detectors_keep_their_state_when_the_ring_keeps_the_weights() -> None:
    """Where the remedies may roll back, the in-process detectors keep their state once per
    weight snapshot (the only steps a rollback returns to), not once per record: marks at
    the ring's steps, as many as the ring holds."""
    from foreshock.producers.monitor import Monitor
    from foreshock.producers.sinks import ListSink

    model, optimizer, _ = small_training()
    monitor = Monitor(model, ListSink(), "r", MonitorConfig(every=EVERY))
    policy = RemedyPolicy(rollback=True)
    runner = Remediation.for_monitor(
        policy, monitor, optimizer, warnings=plumbing_config(), snapshot_every=10, snapshots=2
    )
    assert runner is not None and runner.feed is not None and runner.feed.detector is not None
    for step in range(35):
        runner.before_step(step)
        runner.feed.update({"step": step, "values": {"loss": 1.0}})
    kept = runner.feed.detector._states
    assert [s for s, _ in kept] == [20, 30] == runner.remedies.ring.steps
