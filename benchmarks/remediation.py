"""Act before the loss moves: lab runs with a remedy policy inside, against no action.

Each (scenario, seed) trains twice on the lab's GPT-MoE through :func:`foreshock.lab.run.
run_lab`, the product's training loop with the Monitor: once with no action, once with the
policy acting on the warnings of the detectors run in the training process
(:mod:`foreshock.lab.remedies`, :mod:`foreshock.producers.remedy`: the shipped profiles, as
``foreshock detect --replay`` would warn). Faults are the lab's, injected into the training
computation; the remedy changes that computation (the attention backward back to full
precision; the learning rate held). Per scenario and policy:

* diverged: the run's loss diverged (the lab's every-step rule);
* saved: of the runs that diverged with no action, those that finished the horizon with the
  policy, their final loss inside the healthy band (the [min, max] final loss of the shipped
  healthy runs of the same model and horizon);
* actions and steps re-done per run; a policy that rolls back also the snapshots' bytes.

Healthy runs (``--healthy`` seeds, held out of the profile's calibration) train with the policy
too: any action on them is a false one.

    python -m benchmarks.remediation --quick      # 3 seeds a scenario (~10 min on 2 cores)
    python -m benchmarks.remediation              # 7 seeds a scenario
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
from pathlib import Path
from typing import Any

from foreshock.lab.faults import Fault
from foreshock.lab.recorded import RECORDED_DIR, load_run, shipped_runs
from foreshock.lab.run import RunConfig, run_lab
from foreshock.producers.remedy import RemedyPolicy
from foreshock.transport.run_files import load_run as load_file

from ._table import emit_json, format_table

SCENARIOS = ("fa-lowprec", "lr-high")
POLICIES: dict[str, RemedyPolicy | None] = {"none": None, "default": RemedyPolicy()}


def run_one(job: tuple[str, int, str]) -> dict[str, Any]:
    """Train one (scenario, seed, policy) and read back its end record."""
    scenario, seed, policy = job
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.jsonl"
        config = RunConfig(fault=Fault.default(scenario), seed=seed, policy=POLICIES[policy])
        run_lab(config, out, progress=False)
        end = load_file(out).end or {}
    return {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "status": end.get("status"),
        "divergence_step": end.get("divergence_step"),
        "final_loss": end.get("final_loss"),
        "actions": [a["kind"] for a in end.get("actions", [])],
        "steps_redone": end.get("steps_redone", 0),
        "snapshot_bytes": end.get("snapshot_bytes", 0),
    }


def healthy_band() -> tuple[float, float]:
    """[min, max] final loss of the shipped healthy GPT-MoE runs (the full horizon)."""
    finals = [
        load_run(p).end["final_loss"]
        for p in shipped_runs(RECORDED_DIR)
        if p.name.startswith("healthy-")
    ]
    return min(finals), max(finals)


def summarise(results: list[dict[str, Any]], band: tuple[float, float]) -> list[dict[str, Any]]:
    lo, hi = band
    rows = []
    for scenario in sorted({r["scenario"] for r in results}):
        baseline = {
            r["seed"]: r for r in results if r["scenario"] == scenario and r["policy"] == "none"
        }
        would_diverge = {s for s, r in baseline.items() if r["divergence_step"] is not None}
        for policy in POLICIES:
            mine = [r for r in results if r["scenario"] == scenario and r["policy"] == policy]
            if not mine:
                continue
            judged = (
                [r for r in mine if r["seed"] in would_diverge] if scenario != "healthy" else mine
            )
            saved = [
                r
                for r in judged
                if r["status"] == "finished"
                and r["final_loss"] is not None
                and lo <= r["final_loss"] <= hi
            ]
            rows.append(
                {
                    "scenario": scenario,
                    "policy": policy,
                    "runs": len(mine),
                    "diverged": sum(r["divergence_step"] is not None for r in mine),
                    "saved": f"{len(saved)}/{len(judged)}" if scenario != "healthy" else "-",
                    "runs with an action": sum(bool(r["actions"]) for r in mine),
                    "actions": sum(len(r["actions"]) for r in mine),
                    "steps re-done (median)": statistics.median(r["steps_redone"] for r in mine),
                    "final loss (median)": _median_loss(mine),
                }
            )
    return rows


def _median_loss(runs: list[dict[str, Any]]) -> float | None:
    losses = [r["final_loss"] for r in runs if r["final_loss"] is not None]
    return round(statistics.median(losses), 3) if losses else None


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Per scenario and policy: runs saved, actions, steps re-done; healthy: false actions."""
    rows = [
        (
            "healthy band of final loss (shipped healthy runs)",
            f"{result['band'][0]:.3f}–{result['band'][1]:.3f}",
        )
    ]
    for row in result["rows"]:
        if row["scenario"] == "healthy":
            value = f"{row['runs with an action']}/{row['runs']} runs with an action (false)"
        else:
            value = (
                f"{row['diverged']}/{row['runs']} diverged; saved {row['saved']}; "
                f"{row['actions']} actions; steps re-done {row['steps re-done (median)']}"
            )
        rows.append((f"{row['scenario']}, policy {row['policy']}", value))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds a scenario")
    parser.add_argument("--seeds", default="30-36", help="fault seeds FIRST-LAST")
    parser.add_argument("--healthy", default="30-32", help="held-out healthy seeds FIRST-LAST")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    first, last = (int(x) for x in args.seeds.split("-"))
    if args.quick:
        last = first + 2
    seeds = range(first, last + 1)
    h_first, h_last = (int(x) for x in args.healthy.split("-"))
    jobs = [(s, seed, p) for s in SCENARIOS for seed in seeds for p in POLICIES]
    jobs += [("healthy", seed, "default") for seed in range(h_first, h_last + 1)]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(run_one, jobs, chunksize=1)
    band = healthy_band()
    rows = summarise(results, band)
    headers = list(rows[0])
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    emit_json({"benchmark": "remediation", "band": band, "rows": rows, "runs": results})


if __name__ == "__main__":
    main()
