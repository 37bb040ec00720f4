"""The trainer integrations on tiny random models: Hugging Face Trainer and Lightning.

Each trains ~30 steps on CPU with the callback writing JSON Lines, then checks the run's
lifecycle records, the metrics at the monitoring steps (step alignment included: a record's
loss is the loss of that very update) and that the callback leaves training bit-identical.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from foreshock.lab.recorded import RecordedRun, load_run

torch.set_num_threads(1)

STEPS, EVERY, BATCH, SEQ = 30, 5, 4, 16
MONITORED = list(range(0, STEPS, EVERY))  # 0, 5, ..., 25


class Tokens(torch.utils.data.Dataset):
    """Random token ids, fixed by ``seed``: ``n`` sequences of ``length``."""

    def __init__(self, n: int, length: int, vocab: int, seed: int = 1) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Any:
        return self.ids[i]


class FailingSink:
    """A sink whose every write raises: monitoring must not take the training down with it."""

    def __init__(self) -> None:
        self.calls = 0

    def write(self, record: dict[str, Any]) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        raise OSError("disk still full")


def finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def check_lifecycle(run: RecordedRun, run_id: str, framework: str) -> None:
    assert run.start["kind"] == "start" and run.start["schema"] == "foreshock.run/1"
    assert run.run_id == run_id
    assert run.labels["framework"] == framework and run.labels["project"] == "tests"
    assert run.end is not None and run.end["status"] == "finished"
    assert run.end["run_id"] == run_id and run.end["last_step"] == STEPS - 1
    assert [r["step"] for r in run.records] == MONITORED
    assert run.end["records"] == len(MONITORED) and run.end["monitor_errors"] == 0
    for record in run.records:
        assert record["flags"] == [] and record["run_id"] == run_id


def check_attention(run: RecordedRun, layer: str) -> None:
    """Spectral entropies from the second monitoring step on (the first only snapshots)."""
    for key in (
        f"attn.dwq.entropy@{layer}",
        f"attn.dwk.entropy@{layer}",
        f"attn.d2.entropy_mean@{layer}",
        f"attn.d3.entropy_mean@{layer}",
    ):
        steps, values = run.series(key)
        assert steps == MONITORED[1:], key
        assert all(finite(v) for v in values), (key, values)


def check_symptoms(run: RecordedRun, losses: list[float]) -> None:
    """Loss and grad norm at every monitoring step; the loss is that update's own."""
    for record in run.records:
        values = record["values"]
        assert finite(values["loss"]) and finite(values["weight_norm"])
        # measured after optimizer.step() and before zero_grad(): the gradients are there
        assert finite(values["grad_norm"]) and values["grad_norm"] > 0
        assert values["loss"] == pytest.approx(losses[record["step"]], rel=1e-5, abs=1e-6)


# ---- Hugging Face ------------------------------------------------------------------------
def tiny_gpt2() -> Any:
    import transformers

    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def tiny_mixtral() -> Any:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=64,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.MixtralForCausalLM(config)


