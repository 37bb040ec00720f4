"""One rank of a trainer-driven sharded job with foreshock's callback, run under ``torchrun``.

``python -m torch.distributed.run --nproc-per-node 2 tests/_sharded_integration_worker.py
MODE OUT_DIR`` (``single`` modes run as one plain process, the reference).

MODE: ``hf_single`` / ``hf_fsdp2`` (a transformers ``Trainer``; FSDP2 through accelerate's
plugin, from ``TrainingArguments(fsdp=..., fsdp_config={"version": 2})``), ``pl_single`` /
``pl_fsdp`` (Lightning's ``FSDPStrategy``: FSDP1, flat parameters) / ``pl_model_parallel``
(Lightning's ``ModelParallelStrategy``, FSDP2 ``fully_shard`` in ``configure_model``). The
callbacks are used exactly as docs/monitoring.md shows. Every run trains the tiny Mixtral of
``_sharded_worker`` with SGD on the same global batches (the sharded runs take half of each
per rank), so the sharded records can be compared with the single process's. Rank 0 writes
its records to ``OUT_DIR/records.jsonl``; every rank writes ``OUT_DIR/status-<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _sharded_worker import SEQ, VOCAB, tiny_mixtral

torch.set_num_threads(1)

STEPS = 7
EVERY = 3
GLOBAL_BATCH = 4
LR = 0.5


def samples() -> list[torch.Tensor]:
    """STEPS × GLOBAL_BATCH token rows, the same in every mode."""
    gen = torch.Generator().manual_seed(7)
    return list(torch.randint(1, VOCAB, (STEPS * GLOBAL_BATCH, SEQ), generator=gen))


class Rows(torch.utils.data.Dataset):
    """Causal-LM rows; ``labels`` = ``input_ids`` (the model shifts them)."""

    def __init__(self) -> None:
        self.rows = samples()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_hf(mode: str, out_dir: Path) -> dict:
    from transformers import Trainer, TrainingArguments

    from foreshock.integrations.huggingface import ForeshockCallback

    sharded = mode == "hf_fsdp2"
    args = TrainingArguments(
        output_dir=str(out_dir / "hf"),
        per_device_train_batch_size=GLOBAL_BATCH // world(),
        max_steps=STEPS,
        learning_rate=LR,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        seed=0,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        fsdp=sharded,
        fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["MixtralDecoderLayer"]}
        if sharded
        else None,
    )
    callback = ForeshockCallback(out_dir / "records.jsonl", run_id=f"int-{mode}", every=EVERY)
    trainer = Trainer(
        model=tiny_mixtral(),
        args=args,
        train_dataset=Rows(),
        callbacks=[callback],
    )
    if sharded:
        force_fsdp_on_cpu(trainer)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"losses": losses, **_monitor_status(callback.monitor), **_wrapping(trainer.model)}


def force_fsdp_on_cpu(trainer: object) -> None:
    """Turn accelerate's FSDP plugin on for a CPU (gloo) job: accelerate keeps the plugin
    only for accelerator device types (``MULTI_GPU``, ...) and silently falls back to DDP on
    ``MULTI_CPU``; ``fully_shard`` itself runs on CPU."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    state.distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


def _wrapping(model: torch.nn.Module) -> dict:
    """How the trainer wrapped the model: proof that the job really was sharded."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from foreshock.producers.sharding import is_dtensor

    return {
        "dtensor_parameters": sum(is_dtensor(p) for p in model.parameters()),
        "fsdp1_modules": sum(isinstance(m, FullyShardedDataParallel) for m in model.modules()),
    }


def _monitor_status(monitor: object) -> dict:
    if monitor is None:
        return {"monitor": None}
    return {
        "errors": monitor.errors,
        "records_written": monitor.records_written,
        "describe": monitor.describe(),
    }


def run_lightning(mode: str, out_dir: Path) -> dict:
    import lightning.pytorch as pl

    from foreshock.integrations.lightning import ForeshockLightningCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_mixtral()
            self.losses: list[float] = []

        def configure_model(self) -> None:
            if mode != "pl_model_parallel":
                return
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.model, mesh=mesh)

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=LR)

    strategy: object = "auto"
    if mode == "pl_fsdp":
        from lightning.pytorch.strategies import FSDPStrategy
        from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

        class CpuFSDPStrategy(FSDPStrategy):
            """Lightning refuses ``FSDPStrategy`` on CPU (by its exact type) and hands FSDP1
            ``device_id=None`` there, which FSDP1 refuses without an accelerator; with
            ``device_id=cpu`` FSDP1 runs on CPU with gloo. Wrapped here, the strategy's own
            ``_setup_model`` sees a wrapped model and keeps it."""

            def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
                from torch.distributed.fsdp import FullyShardedDataParallel

                wrapped = FullyShardedDataParallel(
                    module=model,
                    sharding_strategy=self.sharding_strategy,
                    device_id=torch.device("cpu"),
                    **self.kwargs,
                )
                return super()._setup_model(wrapped)

        strategy = CpuFSDPStrategy(auto_wrap_policy={MixtralDecoderLayer})
    elif mode == "pl_model_parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=world(), tensor_parallel_size=1)
    sampler = torch.utils.data.DistributedSampler(
        Rows(), num_replicas=world(), rank=int(os.environ.get("RANK", "0")), shuffle=False
    )
    loader = torch.utils.data.DataLoader(
        Rows(), batch_size=GLOBAL_BATCH // world(), sampler=sampler
    )
    module = Module()
    callback = ForeshockLightningCallback(
        out_dir / "records.jsonl", run_id=f"int-{mode}", every=EVERY
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world(),
        strategy=strategy,
        max_steps=STEPS,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, loader)
    status = {"losses": module.losses, **_monitor_status(callback.monitor)}
    return {**status, **_wrapping(trainer.model)}


def main(mode: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:  # only rank 0 writes (the default); keep the others' sinks apart anyway
        out_dir = out_dir / f"rank{rank}"
        out_dir.mkdir(exist_ok=True)
    status = run_hf(mode, out_dir) if mode.startswith("hf_") else run_lightning(mode, out_dir)
    (out_dir.parent if rank else out_dir).joinpath(f"status-{rank}.json").write_text(
        json.dumps({"rank": rank, **status})
    )
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    sys.stdout.flush()  # gloo can abort in C++ teardown after a clean destroy: skip finalization
    sys.stderr.flush()
    os._exit(0)
