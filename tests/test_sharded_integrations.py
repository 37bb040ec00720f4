"""The trainer callbacks on sharded trainers, unchanged for the user, under ``torchrun`` (gloo).

Each sharded trainer (transformers ``Trainer`` with accelerate's FSDP2; Lightning's
``FSDPStrategy``, i.e. FSDP1 flat parameters, and ``ModelParallelStrategy`` with FSDP2 in
``configure_model``) trains the tiny Mixtral of ``_sharded_worker`` with SGD on the same global
batches as a single-process run of the same trainer (``tests/_sharded_integration_worker.py``).
Rank 0's one record per monitoring step must equal the single process's on every series:
attention spectra, ΔW, router data statistics and geometry (ε), loss, grad and weight norm.
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

WORKER = Path(__file__).with_name("_sharded_integration_worker.py")
LAUNCH_TIMEOUT_S = 180
MONITORED_STEPS = [0, 3, 6]
TOLERANCE = 1e-5  # relative, on a scale of at least 1 (measured worst: 4.6e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, out_dir: Path, ranks: int = 2) -> list[dict]:
    """Run the worker (one plain process for ``*_single``); each rank's status."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    command = [sys.executable, str(WORKER), mode, str(out_dir)]
    if not mode.endswith("_single"):
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            f"--master-port={free_port()}",
        ]
    else:
        ranks = 1
    done = subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [json.loads((out_dir / f"status-{r}.json").read_text()) for r in range(ranks)]


def lines(out_dir: Path) -> list[dict]:
    """Rank 0's JSONL. FSDP1 names its wrapped blocks ``<block>._fsdp_wrapped_module.<child>``:
    compare the model's own names (as the DDP test drops ``module.``)."""
    text = (out_dir / "records.jsonl").read_text().replace("._fsdp_wrapped_module", "")
    return [json.loads(line) for line in text.splitlines()]


def metrics(out_dir: Path) -> list[dict]:
    return [r for r in lines(out_dir) if "values" in r]


def worst_difference(got: dict[str, float], want: dict[str, float]) -> tuple[float, str]:
    return max((abs(got[k] - v) / max(1.0, abs(v)), k) for k, v in want.items())


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("hf_single")
    launch("hf_single", out)
    return metrics(out)


@pytest.fixture(scope="module")
def lightning_reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    pytest.importorskip("lightning")
    out = tmp_path_factory.mktemp("pl_single")
    launch("pl_single", out)
    return metrics(out)


def check_against(reference: list[dict], out_dir: Path, statuses: list[dict]) -> None:
    """The job finished on both ranks and rank 0 wrote the start record, one record per
    monitoring step equal to the reference's, and the end record."""
    assert all(len(s["losses"]) == 7 and s["errors"] == 0 for s in statuses)
    assert [s["records_written"] for s in statuses] == [3, 0]
    kinds = [r.get("kind") for r in lines(out_dir)]
    assert kinds == ["start", None, None, None, "end"]
    start = lines(out_dir)[0]
    assert start["monitor"]["refused"] == []
    assert "attention layers: 2, routers: 2" in start["monitor"]["discovery"]
    got = metrics(out_dir)
    assert [r["step"] for r in got] == MONITORED_STEPS == [r["step"] for r in reference]
    for mine, want in zip(got, reference, strict=True):
        assert mine["flags"] == [] and (mine["rank"], mine["world_size"]) == (0, 2)
        assert set(mine["values"]) == set(want["values"])
        worst, key = worst_difference(mine["values"], want["values"])
        assert worst < TOLERANCE, (mine["step"], key, worst)
    series = set(reference[-1]["values"])
    for family in ("attn.d2.entropy@", "attn.dwq.", "router.load_maxvio@", "router.epsilon@"):
        assert any(key.startswith(family) for key in series), family
    assert {"loss", "grad_norm", "weight_norm"} <= series


@pytest.mark.slow
def test_hf_trainer_with_accelerate_fsdp2(hf_reference: list[dict], tmp_path: Path) -> None:
    statuses = launch("hf_fsdp2", tmp_path)
    assert all(s["dtensor_parameters"] > 0 for s in statuses)  # really sharded by FSDP2
    check_against(hf_reference, tmp_path, statuses)
    assert any(k.startswith("max_logit@") for k in hf_reference[-1]["values"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "wrapping"),
    [("pl_fsdp", "fsdp1_modules"), ("pl_model_parallel", "dtensor_parameters")],
)
def test_lightning_sharded_strategies(
    mode: str, wrapping: str, lightning_reference: list[dict], tmp_path: Path
) -> None:
    statuses = launch(mode, tmp_path)
    assert all(s[wrapping] > 0 for s in statuses)  # FSDP1 wrappers / FSDP2 DTensors
    check_against(lightning_reference, tmp_path, statuses)