def hf_train(
    tmp_path: Path,
    callback: Any = None,
    make_model: Any = tiny_gpt2,
    steps: int = STEPS,
    report_to: str | list[str] = "none",
) -> tuple[list[float], dict[str, Any]]:
    """Train a tiny random model with the Trainer; per-update losses and the final weights."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    torch.manual_seed(0)
    model = make_model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf-out"),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=report_to,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    data = [{"input_ids": t, "labels": t} for t in Tokens(steps * BATCH, SEQ, 64)]
    callbacks = [callback] if callback is not None else None
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the tiny config's token-id warnings
    try:
        trainer.train()
    finally:
        transformers.logging.set_verbosity(verbosity)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == steps
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_huggingface_callback(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback
    from foreshock.producers.sinks import JsonlSink

    path = tmp_path / "hf.jsonl"
    callback = ForeshockCallback(
        JsonlSink(path), run_id="hf-tiny", every=EVERY, labels={"project": "tests"}
    )
    losses, weights = hf_train(tmp_path, callback)

    run = load_run(path)
    check_lifecycle(run, "hf-tiny", "transformers")
    assert run.labels["transformers"] and run.labels["model_type"] == "gpt2"
    assert run.start["monitor"]["config"]["every"] == EVERY
    check_attention(run, "transformer.h.0.attn")
    check_symptoms(run, losses)

    # the callback leaves the training bit-identical
    plain_losses, plain_weights = hf_train(tmp_path)
    assert plain_losses == losses
    assert all(torch.equal(weights[k], plain_weights[k]) for k in weights)


@pytest.mark.slow
def test_huggingface_callback_on_mixtral_routers_and_max_logit(tmp_path: Path) -> None:
    """A transformers MoE through the callback: router and max-logit series at every
    monitoring step, and training bit-identical with and without it."""
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback

    steps = 50
    path = tmp_path / "mixtral.jsonl"
    callback = ForeshockCallback(path, run_id="hf-mixtral", every=EVERY, labels={"project": "t"})
    losses, weights = hf_train(tmp_path, callback, tiny_mixtral, steps)
    run = load_run(path)
    assert [r["step"] for r in run.records] == list(range(0, steps, EVERY))
    for layer in ("model.layers.0", "model.layers.1"):
        router = f"{layer}.mlp.gate"
        for metric in ("token_entropy_norm", "load_entropy", "epsilon", "cosine_mean"):
            steps_seen, values = run.series(f"router.{metric}@{router}")
            assert steps_seen == [r["step"] for r in run.records], metric
            assert all(finite(v) for v in values), (metric, values)
        steps_seen, values = run.series(f"max_logit@{layer}.self_attn")
        assert steps_seen == [r["step"] for r in run.records]
        assert all(finite(v) and v > 0 for v in values)
    assert all(record["flags"] == [] for record in run.records)

    plain_losses, plain_weights = hf_train(tmp_path, None, tiny_mixtral, steps)
    assert plain_losses == losses
    assert all(torch.equal(weights[k], plain_weights[k]) for k in weights)


def test_huggingface_callback_falls_back_to_step_end(tmp_path: Path) -> None:
    """Where on_optimizer_step never comes (transformers < 4.41), on_step_end measures the same
    update; it runs after zero_grad(), so those records have no grad_norm."""
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback
    from foreshock.producers.sinks import ListSink

    class OldTransformers(ForeshockCallback):
        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            pass

    sink = ListSink()
    losses, _ = hf_train(tmp_path, OldTransformers(sink, every=EVERY))
    metrics = [r for r in sink.records if r.get("schema") == "foreshock.metrics/1"]
    assert [r["step"] for r in metrics] == MONITORED
    for record in metrics:
        assert "grad_norm" not in record["values"]
        assert record["values"]["loss"] == pytest.approx(losses[record["step"]], rel=1e-5)
    assert [r["kind"] for r in sink.records if "kind" in r] == ["start", "end"]


def test_huggingface_callback_survives_a_failing_sink(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback

    sink = FailingSink()
    hf_train(tmp_path, ForeshockCallback(sink, every=EVERY))
    assert sink.calls > len(MONITORED)  # it kept trying: start, metrics (+ error records), end


# ---- trackers: TensorBoard and MLflow, written through the trainers' own loggers ----------
def plumbing_config() -> Any:
    """A plumbing detector config, not a detection claim: the tiniest threshold on a series
    that moves every record (the Δ2 entropy, either way) after a two-record warm-up, so a
    warning opens on cue at the third Δ2 record (step 15: Δ2 starts at 5; 5 and 10 warm up)."""
    from foreshock.detectors.config import DetectorConfig, SeriesRule

    metric = "attn.d2.entropy_mean"
    rule = SeriesRule(metric, "attention-numerics", "both", "level")
    return DetectorConfig(
        rules=(rule,), warmup_start=0, warmup_records=2, confirm=1, thresholds={metric: 1e-9}
    )


WARNED = 15  # the record step plumbing_config's warning opens at


def tensorboard_events(folder: Path) -> tuple[dict[str, list], dict[str, list]]:
    """Every event file under ``folder``: {tag: [(step, value)]} of scalars and of texts."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(folder.rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {folder}"
    scalars: dict[str, list] = {}
    texts: dict[str, list] = {}
    for path in files:
        events = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
        for tag in events.Tags()["tensors"]:  # add_text writes <tag>/text_summary
            texts.setdefault(tag.removesuffix("/text_summary"), []).extend(
                (e.step, b"".join(e.tensor_proto.string_val).decode()) for e in events.Tensors(tag)
            )
    return scalars, texts


