"""One rank of ``benchmarks.overhead --sharded``: train a sharded Llama, time ``Monitor.step()``.

``python -m torch.distributed.run --nproc-per-node W -m benchmarks._sharded_rank MODE OUT STEPS``
(or, for the single-process reference, ``python -m benchmarks._sharded_rank single OUT STEPS``).

MODE: ``single`` (one process, the model whole), ``fsdp2`` (``fully_shard`` per decoder layer,
then the root) or ``tp`` (DTensor tensor parallel: colwise q/k/v, rowwise o). Every rank trains
on its slice of the same global batches with plain SGD and a Monitor at δ = 1 (every step a
monitoring step; the default config otherwise), one thread per process. The first two steps
are warm-up (the first monitoring step only snapshots); the next STEPS are timed. Then one more,
untimed, monitoring step is watched for memory. Each rank writes ``OUT/rank-<r>.json``:

* ``monitor_s``: seconds in ``Monitor.step()`` per timed step (``time.perf_counter``);
* ``agree_s``, ``gather_s``, ``exchange_s``: the part of it inside ``Peers.schedule`` (the
  plans' all-gather; it also absorbs the ranks' different arrival times), ``Peers.materialize``
  (each layer's shards gathered to its owner: the transfer) and ``Peers.exchange`` (the
  gather of partial records to rank 0; on rank 0 it includes waiting for the slowest owner
  to finish);
* ``spectra_s``: the part inside ``attention_chunks`` (this rank's layers' snapshot copies and
  eigen-solves: what owner-computes divides among the ranks);
* ``bytes_per_step``: growth of ``Peers.bytes_received`` per timed step (gathered shards, and on
  rank 0 the peers' pickled partial records);
* ``snapshot_bytes``: the snapshots the monitor keeps between monitoring steps (its own layers'
  W_q, W_k in float32), counted by unique storage;
* ``heap_peak_delta_bytes``: the transient working set of the extra monitoring step: the most
  bytes malloc had handed out during it (glibc ``mallinfo2``, sampled every 0.5 ms by a
  thread) above the bytes in use on entering it. Torch's CPU tensors come from malloc, so a
  gathered layer counts even where it reuses freed pages (an RSS delta would not show it);
* ``rss_bytes``: the RSS after the run, for scale.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

WARM_UP = 2  # steps: the first monitoring step only snapshots, the second measures once
GLOBAL_BATCH = 4  # sequences per step, split over the data-parallel ranks
SEQ = 64  # tokens per sequence
VOCAB = 256
LLAMA = {  # the measurement: "4-layer Llama, d = 512"
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "num_hidden_layers": 4,
    "intermediate_size": 1376,
    "vocab_size": VOCAB,
}
PAGE = os.sysconf("SC_PAGE_SIZE")


def llama() -> torch.nn.Module:
    """The same initial weights on every rank (seeded), random: the cost is shape-bound."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        **LLAMA, max_position_embeddings=SEQ, attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def shard(model: torch.nn.Module, mode: str) -> tuple[int, int]:
    """Wrap ``model`` in place; (data-parallel rank, data-parallel size) of this rank."""
    import torch.distributed as dist

    if mode == "single":
        return 0, 1
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if mode == "tp":
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        plan = {f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"}
        plan["self_attn.o_proj"] = RowwiseParallel()
        for layer in model.model.layers:
            parallelize_module(layer, mesh, plan)
        return 0, 1  # every tensor-parallel rank sees the whole batch
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return dist.get_rank(), dist.get_world_size()


def batches(steps: int, dp_rank: int, dp_size: int) -> list[torch.Tensor]:
    """This rank's slice of each global batch: (GLOBAL_BATCH / dp_size, SEQ + 1) token ids."""
    gen = torch.Generator().manual_seed(7)
    per_rank = GLOBAL_BATCH // dp_size
    out = []
    for _ in range(steps):
        batch = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=gen)
        out.append(batch[dp_rank * per_rank : (dp_rank + 1) * per_rank])
    return out


