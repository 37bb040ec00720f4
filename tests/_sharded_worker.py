"""Ranks of sharded training jobs with a Monitor attached, run under ``torchrun``.

``python -m torch.distributed.run --nproc-per-node W tests/_sharded_worker.py JOBS OUT_DIR``

JOBS is a comma-separated list of ``MODE[:VARIANT]``, trained one after the other in one
process group (a launch costs more than a job: one launch serves many tests). MODE is how the
tiny transformers Mixtral is sharded: ``single`` (one process, the reference), ``ddp``,
``fsdp2`` (``fully_shard``), ``tp`` (DTensor tensor parallel: colwise q/k/v, rowwise o),
``fsdp2_tp`` (a 2-D mesh, FSDP2 over TP; 4 ranks) or ``hsdp`` (FSDP2 with a replicate
dimension; 4 ranks). Every job trains on the same global batches: a data-parallel rank takes
its slice of each batch, so every parallelism follows the single process's trajectory up to
float round-off. Each rank writes its records to ``OUT_DIR/<job>/records-<rank>.jsonl`` and a
status line to ``OUT_DIR/<job>/status-<rank>.json`` (``<job>`` with ``:`` as ``-``).

VARIANT: ``fail_compute`` makes rank 1's attention measurement raise after the gathers,
``fail_read`` its reading of the specs (before any gather), ``fail_read_later`` the same from
the second monitoring step on (after the ranks agreed a plan), to show that one rank's error
never stops the job; ``per_rank`` writes per-rank records; ``before_wrap`` builds the Monitor
on the model before it is sharded; ``rank_zero_only`` builds one on rank 0 alone (with a 2 s
join timeout). It must come last: the n-th Monitor of a process joins the n-th group key, and
rank 1 builds none.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch

torch.set_num_threads(1)

STEPS = 7
EVERY = 3
GLOBAL_BATCH = 4
SEQ = 12
VOCAB = 64


def tiny_mixtral() -> torch.nn.Module:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)  # the same initial weights on every rank and in every mode
    return transformers.MixtralForCausalLM(config)


def mesh_shape(mode: str, world: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if mode == "fsdp2_tp":
        return (world // 2, 2), ("dp", "tp")
    if mode == "hsdp":
        return (world // 2, 2), ("replicate", "shard")
    return (world,), ("dp" if mode != "tp" else "tp",)


def shard(model: torch.nn.Module, mode: str, world: int) -> tuple[torch.nn.Module, int, int]:
    """The wrapped model, and (data-parallel rank, data-parallel size) of this rank."""
    import torch.distributed as dist

    if mode == "single":
        return model, 0, 1
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), dist.get_rank(), world
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    shape, names = mesh_shape(mode, world)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    if mode in ("tp", "fsdp2_tp"):
        tensor_parallel(model, mesh["tp"])
    if mode == "tp":
        return model, 0, 1
    dp_mesh = mesh if mode == "hsdp" else mesh["dp"]
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    dp_rank = dist.get_rank() // 2 if mode == "fsdp2_tp" else dist.get_rank()
    return model, dp_rank, (world // 2 if mode == "fsdp2_tp" else world)


def tensor_parallel(model: torch.nn.Module, tp_mesh: object) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def batches(dp_rank: int, dp_size: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        batch = torch.randint(1, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=gen)
        per_rank = GLOBAL_BATCH // dp_size
        out.append(batch[dp_rank * per_rank : (dp_rank + 1) * per_rank])
    return out


def main(jobs: str, out_dir: Path) -> None:
    import torch.distributed as dist

    distributed = not jobs.startswith("single")
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    for job in jobs.split(","):
        mode, _, variant = job.partition(":")
        folder = out_dir / job.replace(":", "-")
        folder.mkdir(parents=True, exist_ok=True)
        run_job(mode, variant, folder, distributed)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def run_job(mode: str, variant: str, out_dir: Path, distributed: bool) -> None:
    """Train one job; write its records and ``status-<rank>.json`` to ``out_dir``."""
    import torch.distributed as dist

    import foreshock.producers.monitor as monitor_module
    from foreshock.producers import JsonlSink, Monitor, MonitorConfig

    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    model = tiny_mixtral()

    def attach() -> Monitor:
        return Monitor(
            model,
            JsonlSink(out_dir / f"records-{rank}.jsonl"),
            run_id=f"sharded-{mode}",
            config=MonitorConfig(
                every=EVERY,
                emit_ranks="all" if variant == "per_rank" else "zero",
                join_timeout_s=2.0 if variant == "rank_zero_only" else 60.0,
            ),
        )

    alone = variant == "rank_zero_only"  # the others build none
    early = attach() if variant == "before_wrap" else None
    model, dp_rank, dp_size = shard(model, mode, world)
    monitor = None if alone and rank != 0 else early or attach()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # Adam would amplify round-off drift
    if monitor is not None:
        monitor.watch_sdpa()  # max_logit@<layer>: each rank sees its own heads and tokens
    real_chunks = monitor_module.attention_chunks
    if variant.startswith("fail_") and rank == 1:

        def fail(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"forced failure on rank {rank}")

        if variant == "fail_read":  # before any gather
            monitor._current_specs = fail
        elif variant == "fail_read_later":  # once the ranks have agreed a plan
            read_specs, calls = monitor._current_specs, iter(range(10**6))

            def fail_after_first(*args: object, **kwargs: object) -> object:
                return read_specs(*args, **kwargs) if next(calls) == 0 else fail()

            monitor._current_specs = fail_after_first
        else:  # after the gathers, in this rank's own computation
            monitor_module.attention_chunks = fail
    losses = []
    try:
        for step, batch in enumerate(batches(dp_rank, dp_size)):
            out = model(input_ids=batch[:, :-1], labels=batch[:, 1:])
            out.loss.backward()
            opt.step()
            if monitor is not None:
                monitor.step(step, loss=out.loss)
            opt.zero_grad()
            losses.append(float(out.loss.detach()))
    finally:
        monitor_module.attention_chunks = real_chunks
    status = {"rank": rank, "losses": losses, "records_written": 0, "describe": {}}
    if monitor is not None:
        monitor.close()
        status |= {
            "errors": monitor.errors,
            "records_written": monitor.records_written,
            "describe": monitor.describe(),
        }
    (out_dir / f"status-{rank}.json").write_text(json.dumps(status))
    if distributed:
        dist.barrier()  # the next job starts together


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    # torch's gloo can abort in C++ teardown after a clean destroy_process_group; the work is
    # on disk, so skip interpreter finalization (as tests/test_distributed.py does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
