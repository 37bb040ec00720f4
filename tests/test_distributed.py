"""The Monitor under torch.distributed: two gloo processes on CPU, a DDP-wrapped tiny GPT.

One pair of processes serves both tests: each rank trains one model with two monitors attached,
one with the default config (only rank 0 emits) and one with ``emit_ranks="all"``, each writing
to its own per-rank file. This file is also the worker:
``python tests/test_distributed.py RANK PORT OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

WORLD = 2
STEPS = 12
EVERY = 5
TIMEOUT_S = 120
EMIT_RANKS = ("zero", "all")


def worker(rank: int, port: int, out_dir: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from foreshock.lab.model import GPT, GPTConfig
    from foreshock.producers import JsonlSink, Monitor, MonitorConfig

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=30),
    )
    try:
        torch.manual_seed(0)  # same initial weights on both ranks (DDP broadcasts anyway)
        config = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, n_experts=4, top_k=2)
        model = DistributedDataParallel(GPT(config), find_unused_parameters=True)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        monitors = {
            emit: Monitor(
                model,
                JsonlSink(out_dir / emit / f"rank{rank}.jsonl"),
                run_id=f"dist-{emit}",
                config=MonitorConfig(every=EVERY, emit_ranks=emit),
            )
            for emit in EMIT_RANKS
        }
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        returned = {emit: [] for emit in EMIT_RANKS}
        for step in range(STEPS):
            x = torch.randint(0, 256, (2, 17), generator=gen)
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            for emit, monitor in monitors.items():
                returned[emit].append(monitor.step(step, loss=loss) is not None)
            opt.zero_grad()
        status = {}
        for emit, monitor in monitors.items():
            monitor.close()
            status[emit] = {
                "active": monitor.active,
                "monitor_rank": monitor.rank,
                "world_size": monitor.world_size,
                "records_written": monitor.records_written,
                "errors": monitor.errors,
                "returned": returned[emit],
                "routers": [r.name for r in monitor.discovery.routers],
            }
        (out_dir / f"status{rank}.json").write_text(json.dumps(status))
        dist.barrier()  # no rank tears gloo down while its peer still talks to it
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Run the two ranks once; (output folder, each rank's status)."""
    out_dir = tmp_path_factory.mktemp("distributed")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(rank), str(port), str(out_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{output[-3000:]}"
    return out_dir, [
        json.loads((out_dir / f"status{rank}.json").read_text()) for rank in range(WORLD)
    ]


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if r.get("kind") not in ("start", "end")]  # the run's bounds


MONITORED = [step % EVERY == 0 for step in range(STEPS)]


@pytest.mark.slow
def test_only_rank_zero_emits_by_default(run: tuple[Path, list[dict]]) -> None:
    out_dir, statuses = run
    status = [s["zero"] for s in statuses]
    assert [s["active"] for s in status] == [True, False]
    assert [(s["monitor_rank"], s["world_size"]) for s in status] == [(0, 2), (1, 2)]
    assert [s["errors"] for s in status] == [0, 0]
    assert status[0]["returned"] == MONITORED and status[1]["returned"] == [False] * STEPS
    assert status[0]["routers"] == ["h.0.mlp.gate", "h.1.mlp.gate"]  # as unwrapped

    records = read_records(out_dir / "zero" / "rank0.jsonl")
    assert [r["step"] for r in records] == [0, 5, 10]
    assert all((r["rank"], r["world_size"]) == (0, 2) for r in records)
    assert "attn.d2.entropy_mean@h.0.attn" in records[1]["values"]
    assert read_records(out_dir / "zero" / "rank1.jsonl") == []


@pytest.mark.slow
def test_all_ranks_emit_labelled(run: tuple[Path, list[dict]]) -> None:
    out_dir, statuses = run
    status = [s["all"] for s in statuses]
    assert [s["active"] for s in status] == [True, True]
    assert [s["records_written"] for s in status] == [3, 3]
    assert [s["errors"] for s in status] == [0, 0]

    per_rank = [read_records(out_dir / "all" / f"rank{rank}.jsonl") for rank in range(WORLD)]
    for rank, records in enumerate(per_rank):
        assert [r["step"] for r in records] == [0, 5, 10]
        assert all(r["rank"] == rank and r["world_size"] == WORLD for r in records)
        assert all(r["flags"] == [] and r["run_id"] == "dist-all" for r in records)
    # Different data per rank: different losses. DDP keeps the weights in sync: the same
    # attention spectra on both ranks.
    last0, last1 = per_rank[0][-1]["values"], per_rank[1][-1]["values"]
    assert last0["loss"] != last1["loss"]
    attn = [k for k in last0 if k.startswith("attn.")]
    assert attn and all(last0[k] == pytest.approx(last1[k], rel=1e-5, abs=1e-7) for k in attn)
    assert last0["weight_norm"] == pytest.approx(last1["weight_norm"], rel=1e-6)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
    # torch 2.13's gloo can abort in C++ teardown after a clean destroy_process_group
    # ("terminate called without an active exception", no Python frame; ~1 exit in 10 here).
    # The worker's work is done and on disk, so skip interpreter finalization.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