def mlflow_run(uri: str) -> tuple[Any, Any]:
    """The one run of the file store at ``uri`` and a client on it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiments = client.search_experiments()
    [run] = client.search_runs([e.experiment_id for e in experiments])
    return client, run


def check_trackers(
    scalars: dict[str, list],
    texts: dict[str, list],
    client: Any,
    run: Any,
    records: list[dict],
    layer: str,
    offset: int,
    loss: str,
) -> None:
    """The series and the warning in TensorBoard and MLflow, next to the trainer's loss, at
    the trainer's step of each update (``offset``: where it plots update 0)."""
    key = f"attn.d2.entropy_mean@{layer}"
    d2 = {r["step"] + offset: r["values"][key] for r in records if key in r["values"]}
    steps = [s + offset for s in MONITORED]
    assert sorted(d2) == steps[1:]
    run_id = run.info.run_id

    # TensorBoard
    assert any(tag.endswith("loss") for tag in scalars), sorted(scalars)
    prefix = "train/" if "train/loss" in scalars else ""  # HF's TensorBoard prefixes train/
    tb = dict(scalars[f"{prefix}foreshock/attn.d2.entropy_mean/min"])
    assert sorted(tb) == sorted(d2)
    assert all(tb[s] == pytest.approx(d2[s], rel=1e-6) for s in d2)  # float32 in the file
    assert scalars[f"{prefix}foreshock/warning/attention-numerics"] == [(WARNED + offset, 1.0)]
    open_ = dict(scalars[f"{prefix}foreshock/warnings_open/attention-numerics"])
    assert sorted(open_) == steps and open_[steps[0]] == 0 and open_[WARNED + offset] == 1
    [(step, text)] = texts[f"{prefix}foreshock/warning"]
    assert step == WARNED + offset
    assert f"attention-numerics warning at {layer} (step {WARNED}" in text

    # MLflow
    assert client.get_metric_history(run_id, loss)
    history = client.get_metric_history(run_id, "foreshock/attn.d2.entropy_mean/min")
    assert {m.step: m.value for m in history} == pytest.approx(d2)
    history = client.get_metric_history(run_id, "foreshock/warning/attention-numerics")
    assert [(m.step, m.value) for m in history] == [(WARNED + offset, 1.0)]
    tag = run.data.tags[f"foreshock.warning.{WARNED}.attention-numerics.{layer}"]
    assert f"attention-numerics warning at {layer} (step {WARNED}" in tag


@pytest.mark.slow
def test_huggingface_callback_writes_tensorboard_and_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """report_to=["tensorboard", "mlflow"]: the mechanism series and a warning (plumbing
    config) reach both local stores through the Trainer's own callbacks."""
    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from foreshock.integrations.huggingface import ForeshockCallback
    from foreshock.producers.sinks import ListSink

    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: opt in to the file store
    sink = ListSink()
    callback = ForeshockCallback(sink, run_id="hf", every=EVERY, warnings=plumbing_config())
    hf_train(tmp_path, callback, report_to=["tensorboard", "mlflow"])

    records = [r for r in sink.records if r.get("schema") == "foreshock.metrics/1"]
    scalars, texts = tensorboard_events(tmp_path / "hf-out")
    client, run = mlflow_run(uri)
    # the Trainer plots update s at step s + 1, its loss as "loss" (TensorBoard: train/loss)
    check_trackers(scalars, texts, client, run, records, "transformer.h.0.attn", 1, "loss")
    assert "train/loss" in scalars
    logits = [(r["step"] + 1, r["values"]["max_logit@transformer.h.0.attn"]) for r in records]
    assert dict(scalars["train/foreshock/max_logit/max"]) == pytest.approx(dict(logits), rel=1e-6)


