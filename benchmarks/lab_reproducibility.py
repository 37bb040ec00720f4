"""Do the shipped lab runs reproduce here? Retrain each one's first steps from its labels.

A recorded run's ``start`` labels describe its training completely
(:func:`foreshock.lab.run.config_from_labels`). Retrained on this machine, each run's loss at
the first monitored steps is compared bit for bit with the recording. On one machine a run is
deterministic (``tests/test_lab.py``); across machines and builds it need not be: a different
kernel path (CPU capability, library build, denormal handling) changes the last bit of a
float32 sum, and training amplifies the difference. The loss curve stays statistically the
same, but the step of a fault run's divergence moves (fa-lowprec-s0: 697 when recorded, 821
retrained here), so a shipped run is one draw of its scenario, not a fixture to re-derive.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from foreshock.lab.recorded import load_run, shipped_runs

from ._table import emit_json, format_table, single_thread


def _retrained_losses(labels: dict, steps: int, scratch: Path) -> list[float]:
    from foreshock.lab.run import config_from_labels, run_lab

    config = config_from_labels(labels, steps=steps)
    return run_lab(config, scratch / "retrained.jsonl", progress=False).losses


def _compare(path: Path, steps: int, scratch: Path) -> dict:
    run = load_run(path)
    recorded = dict(zip(*run.series("loss"), strict=True))
    losses = _retrained_losses(run.labels, steps, scratch)
    checked = [s for s in sorted(recorded) if s < len(losses)]
    first_diff = next((s for s in checked if losses[s] != recorded[s]), None)
    return {"run": run.run_id, "scenario": run.labels["scenario"], "identical": first_diff is None}


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s row for this result: how many shipped runs retrain bit-identical
    here over their first steps (CPU capability, torch version), and which differ (the first
    8)."""
    differing = ", ".join(result["differing"][:8]) + (" …" if len(result["differing"]) > 8 else "")
    return [
        (
            f"shipped runs whose first {result['steps'] - 1} steps retrain bit-identical here "
            f"(CPU {result['cpu_capability']}, torch {result['torch']})",
            f"{result['identical']}/{result['runs']}; differing: {differing or 'none'}",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="folder of recorded runs (default: shipped)")
    parser.add_argument("--steps", type=int, default=51, help="steps retrained per run")
    parser.add_argument("--quick", action="store_true", help="every 10th run, 26 steps")
    args = parser.parse_args()
    single_thread()
    import torch

    paths = shipped_runs(args.runs)
    steps = 26 if args.quick else args.steps
    if args.quick:
        paths = paths[::10]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        results = [_compare(p, steps, Path(scratch)) for p in paths]
    by_scenario: dict[str, list[dict]] = defaultdict(list)
    for result in results:
        by_scenario[result["scenario"]].append(result)
    rows = [
        [
            scenario,
            len(rs),
            sum(r["identical"] for r in rs),
            ", ".join(r["run"] for r in rs if not r["identical"])[:70] or "-",
        ]
        for scenario, rs in sorted(by_scenario.items())
    ]
    here = torch.backends.cpu.get_cpu_capability()
    seconds = time.perf_counter() - start
    print(
        f"retrained {steps} steps of {len(results)} recorded runs on this machine "
        f"(CPU capability {here}, torch {torch.__version__}) in {seconds:.0f} s; "
        "loss compared at every monitored step"
    )
    print(format_table(["scenario", "runs", "bit-identical", "differing"], rows))
    identical = sum(r["identical"] for r in results)
    emit_json(
        {
            "runs": len(results),
            "steps": steps,
            "identical": identical,
            "identical_fraction": round(identical / max(len(results), 1), 4),
            "cpu_capability": here,
            "torch": torch.__version__,
            "differing": [r["run"] for r in results if not r["identical"]],
        }
    )


if __name__ == "__main__":
    main()
