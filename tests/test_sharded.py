"""The Monitor inside sharded training, under ``torchrun`` with the gloo backend on CPU.

Each parallelism trains the same tiny transformers Mixtral on the same global batches
(``tests/_sharded_worker.py``, plain SGD so that round-off drift stays small); its one global
record per monitoring step must equal the single process's on every series: attention per
head and per layer, ΔW, max logit, router token/load entropy, MaxVio, ε, cosines, loss, grad
and weight norm.
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
PIPELINE_WORKER = Path(__file__).with_name("_pipeline_worker.py")
LAUNCH_TIMEOUT_S = 240
MONITORED_STEPS = [0, 3, 6]
TOLERANCE = 1e-5  # relative, on a scale of at least 1 (measured worst: 1.1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PAIRS = (  # 2-rank jobs, one launch; rank_zero_only last (see the worker)
    *("ddp", "tp", "fsdp2"),
    *("fsdp2:before_wrap", "fsdp2:fail_compute", "fsdp2:fail_read", "fsdp2:fail_read_later"),
    "fsdp2:per_rank",
    "fsdp2:rank_zero_only",
)
QUADS = ("fsdp2_tp", "hsdp")  # 4-rank jobs, one launch


def launch(jobs: str, ranks: int, out_dir: Path, *, worker: Path = WORKER) -> None:
    """Run ``worker`` on ``jobs`` (under torchrun unless ``single``). Exit 0 or fail."""
    out_dir.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    command = [sys.executable, str(worker), jobs, str(out_dir)]
    if jobs != "single":
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            f"--master-port={free_port()}",
        ]
    done = subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, f"{jobs} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def job_dir(root: Path, job: str) -> Path:
    return root / job.replace(":", "-")


def statuses(out_dir: Path, ranks: int) -> list[dict]:
    return [json.loads((out_dir / f"status-{r}.json").read_text()) for r in range(ranks)]


def records(out_dir: Path, rank: int = 0) -> list[dict]:
    path = out_dir / f"records-{rank}.jsonl"
    if not path.exists():
        return []
    unwrapped = []
    for line in path.read_text().splitlines():
        record = json.loads(line)  # DDP names its modules module.<name>: compare the model's
        if record.get("kind") in ("start", "end"):  # the run's bounds (producers.run_bounds)
            continue
        record["values"] = {k.replace("@module.", "@"): v for k, v in record["values"].items()}
        unwrapped.append(record)
    return unwrapped


def worst_difference(got: dict[str, float], want: dict[str, float]) -> tuple[float, str]:
    return max((abs(got[k] - v) / max(1.0, abs(v)), k) for k, v in want.items())


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single process's output folder: its records, and its losses in ``status-0.json``."""
    out = tmp_path_factory.mktemp("single")
    launch("single", 1, out)
    return job_dir(out, "single")


@pytest.fixture(scope="module")
def reference(single_run: Path) -> list[dict]:
    return records(single_run)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank jobs' output folders (``job_dir``), from one launch."""
    out = tmp_path_factory.mktemp("pairs")
    launch(",".join(PAIRS), 2, out)
    return out


@pytest.fixture(scope="module")
def quads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 4-rank jobs' output folders, from one launch."""
    out = tmp_path_factory.mktemp("quads")
    launch(",".join(QUADS), 4, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "ranks"), [("ddp", 2), ("fsdp2", 2), ("tp", 2), ("fsdp2_tp", 4), ("hsdp", 4)]
)
def test_one_global_record_equals_the_unsharded_run(
    mode: str, ranks: int, reference: list[dict], request: pytest.FixtureRequest
) -> None:
    out = job_dir(request.getfixturevalue("pairs" if ranks == 2 else "quads"), mode)
    ranks_status = statuses(out, ranks)
    assert all(len(s["losses"]) == 7 and s["errors"] == 0 for s in ranks_status)
    assert [s["records_written"] for s in ranks_status] == [3] + [0] * (ranks - 1)
    assert ranks_status[0]["describe"]["refused"] == []
    got = records(out)
    assert [r["step"] for r in got] == MONITORED_STEPS == [r["step"] for r in reference]
    for mine, want in zip(got, reference, strict=True):
        assert mine["flags"] == [] and (mine["rank"], mine["world_size"]) == (0, ranks)
        assert set(mine["values"]) == set(want["values"])
        assert worst_difference(mine["values"], want["values"])[0] < TOLERANCE
    series = set(reference[-1]["values"])
    for family in ("attn.d2.entropy@", "attn.dwq.", "max_logit@", "router.load_maxvio@"):
        assert any(key.startswith(family) for key in series), family
    assert {"loss", "grad_norm", "weight_norm"} <= series


@pytest.mark.slow
def test_a_monitor_built_before_sharding_follows_the_sharded_parameters(
    reference: list[dict], pairs: Path
) -> None:
    got = records(job_dir(pairs, "fsdp2:before_wrap"))
    assert [r["step"] for r in got] == MONITORED_STEPS
    for mine, want in zip(got, reference, strict=True):
        assert set(mine["values"]) == set(want["values"])
        assert worst_difference(mine["values"], want["values"])[0] < TOLERANCE


