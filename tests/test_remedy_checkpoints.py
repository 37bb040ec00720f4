"""A rollback to the trainer's own checkpoints: the Hugging Face Trainer's ``checkpoint-N``
folders and Lightning's ``ModelCheckpoint`` files, restored as the trainer's resume would load
them (weights, optimizer and scheduler state), the newer of them and the in-memory snapshots
chosen, and a checkpoint that does not fit refused with nothing loaded."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from test_integrations import SEQ, plumbing_config
from test_remedy_integrations import (
    ACTED,
    EVERY,
    STEPS,
    WARNED,
    actions_in,
    end_of,
    hf_train,
    lightning_callback,
    lightning_fit,
    same,
    small_training,
    train_one,
)

from foreshock.remediation.checkpoints import HFCheckpoints, LightningCheckpoints
from foreshock.remediation.remedy import RemedyPolicy
from foreshock.remediation.snapshots import SnapshotRing
from foreshock.remediation.trainer import TrainerRemedies

ROLLBACK = RemedyPolicy(rollback=True, actions={"attention-numerics": "hold-lr"})


def save_hf_checkpoint(folder: Path, model: Any, optimizer: Any, schedule: Any) -> None:
    """What the Trainer writes of a checkpoint (weights, optimizer, scheduler)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors"
    )
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(schedule.state_dict(), folder / "scheduler.pt")


def test_the_newest_checkpoint_before_the_evidence_is_restored_over_an_older_snapshot(tmp_path):
    """Checkpoints at 4 and 8, a snapshot at 5: a rollback before 9 loads checkpoint 8 (the
    newest), bit for bit, schedule included; before 6, the snapshot at 5 beats checkpoint 4."""
    model, optimizer, schedule = small_training()
    ring = SnapshotRing(capacity=2, every=5)
    remedies = TrainerRemedies(
        model, optimizer, schedule, snapshots=ring, checkpoints=HFCheckpoints(tmp_path)
    )
    saved = {}
    for step in range(10):
        remedies.before_step(step)
        if step in (4, 8):
            save_hf_checkpoint(tmp_path / f"checkpoint-{step}", model, optimizer, schedule)
            saved[step] = copy.deepcopy(
                (model.state_dict(), optimizer.state_dict()["state"], schedule.state_dict())
            )
        train_one(model, optimizer, schedule)
    assert remedies.rollback(9) == 8
    weights, moments, schedule_state = saved[8]
    assert same(model.state_dict(), weights)
    assert same(optimizer.state_dict()["state"], moments)
    assert schedule.state_dict()["last_epoch"] == schedule_state["last_epoch"]
    assert remedies.rollback(6) == 5  # the in-memory snapshot is newer than checkpoint 4
    assert remedies.rollback(4) == 0  # only the first snapshot is that old
    assert remedies.rollback(0) is None  # nothing is


def test_a_checkpoint_that_does_not_fit_is_refused_and_nothing_is_loaded(tmp_path):
    model, optimizer, schedule = small_training()
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    save_hf_checkpoint(tmp_path / "checkpoint-2", other, optimizer, schedule)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    remedies = TrainerRemedies(model, optimizer, schedule, checkpoints=HFCheckpoints(tmp_path))
    with pytest.raises(ValueError, match="shape"):
        remedies.rollback(5)
    (tmp_path / "checkpoint-3").mkdir()  # a folder without the model's weights
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        remedies.rollback(5)
    assert same(model.state_dict(), before)
    with pytest.raises(RuntimeError, match="snapshots"):
        TrainerRemedies(model, optimizer, schedule).rollback(5)


def test_tied_weights_left_out_of_a_checkpoint_are_restored_through_their_twin(tmp_path):
    """A checkpoint saves one of two tied tensors (transformers drops ``lm_head.weight``):
    the other is restored with it; an untied tensor left out is an error naming it."""
    tied = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))
    tied[1].weight = tied[0].weight
    opt = torch.optim.SGD(tied.parameters(), lr=0.1)
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    from safetensors.torch import save_file

    weights = {"0.weight": torch.ones(8, 8)}
    save_file(weights, folder / "model.safetensors")
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    remedies = TrainerRemedies(tied, opt, checkpoints=HFCheckpoints(tmp_path))
    assert remedies.rollback(2) == 1
    assert torch.equal(tied[1].weight, torch.ones(8, 8))
    untied = torch.nn.Sequential(
        torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False)
    )
    with pytest.raises(ValueError, match=r"1\.weight"):
        TrainerRemedies(
            untied,
            torch.optim.SGD(untied.parameters(), lr=0.1),
            checkpoints=HFCheckpoints(tmp_path),
        ).rollback(2)


