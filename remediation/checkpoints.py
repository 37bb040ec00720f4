"""The trainer's own checkpoints as rollback points, beside the in-memory snapshots.

Why: a rollback wants the newest state older than the warning's first evidence, and a trainer
that checkpoints often (the Hugging Face Trainer's ``save_steps``, Lightning's
``ModelCheckpoint(every_n_train_steps=...)``) already keeps it on disk, at no memory cost; the
in-memory ring (:mod:`.snapshots`) is for the steps in between, or for trainers that checkpoint
rarely (``snapshots = 0`` in a callback's ``remedy`` settings leaves the checkpoints alone).

A checkpoint saved after N updates is the state before training step N, as a snapshot taken
before step N is; :class:`~.trainer_remedies.TrainerRemedies` restores the newer of the two
kinds that is older than the evidence. Restoring loads the model's weights, the optimizer's
state and the scheduler's from the checkpoint's files, as the trainer's own resume would
(the data go on; the step count too):

* ``HFCheckpoints``: ``<output_dir>/checkpoint-N/`` with ``model.safetensors`` (or
  ``pytorch_model.bin``), ``optimizer.pt`` and ``scheduler.pt``; a sharded or DeepSpeed
  checkpoint is refused, naming what is missing (the ring still serves);
* ``LightningCheckpoints``: ``<dirpath>/*.ckpt`` whose name says ``step=N`` (the default
  ``epoch={epoch}-step={step}``), with ``state_dict``, ``optimizer_states`` and
  ``lr_schedulers``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

__all__ = ["HFCheckpoints", "LightningCheckpoints"]


class _Checkpoints:
    """A folder of a trainer's checkpoints, each named by the updates done before it."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def found(self) -> dict[int, Path]:
        """{updates done: path} of the checkpoints in the folder now."""
        raise NotImplementedError

    def newest_before(self, step: int) -> int | None:
        """The newest checkpoint's step older than ``step`` (None: none)."""
        return _newest_before(self.found(), step)

    def restore_before(self, step: int, model: torch.nn.Module, state: Any) -> int | None:
        """Load the newest checkpoint older than ``step`` into ``model`` and ``state`` (the
        optimizer and scheduler: ``state.optimizer``, ``state.scheduler``); its step, or None
        when none is that old (nothing restored). A checkpoint it cannot read raises."""
        found = self.found()  # the folder listed once
        taken = _newest_before(found, step)
        if taken is None:
            return None
        weights, optimizer, scheduler = self._read(found[taken])
        _load_weights(model, weights)
        state.optimizer.load_state_dict(optimizer)
        if state.scheduler is not None and scheduler is not None:
            state.scheduler.load_state_dict(scheduler)
        return taken

    def _read(self, path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
        raise NotImplementedError


class HFCheckpoints(_Checkpoints):
    """The Hugging Face Trainer's ``checkpoint-N`` folders under its ``output_dir``."""

    NAME = re.compile(r"checkpoint-(\d+)$")

    def found(self) -> dict[int, Path]:
        if not self.directory.is_dir():
            return {}
        named = ((self.NAME.match(p.name), p) for p in self.directory.iterdir() if p.is_dir())
        return {int(m[1]): p for m, p in named if m}

    def _read(self, path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
        if (path / "model.safetensors").exists():
            from safetensors.torch import load_file

            weights = load_file(path / "model.safetensors")
        elif (path / "pytorch_model.bin").exists():
            weights = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or pytorch_model.bin")
        if not (path / "optimizer.pt").exists():
            raise FileNotFoundError(f"{path}: no optimizer.pt (the optimizer's state)")
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        scheduler_path = path / "scheduler.pt"
        scheduler = (
            torch.load(scheduler_path, map_location="cpu", weights_only=True)
            if scheduler_path.exists()
            else None
        )
        return weights, optimizer, scheduler


class LightningCheckpoints(_Checkpoints):
    """Lightning's ``ModelCheckpoint`` files under its ``dirpath``, named ``...step=N...``."""

    NAME = re.compile(r"(?:^|[-_])step=(\d+)")

    def found(self) -> dict[int, Path]:
        if not self.directory.is_dir():
            return {}
        named = ((self.NAME.search(p.stem), p) for p in self.directory.glob("*.ckpt"))
        return {int(m[1]): p for m, p in named if m}

    def _read(self, path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        optimizers = checkpoint.get("optimizer_states") or []
        if len(optimizers) != 1:
            raise ValueError(f"{path}: {len(optimizers)} optimizer states; rollback takes one")
        schedulers = checkpoint.get("lr_schedulers") or [None]
        return checkpoint["state_dict"], optimizers[0], schedulers[0]


def _newest_before(steps: dict[int, Path], step: int) -> int | None:
    return max((s for s in steps if s < step), default=None)


def _load_weights(model: torch.nn.Module, weights: dict[str, Any]) -> None:
    """Load ``weights`` into ``model``, checked first (nothing loaded from a checkpoint that
    does not fit): a key the checkpoint left out is allowed only where it shares its tensor
    with one it has (tied weights: the checkpoint saves one of them)."""
    own = model.state_dict()
    loaded = {own[k].data_ptr() for k in weights if k in own}
    untied = [k for k in own if k not in weights and own[k].data_ptr() not in loaded]
    unexpected = [k for k in weights if k not in own]
    reshaped = [k for k in weights if k in own and weights[k].shape != own[k].shape]
    if untied or unexpected or reshaped:
        raise ValueError(
            f"the checkpoint does not fit the model: missing {untied[:5]}, "
            f"unexpected {unexpected[:5]}, of another shape {reshaped[:5]}"
        )
    model.load_state_dict(weights, strict=False)
