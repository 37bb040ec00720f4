"""Sharded records against the unsharded run: the worst difference per parallelism and family.

Each parallelism trains the same tiny transformers Mixtral (2 layers, 4 heads / 2 kv heads,
4 experts top-2) on the same global batches with plain SGD, under ``torchrun`` with gloo on
CPU, with the Monitor (or the trainer's callback) attached as documented; its one global
record per monitoring step is compared, series by series, with the single process's. The
difference is relative on a scale of at least 1: |a − b| / max(1, |b|). It includes the
training's own round-off drift (a sharded step sums its gradients in another order), which SGD
keeps small.

The workers are the tests' (``tests/_sharded_worker.py``, ``_sharded_integration_worker.py``,
``_megatron_parallel_worker.py``: a 2-layer Megatron GPT-MoE; ``_pipeline_worker.py``: the
Mixtral in 2 hand-run stages): the benchmark runs from the
repository root.

    python -m benchmarks.sharded_equality     # 6 Monitor, 3 trainer, 2 Megatron modes (~5 min)
    python -m benchmarks.sharded_equality --quick    # DDP and FSDP2 only (~40 s)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from foreshock.catalogue import family_of
from foreshock.transport.records import parse_series_key

from ._table import emit_json, format_table

ROOT = Path(__file__).resolve().parent.parent
MONITOR_WORKER = ROOT / "tests" / "_sharded_worker.py"
TRAINER_WORKER = ROOT / "tests" / "_sharded_integration_worker.py"
MEGATRON_WORKER = ROOT / "tests" / "_megatron_parallel_worker.py"
PIPELINE_WORKER = ROOT / "tests" / "_pipeline_worker.py"
TIMEOUT_S = 300
# (name, worker, mode, ranks, the single-process mode it is compared with)
MODES = [
    ("DDP", MONITOR_WORKER, "ddp", 2, "single"),
    ("FSDP2", MONITOR_WORKER, "fsdp2", 2, "single"),
    ("TP (colwise q/k/v, rowwise o)", MONITOR_WORKER, "tp", 2, "single"),
    ("FSDP2 × TP (2-D mesh)", MONITOR_WORKER, "fsdp2_tp", 4, "single"),
    ("HSDP (replicate × shard)", MONITOR_WORKER, "hsdp", 4, "single"),
    ("pipeline, 2 stages", PIPELINE_WORKER, "pp", 2, "single"),
    ("HF Trainer + accelerate FSDP2", TRAINER_WORKER, "hf_fsdp2", 2, "hf_single"),
    ("Lightning FSDPStrategy (FSDP1)", TRAINER_WORKER, "pl_fsdp", 2, "pl_single"),
    ("Lightning ModelParallelStrategy", TRAINER_WORKER, "pl_model_parallel", 2, "pl_single"),
    ("Megatron-core TP = 2 (+ sequence parallel)", MEGATRON_WORKER, "tp", 2, "single"),
    ("Megatron-core EP = 2", MEGATRON_WORKER, "ep", 2, "single"),
]
TORCHRUN_ALWAYS = {MEGATRON_WORKER}  # its single process needs a process group too
REFERENCE_WORKER = {PIPELINE_WORKER: MONITOR_WORKER}  # whose single mode a worker is judged by
QUICK = ((MONITOR_WORKER, "ddp"), (MONITOR_WORKER, "fsdp2"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(worker: Path, mode: str, ranks: int, out: Path) -> list[dict]:
    """Run one mode; rank 0's metrics records (names as the unwrapped model's)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, str(worker), mode, str(out)]
    if ranks > 1 or worker in TORCHRUN_ALWAYS:
        command[1:1] = ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
        command.insert(4, f"--master-port={free_port()}")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
    files = [out / "records-0.jsonl", out / "records.jsonl"]
    lines = next(f for f in files if f.exists()).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [r for r in records if r.get("kind", "metrics") == "metrics" and "values" in r]


def worst(got: list[dict], want: list[dict]) -> dict:
    """Per family: the worst relative difference and its series; and what was compared."""
    if [r["step"] for r in got] != [r["step"] for r in want]:
        raise RuntimeError("the sharded run recorded other steps than the single process")
    families: dict[str, tuple[float, str]] = {}
    compared, missing = 0, set()
    for mine, theirs in zip(got, want, strict=True):
        for key, value in theirs["values"].items():
            other = mine["values"].get(key)
            if value is None or other is None:
                if other is None and value is not None:
                    missing.add(key)
                continue
            compared += 1
            family = family_of(parse_series_key(key).metric)
            diff = abs(other - value) / max(1.0, abs(value))
            if diff >= families.get(family, (-1.0, ""))[0]:
                families[family] = (diff, key)
    return {
        "records": len(got),
        "values_compared": compared,
        "missing": sorted(missing),
        "families": {f: {"worst": d, "series": k} for f, (d, k) in sorted(families.items())},
        "worst": max(d for d, _ in families.values()),
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per parallelism and rank count: the
    worst difference of its global records from the single process's (relative on a scale
    ≥ 1), per family (attention, router, symptoms), with the values and records compared and
    the records missing."""
    rows = []
    for m in result["modes"]:
        fam = {f: v["worst"] for f, v in m["families"].items()}
        rows.append(
            (
                f"{m['parallelism']}, {m['ranks']} ranks: worst difference, "
                "relative on a scale ≥ 1",
                f"{m['worst']:.1e} (attention {fam.get('attention-numerics', 0):.1e}, router "
                f"{fam.get('router', 0):.1e}, symptoms {fam.get('symptom', 0):.1e}); "
                f"{m['values_compared']} values in {m['records']} records, "
                f"{len(m['missing'])} missing",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="DDP and FSDP2 only")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        references: dict[tuple[Path, str], list[dict]] = {}
        for name, worker, mode, ranks, single in MODES:
            if args.quick and (worker, mode) not in QUICK:
                continue
            judge = REFERENCE_WORKER.get(worker, worker)
            if (judge, single) not in references:
                out = Path(tmp) / f"{judge.stem}-{single}"
                references[judge, single] = launch(judge, single, 1, out)
            got = launch(worker, mode, ranks, Path(tmp) / f"{worker.stem}-{mode}")
            results.append({"parallelism": name, "mode": mode, "ranks": ranks,
                            **worst(got, references[judge, single])})  # fmt: skip
    rows = [
        [r["parallelism"], r["ranks"], r["records"], r["values_compared"], len(r["missing"]),
         *(f"{r['families'].get(f, {}).get('worst', float('nan')):.1e}"
           for f in ("attention-numerics", "router", "symptom")),
         f"{r['worst']:.1e}"]
        for r in results
    ]  # fmt: skip
    headers = ["parallelism", "ranks", "records", "values", "missing", "attention", "router",
               "symptom", "worst"]  # fmt: skip
    print(format_table(headers, rows))
    emit_json({"benchmark": "sharded_equality", "quick": args.quick, "modes": results})


if __name__ == "__main__":
    main()
