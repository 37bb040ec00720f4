"""One rank of a sharded training job with a Monitor attached, run under ``torchrun``.

``python -m torch.distributed.run --nproc-per-node W tests/_sharded_worker.py MODE OUT_DIR``

MODE is how the tiny transformers Mixtral is sharded: ``single`` (one process, the reference),
``ddp``, ``fsdp2`` (``fully_shard``), ``tp`` (DTensor tensor parallel: colwise q/k/v, rowwise
o), ``fsdp2_tp`` (a 2-D mesh, FSDP2 over TP; 4 ranks) or ``hsdp`` (FSDP2 with a replicate
dimension; 4 ranks). Every run trains on the same global batches: a data-parallel rank takes
its slice of each batch, so every parallelism follows the single process's trajectory up to
float round-off. Each rank writes its records to ``OUT_DIR/records-<rank>.jsonl`` and a
status line to ``OUT_DIR/status-<rank>.json``. ``FORESHOCK_TEST_FAIL_RANK=r`` makes rank r's
attention measurement raise (``FORESHOCK_TEST_FAIL_AT=read``: its reading of the specs, before
any gather), to show that one rank's error never stops the job;
``EMIT_RANKS=all`` writes per-rank records; ``MONITOR_BEFORE_WRAP=1`` builds the Monitor on
the model before it is sharded; ``MONITOR_ON_RANK_ZERO_ONLY=1`` builds one on rank 0 alone.
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


def main(mode: str, out_dir: Path) -> None:
    import torch.distributed as dist

    from foreshock.producers import JsonlSink, Monitor, MonitorConfig

    distributed = mode != "single"
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    model = tiny_mixtral()

    join_timeout_s = float(os.environ.get("JOIN_TIMEOUT_S", "60"))

    def attach() -> Monitor:
        emit = os.environ.get("EMIT_RANKS", "zero")
        return Monitor(
            model,
            JsonlSink(out_dir / f"records-{rank}.jsonl"),
            run_id=f"sharded-{mode}",
            config=MonitorConfig(every=EVERY, emit_ranks=emit, join_timeout_s=join_timeout_s),
        )

    alone = os.environ.get("MONITOR_ON_RANK_ZERO_ONLY") == "1"  # the others build none
    early = attach() if os.environ.get("MONITOR_BEFORE_WRAP") == "1" else None
    model, dp_rank, dp_size = shard(model, mode, world)
    monitor = None if alone and rank != 0 else early or attach()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # Adam would amplify round-off drift
    if monitor is not None:
        monitor.watch_sdpa()  # max_logit@<layer>: each rank sees its own heads and tokens
    if os.environ.get("FORESHOCK_TEST_FAIL_RANK") == str(rank):
        import foreshock.producers.monitor as monitor_module

        def fail(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"forced failure on rank {rank}")

        if os.environ.get("FORESHOCK_TEST_FAIL_AT") == "read":  # before any gather
            monitor._current_specs = fail
        else:  # after the gathers, in this rank's own computation
            monitor_module.attention_chunks = fail
    losses = []
    for step, batch in enumerate(batches(dp_rank, dp_size)):
        out = model(input_ids=batch[:, :-1], labels=batch[:, 1:])
        out.loss.backward()
        opt.step()
        if monitor is not None:
            monitor.step(step, loss=out.loss)
        opt.zero_grad()
        losses.append(float(out.loss.detach()))
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
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    # torch's gloo can abort in C++ teardown after a clean destroy_process_group; the work is
    # on disk, so skip interpreter finalization (as tests/test_distributed.py does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
