"""A resumed attempt orders after the one whose checkpoint it resumed, whatever the clocks:
the Hugging Face and Lightning callbacks keep the monitoring's state in the trainer's own
checkpoints and hand it to the next attempt (``foreshock.transport.attempts``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_integrations import BATCH, SEQ, Tokens, tiny_gpt2

from foreshock.transport.attempts import attempt_number, restart_of

HOUR_US = 3_600 * 10**6


class AttemptSink:
    """A sink with the KafkaSink's attempt API (``attempt``, ``resume``), started at a
    given clock: the second attempt's is an hour *behind* the first's."""

    def __init__(self, started_us: int) -> None:
        self.started_us, self.records = started_us, []
        self.attempt = attempt_number(0, started_us)

    def resume(self, restart: int) -> None:
        self.attempt = attempt_number(restart, self.started_us)

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


def _hf_fit(tmp_path: Path, sink: AttemptSink, resume: str | None = None) -> Any:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from foreshock.integrations.huggingface import ForeshockCallback

    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf-out"),
        max_steps=8,
        per_device_train_batch_size=BATCH,
        save_strategy="steps",
        save_steps=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    data = [{"input_ids": t, "labels": t} for t in Tokens(8 * BATCH, SEQ, 64)]
    callback = ForeshockCallback(sink, run_id="hf-resumed", every=2, warnings=False)
    trainer = transformers.Trainer(
        model=tiny_gpt2(), args=args, train_dataset=data, callbacks=[callback]
    )
    transformers.logging.set_verbosity_error()
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_a_hf_run_resumed_from_its_checkpoint_is_a_later_attempt_whatever_the_clock(tmp_path):
    first = AttemptSink(started_us=1_800_000_000 * 10**6)
    _hf_fit(tmp_path, first)
    second = AttemptSink(started_us=first.started_us - HOUR_US)
    _hf_fit(tmp_path, second, resume=str(tmp_path / "hf-out" / "checkpoint-4"))
    assert (restart_of(first.attempt), restart_of(second.attempt)) == (0, 1)
    assert second.attempt > first.attempt
    steps = [r["step"] for r in second.records if "values" in r]
    assert steps and min(steps) >= 4  # the resumed attempt's own steps


def test_a_lightning_run_resumed_from_its_checkpoint_is_a_later_attempt(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.lab.model import GPT, GPTConfig

    class LitGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(batch[:, :-1], batch[:, 1:])[1]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def fit(sink: AttemptSink, steps: int, ckpt: str | None = None) -> None:
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(Tokens(16 * BATCH, SEQ + 1, 256), batch_size=BATCH)
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            default_root_dir=str(tmp_path),
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[ForeshockLightningCallback(sink, run_id="pl-resumed", every=2)],
        )
        trainer.fit(LitGPT(), loader, ckpt_path=ckpt)
        if ckpt is None:
            trainer.save_checkpoint(tmp_path / "four.ckpt")

    first = AttemptSink(started_us=1_800_000_000 * 10**6)
    fit(first, 4)
    second = AttemptSink(started_us=first.started_us - HOUR_US)
    fit(second, 8, str(tmp_path / "four.ckpt"))
    assert (restart_of(first.attempt), restart_of(second.attempt)) == (0, 1)
    assert second.attempt > first.attempt
