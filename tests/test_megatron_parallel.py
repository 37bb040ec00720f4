"""Megatron-core's own tensor and expert parallelism, under ``torchrun`` with gloo on CPU.

Megatron shards plain tensors: under TP each rank holds its query groups of ``linear_qkv``
(whole heads), under EP its own experts, while the router weight is replicated and each rank
routes its own tokens. The Monitor gathers each layer's partitions to its owner and reads the
whole layer; the norms count a partition, or an expert, once. The worker
(``tests/_megatron_parallel_worker.py``) trains a 2-layer GPT-MoE (4 heads in 2 groups, 4
experts, top-2) from the same weights on the same global batches with SGD; the one global
record per monitoring step must equal the single process's on every series. Skipped without
megatron-core (the ``megatron`` extra).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

WORKER = Path(__file__).with_name("_megatron_parallel_worker.py")
LAUNCH_TIMEOUT_S = 180
MONITORED_STEPS = [0, 3, 6]
TOLERANCE = 1e-5  # relative, on a scale of at least 1 (measured worst: 6.1e-7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, ranks: int, out_dir: Path) -> list[dict]:
    """The worker under torchrun; each rank's status. Exit 0 or fail with its output."""
    out_dir.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={ranks}",
        f"--master-port={free_port()}",
        str(WORKER),
        mode,
        str(out_dir),
    ]
    done = subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [json.loads((out_dir / f"status-{r}.json").read_text()) for r in range(ranks)]


def records(out_dir: Path) -> list[dict]:
    lines = (out_dir / "records-0.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") not in ("start", "end")]


def worst_difference(got: dict[str, float], want: dict[str, float]) -> tuple[float, str]:
    return max((abs(got[k] - v) / max(1.0, abs(v)), k) for k, v in want.items())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("single")
    (status,) = launch("single", 1, out)
    assert status["errors"] == 0 and status["skipped"] == []
    return records(out)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tp", "ep"])
def test_one_global_record_equals_the_unsharded_run(
    mode: str, reference: list[dict], tmp_path: Path
) -> None:
    statuses = launch(mode, 2, tmp_path)
    assert all(len(s["losses"]) == 7 and s["errors"] == 0 for s in statuses)
    assert [s["records_written"] for s in statuses] == [3, 0]
    assert [(s["describe"]["refused"], s["skipped"]) for s in statuses] == [([], [])] * 2
    got = records(tmp_path)
    assert [r["step"] for r in got] == MONITORED_STEPS == [r["step"] for r in reference]
    for mine, want in zip(got, reference, strict=True):
        assert mine["flags"] == [] and (mine["rank"], mine["world_size"]) == (0, 2)
        assert set(mine["values"]) == set(want["values"])
        assert worst_difference(mine["values"], want["values"])[0] < TOLERANCE
    series = set(reference[-1]["values"])
    layer = "decoder.layers.1.self_attention"
    assert {f"attn.d2.entropy@{layer}#h{h}" for h in range(4)} <= series  # every head, whole
    for family in ("attn.dwq.", "attn.d3.entropy_mean@", "router.load_maxvio@", "router.eps"):
        assert any(key.startswith(family) for key in series), family
    assert {"loss", "grad_norm", "weight_norm"} <= series