def test_huggingface_trackers_skip_a_failing_one(caplog: pytest.LogCaptureFixture) -> None:
    """Only report_to callbacks get foreshock's scalars; one that raises is skipped (logged
    once) and the others still get theirs."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    from types import SimpleNamespace

    from transformers.integrations import TensorBoardCallback

    from foreshock.detectors.trackers import TrackerUpdate
    from foreshock.integrations.huggingface import ForeshockCallback

    class Down(TensorBoardCallback):
        def on_log(self, *args: Any, **kwargs: Any) -> None:
            raise OSError("tracker down")

    class Recording(TensorBoardCallback):
        def __init__(self) -> None:
            super().__init__()
            self.logs: list[dict] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            self.logs.append(dict(logs))

    class UserCallback(transformers.TrainerCallback):  # not a tracker: gets nothing
        def on_log(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("foreshock's scalars went to a user callback")

    recording = Recording()
    callback = ForeshockCallback("unused.jsonl")
    handler = SimpleNamespace(callbacks=[Down(), UserCallback(), recording])
    callback.attach(SimpleNamespace(callback_handler=handler))
    for step in (5, 10):
        callback._pending = TrackerUpdate(step, {"foreshock/max_logit/max": 3.0})
        callback._report(None, transformers.TrainerState(), None, {})
    assert recording.logs == [{"foreshock/max_logit/max": 3.0}] * 2
    failures = [r for r in caplog.records if "Down could not log" in r.message]
    assert len(failures) == 1


# ---- Lightning ---------------------------------------------------------------------------
def lightning_train(
    callback: Any = None, accumulate: int = 1, logger: Any = False
) -> tuple[list[float], dict]:
    """Fit the lab's tiny GPT-MoE (attention + routers); per-batch losses, final weights."""
    L = pytest.importorskip("lightning.pytorch")
    from foreshock.lab.model import GPT, GPTConfig

    class LitGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=4))
            self.losses: list[float] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            _, loss = self.model(batch[:, :-1], batch[:, 1:])
            self.losses.append(loss.item())
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    module = LitGPT()
    loader = torch.utils.data.DataLoader(
        Tokens(STEPS * BATCH * accumulate, SEQ + 1, 256), batch_size=BATCH, shuffle=False
    )
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=accumulate,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[callback] if callback is not None else None,
    )
    trainer.fit(module, loader)
    assert trainer.global_step == STEPS
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return module.losses, weights