@pytest.mark.slow
def test_hf_trainer_rolls_back_to_its_own_checkpoint(tmp_path: Path) -> None:
    """``save_steps``: with no snapshot kept in memory (``snapshots = 0``) the rollback loads
    the Trainer's newest ``checkpoint-N`` before the warning's first evidence: the weights and
    the optimizer's state after it are the checkpoint's, tensor for tensor."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from foreshock.integrations.huggingface import ForeshockCallback

    after: dict[str, Any] = {}

    class Recorder(transformers.TrainerCallback):  # runs after foreshock's, in list order
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == ACTED:
                after["model"] = {
                    k: v.detach().clone() for k, v in kw["model"].state_dict().items()
                }
                after["optimizer"] = copy.deepcopy(kw["optimizer"].state_dict()["state"])

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=32,
        vocab_size=256, max_position_embeddings=SEQ, attn_implementation="sdpa",
        tie_word_embeddings=True,
    )  # fmt: skip
    path = tmp_path / "hf.jsonl"
    callback = ForeshockCallback(path, every=EVERY, warnings=plumbing_config(), remedy=ROLLBACK)
    callback.remedy.snapshots = 0
    trainer = hf_train(
        tmp_path, transformers.LlamaForCausalLM(config), callback, Recorder(),
        save_strategy="steps", save_steps=EVERY, save_only_model=False,
    )  # fmt: skip

    assert trainer.state.global_step == STEPS
    [record] = actions_in(path)
    back = record["rolled_back_to"]
    assert record["applied"] and back is not None and back < WARNED and back % EVERY == 0
    folder = tmp_path / "hf-out" / f"checkpoint-{back}"
    saved = load_file(folder / "model.safetensors")
    assert all(torch.equal(after["model"][k], v) for k, v in saved.items())
    assert same(after["optimizer"], torch.load(folder / "optimizer.pt", weights_only=True)["state"])


@pytest.mark.slow
def test_lightning_rolls_back_to_its_model_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """``ModelCheckpoint(every_n_train_steps=...)``: the rollback loads the newest ``.ckpt``
    before the evidence, the module's weights as it saved them."""
    pytest.importorskip("lightning")
    callback = lightning_callback(tmp_path / "pl.jsonl", ROLLBACK)
    callback.remedy.snapshots = 0
    kept: dict[str, Any] = {}
    original = LightningCheckpoints.restore_before

    def restore_and_keep(self, step, model, state):  # the state right after the restore
        taken = original(self, step, model, state)
        kept[taken] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return taken

    monkeypatch.setattr(LightningCheckpoints, "restore_before", restore_and_keep)
    lightning_fit(callback, checkpoints=tmp_path / "ckpt")
    [record] = actions_in(tmp_path / "pl.jsonl")
    back = record["rolled_back_to"]
    assert record["applied"] and back is not None and back < WARNED and back in kept
    [file] = [p for s, p in LightningCheckpoints(tmp_path / "ckpt").found().items() if s == back]
    saved = torch.load(file, weights_only=False)["state_dict"]
    assert all(torch.equal(kept[back][k], v) for k, v in saved.items())


def test_lightning_trains_the_steps_a_rollback_undid(tmp_path: Path) -> None:
    """A rollback in a step-bounded fit lengthens it by the steps it undid
    (``extend_horizon``): the module still makes its ``max_steps`` updates after the restore."""
    pytest.importorskip("lightning")
    callback = lightning_callback(tmp_path / "pl.jsonl", ROLLBACK)
    callback.remedy.snapshot_every = EVERY
    trainer, _ = lightning_fit(callback)
    [record] = actions_in(tmp_path / "pl.jsonl")
    redone = end_of(tmp_path / "pl.jsonl")["remedy"]["steps_redone"]
    assert record["applied"] and record["rolled_back_to"] is not None and redone > 0
    assert trainer.global_step == STEPS + redone
