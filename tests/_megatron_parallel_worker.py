"""One rank of a Megatron-core GPT-MoE trained with a Monitor attached, run under ``torchrun``.

``python -m torch.distributed.run --nproc-per-node 2 tests/_megatron_parallel_worker.py MODE OUT``

MODE: ``single`` (one process, TP = EP = 1, the reference; ``--nproc-per-node 1``), ``tp``
(tensor parallel 2: each rank holds half of every ``linear_qkv``, the same tokens) or ``ep``
(expert parallel 2, TP = 1: each rank holds 2 of the 4 experts and routes its own half of the
global batch). Every mode starts from the single process's weights (each rank takes its
partition and its experts of a TP = EP = 1 model built first) and trains on the same global
batches with SGD, so it follows the single process's trajectory up to float round-off. Each
rank writes its records to ``OUT/records-<rank>.jsonl`` and ``OUT/status-<rank>.json``.

The CUDA shims are the test's (``tests/test_megatron.py``), never the product's.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

STEPS, EVERY, GLOBAL_BATCH, SEQ, VOCAB = 7, 3, 4, 8, 64
QK_NORMS = ("q_layernorm.weight", "k_layernorm.weight")
SIZES = {"single": (1, 1), "tp": (2, 1), "ep": (1, 2)}  # (tensor parallel, expert parallel)


def torch_norms_under_sequence_parallel(mp: pytest.MonkeyPatch) -> None:
    """Megatron's own norms (Transformer Engine, apex) run under sequence parallelism and mark
    their parameters ``sequence_parallel`` (their gradients are summed over the tensor-
    parallel group); the torch norms of the local spec refuse it. The same marking, here."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    build = WrappedTorchNorm.__new__

    def marked(cls: type, config: object, *args: object, **kwargs: object) -> torch.nn.Module:
        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = build(cls, plain, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm

    mp.setattr(WrappedTorchNorm, "__new__", staticmethod(marked))


def megatron_groups(tp: int, ep: int) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep)
    model_parallel_cuda_manual_seed(0)


def reference_weights() -> dict[str, torch.Tensor]:
    """The TP = EP = 1 model's weights, by name: what every mode starts from."""
    from test_megatron import build_gpt_moe

    megatron_groups(1, 1)
    return {k: v.detach().clone() for k, v in build_gpt_moe().named_parameters()}


def _whole_name(name: str, local_experts: int, ep_rank: int) -> str:
    """``...local_experts.<i>...`` → the global expert ep_rank · local_experts + i."""
    head, sep, tail = name.partition("local_experts.")
    if not sep:
        return name
    index, rest = tail.split(".", 1)
    return f"{head}{sep}{ep_rank * local_experts + int(index)}.{rest}"


def load_partitions(model: torch.nn.Module, whole: dict[str, torch.Tensor], ep: int) -> None:
    """Each parameter set to its partition (``partition_dim``, this rank's TP or expert-TP
    rank) of the whole weight, experts renumbered to their global index."""
    from megatron.core import parallel_state as ps

    local_experts = 4 // ep
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = whole[_whole_name(name, local_experts, ps.get_expert_model_parallel_rank())]
            if getattr(param, "tensor_model_parallel", False):
                expert = getattr(param, "allreduce", True) is False
                rank = (
                    ps.get_expert_tensor_parallel_rank()
                    if expert
                    else ps.get_tensor_model_parallel_rank()
                )
                parts = full.shape[param.partition_dim] // param.shape[param.partition_dim]
                full = full.chunk(parts, dim=param.partition_dim)[rank]
            assert full.shape == param.shape, name
            param.copy_(full)


def reduce_grads(model: torch.nn.Module) -> None:
    """The gradient reductions of Megatron's DDP and ``finalize_model_grads``. Over the
    tensor-parallel group: summed for a parameter that each rank sees only part of the
    tokens or heads of (``sequence_parallel`` norms, the per-head QK-norms), averaged where
    Megatron says so. Over data parallel: a dense gradient summed over the data-parallel
    group, an expert's own over the expert data-parallel group, both divided by the
    data-parallel size (each rank's loss is its micro-batch's mean)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    dp, tp_group = ps.get_data_parallel_world_size(), ps.get_tensor_model_parallel_group()
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        if tp_group.size() > 1 and getattr(param, "average_gradients_across_tp_domain", False):
            dist.all_reduce(param.grad, group=tp_group)
            param.grad.div_(tp_group.size())
        elif tp_group.size() > 1 and (
            getattr(param, "sequence_parallel", False) or name.endswith(QK_NORMS)
        ):
            dist.all_reduce(param.grad, group=tp_group)
        expert = getattr(param, "allreduce", True) is False
        group = ps.get_expert_data_parallel_group() if expert else ps.get_data_parallel_group()
        dist.all_reduce(param.grad, group=group)
        param.grad.div_(dp)


def batches(dp_rank: int, dp_size: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    per_rank = GLOBAL_BATCH // dp_size
    out = []
    for _ in range(STEPS):
        batch = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=gen)
        out.append(batch[dp_rank * per_rank : (dp_rank + 1) * per_rank])
    return out


def train(mode: str, out_dir: Path) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from test_megatron import build_gpt_moe

    from foreshock.producers import JsonlSink, Monitor, MonitorConfig

    tp, ep = SIZES[mode]
    whole = reference_weights()
    megatron_groups(tp, ep)
    model = build_gpt_moe(
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        sequence_parallel=tp > 1,  # Megatron trains MoE under TP only with it
    )
    load_partitions(model, whole, ep)
    rank = dist.get_rank()
    monitor = Monitor(
        model,
        JsonlSink(out_dir / f"records-{rank}.jsonl"),
        run_id=f"megatron-{mode}",
        config=MonitorConfig(every=EVERY),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    causal = torch.triu(torch.ones(SEQ, SEQ), 1).bool()[None, None]  # True: masked
    positions = torch.arange(SEQ)[None]
    model.train()
    losses = []
    dp_batches = batches(ps.get_data_parallel_rank(), ps.get_data_parallel_world_size())
    for step, batch in enumerate(dp_batches):
        ids = batch[:, :-1]
        loss = model(ids, positions.expand_as(ids), causal, labels=batch[:, 1:]).mean()
        loss.backward()
        reduce_grads(model)
        opt.step()
        monitor.step(step, loss=loss)
        opt.zero_grad()
        losses.append(float(loss.detach()))
    monitor.close()
    status = {
        "rank": rank,
        "losses": losses,
        "errors": monitor.errors,
        "records_written": monitor.records_written,
        "describe": monitor.describe(),
        "skipped": monitor.discovery.skipped,
    }
    (out_dir / f"status-{rank}.json").write_text(json.dumps(status))


def main(mode: str, out_dir: Path) -> None:
    import torch.distributed as dist
    from test_megatron import cpu_shims

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    with pytest.MonkeyPatch.context() as mp:
        cpu_shims(mp)
        torch_norms_under_sequence_parallel(mp)
        train(mode, out_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    # gloo can abort in C++ teardown after a clean destroy_process_group; the work is on
    # disk, so skip interpreter finalization (as tests/_sharded_worker.py does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