def clock(obj: Any, method: str, seconds: dict[str, float], key: str) -> None:
    """Wrap ``obj.method`` so that the seconds spent inside it add up in ``seconds[key]``."""
    inner: Callable[..., Any] = getattr(obj, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start

    setattr(obj, method, timed)


def rss() -> int:
    """Resident set size of this process [bytes]."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
            *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
        )
    ]


def _heap_reader() -> Callable[[], int]:
    """Bytes malloc has handed out and not taken back (glibc ``mallinfo2``: ``uordblks`` +
    ``hblkhd``, the heap and the mmapped blocks): torch's CPU tensors come from malloc, so this
    counts them when allocated, whether or not freed pages are reused (RSS would not show
    those). Falls back to RSS where there is no ``mallinfo2`` (glibc < 2.33, not Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return rss
    mallinfo2.restype = _Mallinfo2

    def in_use() -> int:
        info = mallinfo2()
        return info.uordblks + info.hblkhd

    return in_use


heap_in_use = _heap_reader()


def peak_heap_during(work: Callable[[], object]) -> int:
    """Most bytes in use while ``work`` runs, above the bytes in use before it [bytes]; a
    thread samples ``heap_in_use`` every 0.5 ms, so a shorter-lived peak can be missed."""
    base, peak, done = heap_in_use(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], heap_in_use())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], heap_in_use()) - base


def snapshot_bytes(snapshots: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Bytes the snapshots hold, each storage once (a layer's snapshot views a stacked copy)."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for pair in snapshots.values()
        for t in pair
    }
    return sum(storages.values())


def instrument(monitor: Any) -> dict[str, float]:
    """Seconds spent in the monitor's parts, summed over its life (see the docstring)."""
    import foreshock.producers.monitor as monitor_module

    seconds = {"agree": 0.0, "gather": 0.0, "exchange": 0.0, "spectra": 0.0}
    clock(monitor_module, "attention_chunks", seconds, "spectra")
    if monitor.peers is not None:
        for method, key in (
            ("schedule", "agree"),
            ("materialize", "gather"),
            ("exchange", "exchange"),
        ):
            clock(monitor.peers, method, seconds, key)
    return seconds


def train(
    model: torch.nn.Module, monitor: Any, data: list[torch.Tensor], steps: int
) -> dict[str, Any]:
    """Warm up, time ``steps`` monitoring steps, then watch one more for memory."""
    seconds = instrument(monitor)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timed: dict[str, list[float]] = {k: [] for k in ("monitor", "train", "bytes", *seconds)}
    out: dict[str, Any] = {}
    for step, batch in enumerate(data):
        start = time.perf_counter()
        loss = model(input_ids=batch[:, :-1], labels=batch[:, 1:]).loss
        loss.backward()
        opt.step()
        trained = time.perf_counter()
        before = dict(seconds)
        received = received_bytes(monitor)
        if step == WARM_UP + steps:  # the extra, untimed step: memory only
            out["heap_peak_delta_bytes"] = peak_heap_during(
                lambda s=step, v=loss: monitor.step(s, v)
            )
        else:
            monitor.step(step, loss=loss)
        done = time.perf_counter()
        opt.zero_grad()
        if WARM_UP <= step < WARM_UP + steps:
            timed["train"].append(trained - start)
            timed["monitor"].append(done - trained)
            for key in seconds:
                timed[key].append(seconds[key] - before[key])
            timed["bytes"].append(received_bytes(monitor) - received)
    out |= {f"{k}_s": v for k, v in timed.items() if k != "bytes"}
    return out | {"bytes_per_step": timed["bytes"]}


def received_bytes(monitor: Any) -> int:
    return monitor.peers.bytes_received if monitor.peers is not None else 0


def main(mode: str, out_dir: Path, steps: int) -> None:
    import torch.distributed as dist

    from foreshock.producers import JsonlSink, Monitor, MonitorConfig

    torch.set_num_threads(1)
    distributed = mode != "single"
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank() if distributed else 0
    model = llama()
    dp_rank, dp_size = shard(model, mode)
    monitor = Monitor(
        model,
        JsonlSink(out_dir / f"records-{rank}.jsonl"),
        run_id=f"sharded-overhead-{mode}",
        config=MonitorConfig(every=1, spectra_worker=False),  # in the step, as every rank
    )
    timed = train(model, monitor, batches(WARM_UP + steps + 1, dp_rank, dp_size), steps)
    status = {
        "rank": rank,
        "world": dist.get_world_size() if distributed else 1,
        "mode": mode,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        **timed,
        "snapshot_bytes": snapshot_bytes(monitor._snapshots),
        "rss_bytes": rss(),
        "loadavg_end": os.getloadavg(),
        "records_written": monitor.records_written,
        "errors": monitor.errors,
        "owned_layers": sorted(monitor._snapshots),
    }
    monitor.close()
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(status))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
    # gloo can abort in C++ teardown after a clean destroy_process_group; the results are on
    # disk, so skip interpreter finalization (as tests/_sharded_worker.py does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
