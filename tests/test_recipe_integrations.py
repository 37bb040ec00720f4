"""A real recipe through the Hugging Face and Lightning callbacks: warm-up, then cosine decay.

The records carry the optimizer's learning rate (the schedule as a series), the HF Trainer's
run declares its recipe, and a healthy run of a transformers MoE on real text (the stdlib's
bytes) raises no warning — in the trainer's own detectors nor in a replay of its file. Before
the detectors waited for the schedule's peak, a warm-up put their baselines before the
routers' specialisation (``docs/recipes.md``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from foreshock.detectors.profiles import shipped_profiles
from foreshock.detectors.replay import replay_run
from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.transport.run_files import load_run

STEPS, WARMUP, EVERY, SEQ, BATCH, PEAK = 500, 50, 25, 64, 8, 1e-3
torch.set_num_threads(1)


def mixtral() -> Any:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
        max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config)


def text_windows(n: int) -> list[torch.Tensor]:
    batches = ByteBatches(stdlib_bytes(1_000_000), SEQ, BATCH, seed=0)
    return [row for _ in range(n // BATCH) for row in batches.next()[0]]


def check_cosine_schedule(path: Path) -> None:
    """The records' ``lr``: warming up, a peak, then decaying to near 0; no mechanism warning
    in a replay through the shipped profiles."""
    run = load_run(path)
    rates = [(r["step"], r["values"]["lr"]) for r in run.records]
    assert [s for s, _ in rates] == list(range(0, STEPS, EVERY))
    warm = [x for s, x in rates if s < WARMUP]
    assert warm == sorted(warm) and warm[-1] < PEAK
    assert max(x for _, x in rates) == pytest.approx(PEAK, rel=0.05)
    after = [x for s, x in rates if s > WARMUP]
    assert after == sorted(after, reverse=True) and after[-1] < 0.05 * PEAK
    report = replay_run(run, shipped_profiles())
    assert [a for a in report.alerts if a.family != "symptom"] == [], report.profile_reason


@pytest.mark.slow
def test_hf_cosine_schedule_is_recorded_and_a_healthy_moe_stays_quiet(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    from foreshock.integrations.huggingface import ForeshockCallback

    torch.manual_seed(0)
    path = tmp_path / "hf.jsonl"
    callback = ForeshockCallback(path, run_id="hf-cosine", every=EVERY)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=PEAK, lr_scheduler_type="cosine", warmup_steps=WARMUP, save_strategy="no",
        report_to="none", use_cpu=True, seed=0, disable_tqdm=True, logging_steps=STEPS,
    )  # fmt: skip
    data = [{"input_ids": x, "labels": x} for x in text_windows(STEPS * BATCH)]
    trainer = transformers.Trainer(
        model=mixtral(), args=args, train_dataset=data, callbacks=[callback]
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    trainer.train()

    recipe = load_run(path).labels["recipe"]
    assert (recipe["schedule"], recipe["warmup"], recipe["horizon"]) == ("cosine", WARMUP, STEPS)
    check_cosine_schedule(path)
    assert callback.feed.detector is not None and callback.feed.detector.alerts == []


@pytest.mark.slow
def test_lightning_cosine_schedule_is_recorded_and_a_healthy_moe_stays_quiet(
    tmp_path: Path,
) -> None:
    L = pytest.importorskip("lightning.pytorch")
    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.lab.model import GPT, GPTConfig

    class LitGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(GPTConfig(block_size=SEQ, n_layer=2, n_head=4, n_embd=64))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(batch[:, :-1], batch[:, 1:])[1]

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=PEAK)

            def cosine(step: int) -> float:  # linear warm-up, then cosine to 0
                if step < WARMUP:
                    return (step + 1) / WARMUP
                return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))

            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"},
            }

    torch.manual_seed(0)
    batches = ByteBatches(stdlib_bytes(1_000_000), SEQ + 1, BATCH, seed=0)
    data = [row for _ in range(STEPS) for row in batches.next()[0]]
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    path = tmp_path / "pl.jsonl"
    callback = ForeshockLightningCallback(path, run_id="pl-cosine", every=EVERY)
    trainer = L.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(LitGPT(), loader)

    check_cosine_schedule(path)
    assert callback.feed.detector is not None and callback.feed.detector.alerts == []