@pytest.mark.slow
def test_an_error_on_one_rank_is_a_flagged_record_and_training_goes_on(pairs: Path) -> None:
    out = job_dir(pairs, "fsdp2:fail_compute")
    ranks_status = statuses(out, 2)
    assert [len(s["losses"]) for s in ranks_status] == [7, 7]
    assert [s["errors"] for s in ranks_status] == [0, 3]  # rank 1 failed at each monitoring step
    got = records(out)
    assert [r["flags"] for r in got] == [["monitor_error@attention"]] * 3
    layers = {k.split("@")[1].split("#")[0] for k in got[-1]["values"] if k.startswith("attn.")}
    assert layers == {"model.layers.0.self_attn"}  # rank 0's layer; rank 1 owned layer 1
    assert "router.token_entropy@model.layers.1.mlp.gate" in got[-1]["values"]


@pytest.mark.slow
def test_a_rank_that_cannot_read_its_specs_makes_every_rank_skip_the_gathers(
    pairs: Path,
) -> None:
    out = job_dir(pairs, "fsdp2:fail_read")
    assert [len(s["losses"]) for s in statuses(out, 2)] == [7, 7]
    got = records(out)
    assert [r["flags"] for r in got] == [["monitor_error@sharded"]] * 3
    assert not any(k.startswith(("attn.", "router.epsilon")) for r in got for k in r["values"])
    assert {"loss", "weight_norm", "router.token_entropy@model.layers.0.mlp.gate"} <= set(
        got[-1]["values"]
    )


@pytest.mark.slow
def test_a_rank_failing_after_the_plan_was_agreed_makes_every_rank_skip_the_gathers(
    pairs: Path,
) -> None:
    # the agreed plan is checked by digest; a rank whose reading fails later sends none
    out = job_dir(pairs, "fsdp2:fail_read_later")
    assert [len(s["losses"]) for s in statuses(out, 2)] == [7, 7]
    got = records(out)
    assert [r["flags"] for r in got] == [[], ["monitor_error@sharded"], ["monitor_error@sharded"]]
    assert "router.epsilon@model.layers.1.mlp.gate" in got[0]["values"]  # measured together
    assert not any(k.startswith(("attn.", "router.epsilon")) for r in got[1:] for k in r["values"])


@pytest.mark.slow
def test_per_rank_records_keep_each_ranks_own_data(reference: list[dict], pairs: Path) -> None:
    out = job_dir(pairs, "fsdp2:per_rank")
    ranks_status = statuses(out, 2)
    per_rank = [records(out, rank) for rank in (0, 1)]
    assert [len(r) for r in per_rank] == [3, 3]
    for rank, recs in enumerate(per_rank):
        assert all(r["rank"] == rank for r in recs)
        assert [r["values"]["loss"] for r in recs] == pytest.approx(
            [ranks_status[rank]["losses"][step] for step in MONITORED_STEPS], rel=1e-6
        )
    last0, last1, want = per_rank[0][-1]["values"], per_rank[1][-1]["values"], reference[-1]
    weights = [k for k in want["values"] if k.startswith("attn.") or k == "weight_norm"]
    for key in weights:  # the weights are the model's, whichever rank writes
        assert last0[key] == pytest.approx(want["values"][key], rel=TOLERANCE, abs=TOLERANCE)
        assert last1[key] == pytest.approx(want["values"][key], rel=TOLERANCE, abs=TOLERANCE)
    mean = (last0["loss"] + last1["loss"]) / 2
    assert mean == pytest.approx(want["values"]["loss"], rel=1e-6)


@pytest.mark.slow
def test_a_monitor_on_rank_zero_alone_refuses_the_sharded_parts_and_never_hangs(
    pairs: Path,
) -> None:
    out = job_dir(pairs, "fsdp2:rank_zero_only")
    ranks_status = statuses(out, 2)
    assert [len(s["losses"]) for s in ranks_status] == [7, 7]
    refused = ranks_status[0]["describe"]["refused"]
    assert "model.layers.0.self_attn" in refused and "model.layers.1.mlp.gate" in refused
    got = records(out)
    assert [r["step"] for r in got] == MONITORED_STEPS
    assert not any(k.startswith("attn.") for r in got for k in r["values"])
    assert "router.token_entropy@model.layers.0.mlp.gate" not in got[-1]["values"]
    assert "loss" in got[-1]["values"] and "weight_norm" not in got[-1]["values"]


@pytest.mark.slow
def test_pipeline_stages_make_one_global_record(
    single_run: Path, reference: list[dict], tmp_path: Path
) -> None:
    """Two pipeline stages (torchtitan's split: each rank keeps its modules under their
    original names) make the single process's record. The losses are checked first, so that
    a wrong pipeline cannot hide behind the Monitor."""
    launch("pp", 2, tmp_path, worker=PIPELINE_WORKER)
    stages = statuses(tmp_path, 2)
    want_losses = json.loads((single_run / "status-0.json").read_text())["losses"]
    assert stages[0]["losses"] == []  # the first stage has no loss
    assert stages[1]["losses"][0] == pytest.approx(want_losses[0], rel=1e-6)
    assert stages[1]["losses"] == pytest.approx(want_losses, rel=TOLERANCE)
    assert [s["errors"] for s in stages] == [0, 0]
    assert [s["records_written"] for s in stages] == [3, 0]
    assert stages[0]["describe"]["refused"] == []
    got = records(tmp_path)
    assert [r["step"] for r in got] == MONITORED_STEPS == [r["step"] for r in reference]
    for mine, want in zip(got, reference, strict=True):
        assert mine["flags"] == [] and (mine["rank"], mine["world_size"]) == (0, 2)
        assert set(mine["values"]) == set(want["values"])
        assert worst_difference(mine["values"], want["values"])[0] < TOLERANCE
