"""The exact divergence step from every integration: the rule on every step's loss.

The ``end`` record of a run trained through the HF Trainer or Lightning callback carries
``divergence_step``: the project's rule (``detectors.divergence``) applied to every update's
loss — equal to the rule applied independently to the trainer's own per-step losses — or null
for a run that did not diverge (absent would mean "not known").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from foreshock.detectors.divergence import DivergenceRule, divergence_step
from foreshock.lab.recorded import load_run
from foreshock.producers.divergence_watch import DivergenceWatch

torch.set_num_threads(1)

STEPS, EVERY, BATCH, SEQ, VOCAB = 300, 25, 4, 16, 64


def tokens(n: int, length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(1))


# ---- the watch itself ----------------------------------------------------------------------
def test_the_watch_is_the_rule_on_every_step() -> None:
    losses = [2.0 + 0.01 * math.sin(s) for s in range(200)] + [3.0] * 100
    watch = DivergenceWatch(max_pending=7)
    for step, loss in enumerate(losses):  # tensors and numbers alike
        watch.observe(step, torch.tensor(loss) if step % 2 else loss)
    assert watch.end_fields() == {"divergence_step": divergence_step(losses)}
    assert watch.divergence_step is not None
    flat = DivergenceWatch()
    for step in range(300):
        flat.observe(step, torch.tensor(2.0))
    assert flat.end_fields() == {"divergence_step": None}  # null: did not diverge


def test_a_nan_diverges_and_a_bad_value_is_a_step_it_cannot_read() -> None:
    nan = DivergenceWatch()
    for step in range(20):
        nan.observe(step, torch.tensor(float("nan") if step == 12 else 2.0))
    assert nan.end_fields() == {"divergence_step": 12}
    for bad in (None, "2.0", True, torch.ones(3), object()):
        watch = DivergenceWatch()
        for step in range(150):
            watch.observe(step, bad if step == 40 else 2.0)
        assert watch.end_fields() == {}, bad  # not known: the detectors estimate
    skipped = DivergenceWatch()
    for step in (0, 1, 3):  # step 2 never observed
        skipped.observe(step, 2.0)
    assert skipped.end_fields() == {}
    assert DivergenceWatch().end_fields() == {}  # no loss at all


def test_a_gap_after_the_divergence_keeps_it_exact() -> None:
    watch = DivergenceWatch(DivergenceRule(warmup=0, patience=1))
    watch.observe(0, 2.0)
    watch.observe(1, float("inf"))
    watch.observe(2, None)
    assert watch.end_fields() == {"divergence_step": 1}


def test_losses_are_read_in_one_copy_per_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    stacks = []
    real = torch.stack
    monkeypatch.setattr(torch, "stack", lambda ts, *a, **k: stacks.append(len(ts)) or real(ts))
    watch = DivergenceWatch(max_pending=10)
    for step in range(25):
        watch.observe(step, torch.tensor(2.0))
    assert stacks == [10, 10]  # 5 still kept, unread
    assert watch.end_fields() == {"divergence_step": None} and stacks == [10, 10, 5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_observing_a_device_loss_never_synchronises() -> None:
    watch = DivergenceWatch(max_pending=64)
    losses = [torch.full((), 2.0, device="cuda") for _ in range(50)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
    try:
        for step, loss in enumerate(losses):
            watch.observe(step, loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert watch.end_fields() == {"divergence_step": None} and watch.steps == 50


def monitored(steps: list[tuple[int, Any, bool]]) -> dict:
    """A MonitoredRun on a tiny model fed ``(step, loss, own)``; its end record."""
    from foreshock.integrations import MonitoredRun
    from foreshock.producers.monitor import MonitorConfig
    from foreshock.producers.sinks import ListSink

    sink = ListSink()
    run = MonitoredRun(sink, "mr", MonitorConfig(every=EVERY), None, "tests")
    run.begin(nn.Linear(4, 4))
    for step, loss, own in steps:
        run.step(step, loss=loss, own=own)
    run.finish()
    (end,) = [r for r in sink.records if r.get("kind") == "end"]
    return end


def test_monitored_run_writes_null_absent_or_the_step() -> None:
    healthy = [(s, torch.tensor(2.0), True) for s in range(200)]
    assert monitored(healthy)["divergence_step"] is None
    nan = [*healthy[:120], (120, torch.tensor(float("nan")), True)]
    assert monitored(nan)["divergence_step"] == 120
    fallback = [*healthy[:50], (50, 2.0, False), *healthy[51:]]  # a logged, not own, loss
    assert "divergence_step" not in monitored(fallback)
    junk = [*healthy[:50], (50, {"loss": "?"}, True), *healthy[51:]]  # never raises
    assert "divergence_step" not in monitored(junk)


# ---- Hugging Face Trainer ------------------------------------------------------------------
def hf_run(tmp_path: Path, learning_rate: float, warmup: int) -> tuple[list[float], dict]:
    """A tiny GPT-2 through the Trainer with the callback; the Trainer's own per-step losses
    (``logging_steps=1``, NaN kept as NaN) and the run's end record."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from foreshock.integrations.huggingface import ForeshockCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32, bos_token_id=0
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf-out"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=warmup,  # the ramp: lr-high's fault
        max_grad_norm=0.0,
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    path = tmp_path / "hf.jsonl"
    callback = ForeshockCallback(path, run_id="hf-div", every=EVERY, warnings=False)
    data = [{"input_ids": t, "labels": t} for t in tokens(STEPS * BATCH, SEQ)]
    model = transformers.GPT2LMHeadModel(config)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        trainer.train()
    finally:
        transformers.logging.set_verbosity(verbosity)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == STEPS
    return losses, load_run(path).end


