"""The Monitor inside sharded training, under ``torchrun`` with the gloo backend on CPU.

Each parallelism trains the same tiny transformers Mixtral on the same global batches
(``tests/_sharded_worker.py``): the job must finish on every rank, whatever foreshock meets.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

WORKER = Path(__file__).with_name("_sharded_worker.py")
LAUNCH_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, ranks: int, out_dir: Path, **env: str) -> list[dict]:
    """Run the worker under torchrun; each rank's status (the job must exit 0)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    command = [sys.executable, str(WORKER), mode, str(out_dir)]
    if mode != "single":
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            f"--master-port={free_port()}",
        ]
    done = subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [json.loads((out_dir / f"status-{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp2", "tp"])
def test_a_sharded_job_finishes_with_the_monitor_attached(mode: str, tmp_path: Path) -> None:
    statuses = launch(mode, 2, tmp_path)
    assert [len(s["losses"]) for s in statuses] == [7, 7]
    assert statuses[0]["records_written"] == 3
