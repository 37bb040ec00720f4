"""Remediation under torch.distributed: rank 0 decides, every rank applies the same actions at
the same step boundary (``foreshock.remediation.ranks``), under ``torchrun`` with the gloo
backend on CPU.

Two ranks train the lab's tiny GPT sharded by FSDP2 (``fully_shard``), each on its own data,
with a plain loop's runner (``Remediation.for_monitor``) on every rank. The warning opens on
rank 0 alone (its detectors read the job's records, with ``test_integrations``' plumbing
config: at record step 15); the policy rolls back and holds the learning rate at the boundary
before step 16, and a person's approved ``stop`` reaches rank 0's sink between monitoring
steps and waits for the next monitoring boundary (21). Each rank writes what it did: the
learning rate of every update, a digest of its local shards (and optimizer state) before
every step, the steps it trained, its actions. The test compares the ranks.

This file is also the worker:
``python -m torch.distributed.run --nproc-per-node 2 tests/test_remedy_distributed.py OUT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)

WORLD, STEPS, EVERY = 2, 30, 5
ACTED, STOPPED = 16, 21  # the boundary after the warned record (15); the next one after it
LAUNCH_TIMEOUT_S = 120
STOP = {
    "request_id": "req-stop",
    "run_id": "dist-remedy",
    "warning_id": "w-any",
    "family": "attention-numerics",
    "action": "stop",
}


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """This rank's local shards of the parameters and of the optimizer's state, bit for bit."""
    blake = hashlib.blake2b(digest_size=12)
    tensors = [p for p in model.parameters()]
    tensors += [t for s in optimizer.state.values() for t in s.values() if t.dim() > 0]
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        blake.update(local.detach().contiguous().numpy().tobytes())
    return blake.hexdigest()


class RequestingSink:
    """A JSON Lines sink whose ``poll_requests`` (rank 0's) hands over a stop request from its
    5th poll on: the request is there since step 16, polled at the next monitoring boundary."""

    def __init__(self, path: Path) -> None:
        from foreshock.producers.sinks import JsonlSink

        self.sink, self.polls = JsonlSink(path), 0

    def write(self, record: dict[str, Any]) -> None:
        self.sink.write(record)

    def close(self) -> None:
        self.sink.close()

    def poll_requests(self) -> list[dict[str, Any]]:
        self.polls += 1
        return [dict(STOP)] if self.polls >= 5 else []


def worker(out_dir: Path) -> None:
    import torch.distributed as dist
    from test_integrations import BATCH, SEQ, Tokens, plumbing_config
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from foreshock.lab.model import GPT, GPTConfig
    from foreshock.producers.monitor import Monitor, MonitorConfig
    from foreshock.remediation.remedy import RemedyPolicy
    from foreshock.remediation.runner import Remediation

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=0))
        mesh = init_device_mesh("cpu", (WORLD,))
        for block in model.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ramp = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 + s / 10)
        sink = RequestingSink(out_dir / f"records-{rank}.jsonl")
        config = MonitorConfig(every=EVERY, join_timeout_s=30.0)
        monitor = Monitor(model, sink, run_id="dist-remedy", config=config)
        policy = RemedyPolicy(actions={"attention-numerics": "hold-lr"}, rollback=True)
        remediation = Remediation.for_monitor(
            policy, monitor, optimizer, ramp, warnings=plumbing_config(), snapshot_every=EVERY
        )
        assert remediation is not None and remediation.ranks is not None
        data = Tokens(STEPS * BATCH, SEQ + 1, 256, seed=1 + rank).ids.split(BATCH)
        lrs, digests, trained = [], {}, 0
        for step, batch in enumerate(data):
            remediation.before_step(step)
            digests[step] = digest(model, optimizer)
            lrs.append(optimizer.param_groups[0]["lr"])
            loss = model(batch[:, :-1], batch[:, 1:])[1]
            loss.backward()
            optimizer.step()
            ramp.step()
            optimizer.zero_grad()
            trained += 1
            if remediation.after_step(step, monitor.step(step, loss=loss.detach())):
                break
        remediation.close()
        monitor.close()
        status = {
            "rank": rank,
            "trained": trained,
            "lrs": lrs,
            "digests": digests,
            "actions": [a.to_message() for a in remediation.actions],
            "shared": remediation.ranks.shared,
            "polls": sink.polls,
            "errors": remediation.errors,
            "monitor_errors": monitor.errors,
            "writes": remediation.write is not None,
            "dtensors": sum(hasattr(p, "to_local") for p in model.parameters()),
        }
        (out_dir / f"status-{rank}.json").write_text(json.dumps(status))
        dist.barrier()  # no rank tears gloo down while its peer still talks to it
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out_dir: Path) -> list[dict[str, Any]]:
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    tests = str(Path(__file__).parent)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, environ.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={WORLD}",
        f"--master-port={free_port()}",
        __file__,
        str(out_dir),
    ]
    done = subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, f"failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [json.loads((out_dir / f"status-{r}.json").read_text()) for r in range(WORLD)]


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_every_rank_applies_rank_zeros_actions_at_the_same_step(tmp_path: Path) -> None:
    zero, one = launch(tmp_path)
    assert zero["dtensors"] > 0 and one["dtensors"] > 0  # really sharded by FSDP2

    # the same actions, at the same boundaries, on both ranks
    kinds = [(a["kind"], a["step"], a["source"], a["applied"]) for a in zero["actions"]]
    assert kinds == [("hold-lr", ACTED, "policy", True), ("stop", STOPPED, "approved", True)]
    assert one["actions"] == zero["actions"]
    assert zero["trained"] == one["trained"] == STOPPED  # both stopped after update 20
    assert zero["shared"] == one["shared"] == 5  # boundaries 1, 6, 11, 16, 21: no other
    assert zero["polls"] == 5 and one["polls"] == 0  # rank 0 alone polls, at those only
    assert zero["errors"] == one["errors"] == 0
    assert zero["monitor_errors"] == one["monitor_errors"] == 0

    # the rollback: each rank's own shards and optimizer state back at the same snapshot
    back = zero["actions"][0]["rolled_back_to"]
    assert back is not None and back < 15 and back % EVERY == 0
    for rank in (zero, one):
        assert rank["digests"][str(ACTED)] == rank["digests"][str(back)]
        assert rank["digests"][str(ACTED)] != rank["digests"][str(ACTED - 1)]
    assert zero["digests"][str(back)] != one["digests"][str(back)]  # shards of their own

    # the learning rate held on both ranks: half the rate before the ramp the evidence caught
    # began (this schedule ramps from step 0), not below the floor (0.1 × the rate at since)
    scheduled = [1e-3 * (1.0 + s / 10) for s in range(ACTED)]
    since = zero["actions"][0]["detail"]["since"]
    assert back <= since < ACTED
    held = max(0.5 * 1e-3, 0.1 * 1e-3 * (1.0 + since / 10))
    for rank in (zero, one):
        assert rank["lrs"][:ACTED] == pytest.approx(scheduled, rel=1e-12)
        assert rank["lrs"][ACTED:] == pytest.approx([held] * (STOPPED - ACTED), rel=1e-12)

    # rank 0 alone wrote the action records
    assert (zero["writes"], one["writes"]) == (True, False)
    written = [r for r in lines(tmp_path / "records-0.jsonl") if r.get("kind") == "action"]
    assert [(r["action"], r["step"], r["rank"]) for r in written] == [
        ("hold-lr", ACTED, 0),
        ("stop", STOPPED, 0),
    ]
    assert written[1]["request_id"] == "req-stop"
    assert not [r for r in lines(tmp_path / "records-1.jsonl") if r.get("kind") == "action"]


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
    # torch's gloo can abort in C++ teardown after a clean destroy_process_group; the work is
    # on disk, so skip interpreter finalization (as tests/test_distributed.py does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