@pytest.mark.parametrize(
    ("learning_rate", "warmup", "diverges"), [(1e-3, 0, False), (0.5, 300, True)]
)
@pytest.mark.slow
def test_huggingface_end_has_the_rules_divergence_step(
    tmp_path: Path, learning_rate: float, warmup: int, diverges: bool
) -> None:
    losses, end = hf_run(tmp_path, learning_rate, warmup)
    assert "divergence_step" in end  # null is "did not diverge", not "unknown"
    assert end["divergence_step"] == divergence_step(losses)
    assert (end["divergence_step"] is not None) is diverges
    if diverges:  # a divergence between monitoring steps: not a multiple of EVERY
        assert 100 <= end["divergence_step"] < STEPS


# ---- Lightning -----------------------------------------------------------------------------
def lightning_run(tmp_path: Path, learning_rate: float) -> tuple[list[float], dict]:
    """A bigram LM fitted with Adam, the learning rate ramped linearly to ``learning_rate``
    over the run; its per-step losses and the run's end record."""
    L = pytest.importorskip("lightning.pytorch")
    from foreshock.integrations.lightning import ForeshockLightningCallback

    class Bigram(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB)
            self.losses: list[float] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            logits = self.head(torch.relu(self.emb(batch[:, :-1])))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.Adam(self.parameters(), lr=learning_rate)
            ramp = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / STEPS)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": ramp, "interval": "step"}}

    torch.manual_seed(0)
    module = Bigram()
    path = tmp_path / "pl.jsonl"
    callback = ForeshockLightningCallback(path, run_id="pl-div", every=EVERY, warnings=False)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    loader = torch.utils.data.DataLoader(tokens(STEPS * BATCH, SEQ + 1), batch_size=BATCH)
    trainer.fit(module, loader)
    assert len(module.losses) == STEPS
    return module.losses, load_run(path).end


@pytest.mark.slow
@pytest.mark.parametrize(("learning_rate", "diverges"), [(1e-3, False), (5.0, True)])
def test_lightning_end_has_the_rules_divergence_step(
    tmp_path: Path, learning_rate: float, diverges: bool
) -> None:
    losses, end = lightning_run(tmp_path, learning_rate)
    assert "divergence_step" in end
    assert end["divergence_step"] == divergence_step(losses)
    assert (end["divergence_step"] is not None) is diverges


def test_an_end_that_says_no_divergence_withdraws_the_detectors_estimate():
    """A one-batch loss spike at a monitoring record can look like a divergence; the
    producer's every-step rule saying null (did not diverge) has the last word."""
    from foreshock.detectors.config import DetectorConfig
    from foreshock.detectors.engine import RunDetector

    detector = RunDetector("r", DetectorConfig(thresholds={"grad_norm": 1.0}))
    detector.update({"kind": "start", "labels": {}})
    for step in range(0, 600, 25):
        loss = 2.0 if step < 400 else None  # null: a non-finite one-batch loss
        grad = 1.0 + 0.01 * (step % 50) if step < 300 else 50.0  # a symptom warning first
        values = {"loss": loss, "grad_norm": grad}
        detector.update({"kind": "metrics", "step": step, "values": values})
    assert detector.divergence_step is not None and detector.alerts
    events = detector.update({"kind": "end", "status": "finished", "divergence_step": None})
    assert detector.divergence_step is None
    updated = [e for e in events if e.event == "updated"]
    assert updated and all(e.divergence_step is None and e.lead_time is None for e in updated)