def test_lightning_callback(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.producers.sinks import JsonlSink

    path = tmp_path / "pl.jsonl"
    callback = ForeshockLightningCallback(
        JsonlSink(path), run_id="pl-tiny", every=EVERY, labels={"project": "tests"}
    )
    losses, weights = lightning_train(callback)
    assert len(losses) == STEPS

    run = load_run(path)
    check_lifecycle(run, "pl-tiny", "lightning")
    assert run.labels["lightning"] and run.labels["trainer"]["max_steps"] == STEPS
    check_attention(run, "model.h.0.attn")
    check_symptoms(run, losses)
    for key in (
        "router.token_entropy_norm@model.h.0.mlp.gate",
        "router.load_entropy@model.h.0.mlp.gate",
        "router.epsilon@model.h.0.mlp.gate",
    ):
        steps, values = run.series(key)
        assert steps == MONITORED and all(finite(v) for v in values), (key, values)

    plain_losses, plain_weights = lightning_train()
    assert plain_losses == losses
    assert all(torch.equal(weights[k], plain_weights[k]) for k in weights)


def test_lightning_callback_with_gradient_accumulation(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.producers.sinks import ListSink

    sink = ListSink()
    losses, _ = lightning_train(ForeshockLightningCallback(sink, every=EVERY), accumulate=2)
    assert len(losses) == 2 * STEPS
    metrics = [r for r in sink.records if r.get("schema") == "foreshock.metrics/1"]
    assert [r["step"] for r in metrics] == MONITORED
    for record in metrics:  # the update's loss: the mean over its two micro-batches
        step = record["step"]
        mean = (losses[2 * step] + losses[2 * step + 1]) / 2
        assert record["values"]["loss"] == pytest.approx(mean, rel=1e-5)
        assert finite(record["values"]["grad_norm"])
    assert [r["kind"] for r in sink.records if "kind" in r] == ["start", "end"]


def test_lightning_callback_is_either_packages_callback() -> None:
    pytest.importorskip("lightning")
    from foreshock.integrations.lightning import ForeshockLightningCallback

    callback = ForeshockLightningCallback("unused.jsonl", every=EVERY)
    import lightning.pytorch

    assert isinstance(callback, lightning.pytorch.Callback)
    try:
        import pytorch_lightning
    except ImportError:
        return
    assert isinstance(callback, pytorch_lightning.Callback)


@pytest.mark.slow
def test_lightning_callback_writes_tensorboard_and_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoardLogger and MLFlowLogger: the mechanism series and a warning (plumbing
    config) reach both local stores through trainer.loggers, at Lightning's own steps."""
    pytest.importorskip("lightning")
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger

    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.producers.sinks import ListSink

    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: opt in to the file store
    loggers = [TensorBoardLogger(str(tmp_path / "tb")), MLFlowLogger("tests", tracking_uri=uri)]
    sink = ListSink()
    callback = ForeshockLightningCallback(sink, every=EVERY, warnings=plumbing_config())
    lightning_train(callback, logger=loggers)

    records = [r for r in sink.records if r.get("schema") == "foreshock.metrics/1"]
    scalars, texts = tensorboard_events(tmp_path / "tb")
    client, run = mlflow_run(uri)
    # Lightning plots update s at step s, next to what training_step logs ("train_loss")
    check_trackers(scalars, texts, client, run, records, "model.h.0.attn", 0, "train_loss")
    assert "train_loss" in scalars
    gate = "router.token_entropy_norm@model.h.0.mlp.gate"
    router = [(r["step"], r["values"][gate]) for r in records]
    tb = dict(scalars["foreshock/router.token_entropy_norm/min"])
    assert tb == pytest.approx(dict(router), rel=1e-6)
    history = client.get_metric_history(run.info.run_id, "foreshock/router.token_entropy_norm/min")
    assert {m.step: m.value for m in history} == pytest.approx(dict(router))


# ---- without the frameworks --------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("huggingface", ["transformers"], "hf"),
        ("lightning", ["lightning", "lightning.pytorch", "pytorch_lightning"], "lightning"),
    ],
)
def test_missing_framework_says_which_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, blocked: list[str], extra: str
) -> None:
    name = f"foreshock.integrations.{module}"
    monkeypatch.delitem(sys.modules, name, raising=False)
    for package in blocked:
        monkeypatch.setitem(sys.modules, package, None)  # import of it raises ImportError
    with pytest.raises(ImportError, match=rf"pip install 'foreshock\[{extra}\]'"):
        importlib.import_module(name)


def test_package_imports_without_torch_or_frameworks() -> None:
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'lightning', 'pytorch_lightning'):\n"
        "    sys.modules[name] = None\n"
        "import foreshock.integrations as integrations\n"
        "assert integrations.MonitoredRun\n"
        "try:\n"
        "    integrations.ForeshockCallback\n"
        "except ImportError as exc:\n"
        "    assert 'foreshock[hf]' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
