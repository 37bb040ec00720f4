"""Act before the loss moves: lab runs with a remedy policy inside, against loss-triggered rollback.

Each (scenario, seed) trains once per policy on the lab's GPT-MoE through :func:`foreshock.lab.
run.run_lab`, the product's training loop with the Monitor:

* ``none``: no action;
* ``foreshock``: the default policy acting on the warnings of the detectors run in the training
  process (:mod:`foreshock.lab.remedies`, :mod:`foreshock.remediation.remedy`: the shipped
  profiles, as ``foreshock detect --replay`` would warn) — the cause's remedy; before a router
  action, the newest snapshot before the warning's first evidence restored;
* ``foreshock-hold``: the same without that rollback (the routers' learning rate held from the
  warning on) — trained on router-collapse, the only scenario whose runs it changes;
* ``loss-rollback``: what trainers do today (:mod:`foreshock.lab.loss_trigger`): once the loss
  diverged (the project's rule, every step), restore a snapshot ≥ 100 steps before, skip 200
  batches, fault left on; at most 3 times;
* ``loss-rollback+fix``: the same trigger, plus the right remedy (as if the operator guessed
  the cause);
* ``stop``: stop at the first warning (the run ends ``stopped``: compute saved, nothing
  finished);
* ``foreshock-hold-at-warning``: the default policy with ``hold-lr`` scaling the rate at the
  warning, as before it scaled the rate when the warning's evidence began — trained on
  lr-high, the only scenario whose runs it changes;
* ``zclip``, ``clip-1.0``, ``spam``: no detector, an always-on guard at every step
  (:mod:`foreshock.lab.anchors`: ZClip at α = 0.97, z = 2.5; the gradient norm clipped to 1.0;
  SPAM's spike-aware clipping and momentum reset) — the anchors a fleet could turn on instead.

Faults are the lab's, injected into the training computation; a remedy changes that
computation (the attention backward back to full precision; the learning rate held). Per
scenario and policy:

* diverged: the run's loss diverged (the lab's every-step rule);
* saved: of the runs that diverged with no action, those that finished the horizon with the
  policy, their final loss inside the healthy band (the [min, max] final loss of the shipped
  healthy runs of the same model and horizon);
* actions and steps re-done per run; a policy that rolls back also the snapshots' bytes.

Healthy runs (``--healthy`` seeds, dropless and capacity-limited) and the controls (fa-noise,
router-mild) train with the policy too: any action on them is a false one.

    python -m benchmarks.remediation --quick      # 3 seeds a scenario (~55 min on 2 cores)
    python -m benchmarks.remediation              # 7 seeds a scenario

``--policies``/``--scenarios`` train a subset; ``--merge RESULT`` tabulates an earlier result's
runs with the new ones instead of training them again — those of a policy that acts on
warnings only where the result records today's profile versions and today's default policy (a
recalibrated profile or a changed policy makes them stale; no action and the loss-triggered
baselines never read either). The docs' tables: what the readme entries' commands say.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from foreshock.catalogue import scenario as catalogue_scenario
from foreshock.detectors.profiles import shipped_profiles
from foreshock.lab.arch import default_model
from foreshock.lab.faults import Fault, default_capacity
from foreshock.lab.loss_trigger import LossTriggerPolicy
from foreshock.lab.recorded import RECORDED_DIR, load_run, shipped_runs
from foreshock.lab.run import RunConfig, run_lab
from foreshock.remediation.remedy import (
    DEFAULT_ACTIONS,
    FAULT_DIRECTION,
    RemedyPolicy,
    policy_summary,
)
from foreshock.transport.run_files import load_run as load_file

from ._table import emit_json, format_table

SCENARIOS = ("fa-lowprec", "lr-high", "router-collapse")
DIVERGING = ("fa-lowprec", "lr-high")  # judged by the final loss; router-collapse by routing
# no action is right on these: healthy runs (dropless, and the router scenarios' dispatch) and
# the controls (unbiased rounding noise; a router learning rate ×2 that leaves routing healthy)
HEALTHY = ("healthy", "healthy+capacity-1", "fa-noise", "router-mild")
POLICIES = ("none", "foreshock", "foreshock-hold", "loss-rollback", "loss-rollback+fix", "stop")
POLICIES += ("foreshock-hold-at-warning", "zclip", "clip-1.0", "spam")
ARCHS = ("gpt-moe", "mixtral")  # the lab's GPT-MoE, a transformers Mixtral
STOP = RemedyPolicy(actions=dict.fromkeys(DEFAULT_ACTIONS, "stop"), rollback=False)
HOLD_ONLY = RemedyPolicy(rollback=False)  # the routers' learning rate held, no rollback
HOLD_AT_WARNING = RemedyPolicy(hold_from="warning")  # hold-lr as before issue 46's item 6
ANCHOR_POLICIES = ("zclip", "clip-1.0", "spam")  # always-on guards (lab.anchors), no detector


# policies whose runs never read a detector profile: a run of theirs stays valid across profiles
PROFILE_FREE = ("none", "loss-rollback", "loss-rollback+fix", *ANCHOR_POLICIES)


def right_fix(scenario: str) -> str:
    """The remedy for the scenario's first right cause (what a guessing operator would do)."""
    return DEFAULT_ACTIONS[catalogue_scenario(scenario).right_causes[0]]


def run_config(scenario: str, seed: int, policy: str, arch: str = "gpt-moe") -> RunConfig:
    """The lab run of one (scenario, seed) under one policy of :data:`POLICIES`."""
    name, _, dispatch = scenario.partition("+")
    capacity = 1.0 if dispatch == "capacity-1" else default_capacity(name, arch)
    model = default_model(arch, capacity)
    base = RunConfig(fault=Fault.default(name), seed=seed, model=model, arch=arch)
    if policy == "foreshock":
        return replace(base, policy=RemedyPolicy())
    if policy == "foreshock-hold":
        return replace(base, policy=HOLD_ONLY)
    if policy == "foreshock-hold-at-warning":
        return replace(base, policy=HOLD_AT_WARNING)
    if policy in ANCHOR_POLICIES:
        return replace(base, anchor=policy)
    if policy == "stop":
        return replace(base, policy=STOP)
    if policy.startswith("loss-rollback"):
        fix = right_fix(scenario) if policy.endswith("+fix") else None
        return replace(base, loss_trigger=LossTriggerPolicy(fix=fix))
    return base


def _trains(scenario: str, policy: str) -> bool:
    """Whether the benchmark trains ``scenario`` under ``policy``: the loss-triggered and stop
    baselines on the diverging scenarios, the router hold without rollback on router-collapse
    (elsewhere it acts as the default: a router action on a healthy run is false either way)."""
    if policy == "foreshock-hold":
        return scenario == "router-collapse"
    if policy == "foreshock-hold-at-warning":
        return scenario == "lr-high"  # the only scenario whose hold it changes
    return policy in ("none", "foreshock") or scenario in DIVERGING


def seed_list(given: str) -> list[int]:
    """The seeds of ``FIRST-LAST[,FIRST-LAST...]`` (a single seed: ``N``), in order.

    >>> seed_list("33-35,64-65")
    [33, 34, 35, 64, 65]
    """
    seeds: list[int] = []
    for part in given.split(","):
        first, _, last = part.strip().partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def _subset(given: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The comma-separated names of ``given``, each one of ``allowed`` (a typo is refused)."""
    names = tuple(name.strip() for name in given.split(",") if name.strip())
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise SystemExit(f"unknown {unknown}: choose among {', '.join(allowed)}")
    return names


def profile_versions(arch: str) -> dict[str, str]:
    """The versions of the shipped profiles a lab run of ``arch`` can be judged by (those named
    after it: ``gpt-moe`` and ``gpt-moe+capacity-1``; ``mixtral``)."""
    configs = shipped_profiles().configs
    return {name: c.version for name, c in configs.items() if name.split("+")[0] == arch}


def merged_runs(path: Path, arch: str) -> list[dict[str, Any]]:
    """The runs of an earlier result of this benchmark (its output line, or a saved
    ``benchmarks/results`` file) that still hold: those of ``arch``, and of a policy that acts
    on warnings only if they were trained with today's profiles (:func:`profile_versions`)
    and today's default policy (:func:`policy_stamp`)."""
    data = json.loads(path.read_text())
    result = data.get("result", data)
    if result.get("arch", "gpt-moe") != arch:
        raise SystemExit(f"{path}: runs of {result.get('arch', 'gpt-moe')}, not {arch}")
    current = result.get("profiles") == profile_versions(arch)
    current = current and result.get("policy") == policy_stamp()
    return [r for r in result["runs"] if current or r["policy"] in PROFILE_FREE]


def policy_stamp() -> dict[str, Any]:
    """What a result records of the default policy (its fields and the directions it acts
    in): a run of a policy that acts was decided by these."""
    stamp = {**policy_summary(RemedyPolicy()), "fault_direction": dict(FAULT_DIRECTION)}
    return json.loads(json.dumps(stamp))  # as a result file holds it (lists, not tuples)


def reusable(jobs: list[tuple], merged: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The merged runs to keep, by (scenario, seed, policy): a (scenario, seed) with any job
    left to train is trained anew under every policy, so that the runs a table compares for
    one seed come from one machine and one version of the code."""
    kept = {(r["scenario"], r["seed"], r["policy"]): r for r in merged}
    fresh = {job[:2] for job in jobs if job not in kept}
    return {key: r for key, r in kept.items() if key[:2] not in fresh}


def run_one(job: tuple[str, int, str, str]) -> dict[str, Any]:
    """Train one (scenario, seed, policy, arch) and read back its end record."""
    scenario, seed, policy, arch = job
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.jsonl"
        run_lab(run_config(scenario, seed, policy, arch), out, progress=False)
        run = load_file(out)
    end, last = run.end or {}, (run.records[-1]["values"] if run.records else {})
    return {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "status": end.get("status"),
        "divergence_step": end.get("divergence_step"),
        "final_loss": end.get("final_loss"),
        "last_step": end.get("last_step"),
        "actions": [a["kind"] for a in end.get("actions", [])],
        "rollbacks": end.get("rollbacks", 0),
        "steps_redone": end.get("steps_redone", 0),
        "snapshot_bytes": end.get("snapshot_bytes", 0),
        **routing(last),
    }


def routing(values: dict[str, Any]) -> dict[str, float | None]:
    """A record's routing: the layers' mean per-token routing entropy (nats) and mean dropped
    fraction (capacity-limited dispatch), None where the record has none."""

    def mean(prefix: str) -> float | None:
        found = [v for k, v in values.items() if k.startswith(prefix) and v is not None]
        return statistics.mean(found) if found else None

    return {
        "token_entropy": mean("router.token_entropy@"),
        "dropped": mean("router.dropped_fraction@"),
    }


def _shipped_healthy(folder: Path) -> list[Any]:
    return [run for run in map(load_run, shipped_runs(folder)) if run.scenario == "healthy"]


def routing_band(arch: str = "gpt-moe") -> dict[str, tuple[float, float]]:
    """[min, max] final routing of the shipped healthy runs the router scenario runs as: the
    capacity-limited GPT-MoE's, Mixtral's (dropless: no drops, 0)."""
    folder = RECORDED_DIR / ("gpt-moe+capacity-1" if arch == "gpt-moe" else arch)
    finals = [routing(run.records[-1]["values"]) for run in _shipped_healthy(folder)]
    return {
        key: (min(f[key] or 0.0 for f in finals), max(f[key] or 0.0 for f in finals))
        for key in ("token_entropy", "dropped")
    }


def healthy_band(arch: str = "gpt-moe") -> tuple[float, float]:
    """[min, max] final loss of the shipped healthy runs of ``arch`` (dropless, the full
    horizon)."""
    folder = RECORDED_DIR if arch == "gpt-moe" else RECORDED_DIR / arch
    finals = [run.end["final_loss"] for run in _shipped_healthy(folder)]
    return min(finals), max(finals)


def summarise(
    results: list[dict[str, Any]], band: tuple[float, float], routes: dict[str, tuple[float, float]]
) -> list[dict[str, Any]]:
    """One row per (scenario, policy): what it did, and how many of the runs that needed saving
    it saved (:func:`needs_saving`, :func:`saved`)."""
    rows = []
    for scenario in sorted({r["scenario"] for r in results}):
        of = [r for r in results if r["scenario"] == scenario]
        needing = {r["seed"] for r in of if r["policy"] == "none" and needs_saving(r, routes)}
        for policy in POLICIES:
            mine = [r for r in of if r["policy"] == policy]
            if not mine:
                continue
            judged = [r for r in mine if r["seed"] in needing]
            rescued = [r for r in judged if saved(r, band, routes)]
            rows.append(
                {
                    "scenario": scenario,
                    "policy": policy,
                    "runs": len(mine),
                    "diverged": sum(r["divergence_step"] is not None for r in mine),
                    "saved": "-" if scenario in HEALTHY else f"{len(rescued)}/{len(judged)}",
                    "runs with an action": sum(bool(r["actions"] or r["rollbacks"]) for r in mine),
                    "actions": sum(len(r["actions"]) + r["rollbacks"] for r in mine),
                    "steps re-done (median)": statistics.median(r["steps_redone"] for r in mine),
                    "stopped": sum(r["status"] == "stopped" for r in mine),
                    "steps trained (median)": statistics.median(
                        (r["last_step"] or 0) + 1 + r["steps_redone"] for r in mine
                    ),
                    "final loss (median)": _median_loss(mine),
                    "routing entropy (median)": _median(mine, "token_entropy"),
                }
            )
    return rows


def needs_saving(run: dict[str, Any], routes: dict[str, tuple[float, float]]) -> bool:
    """A run with no action that a remedy should save: it diverged, or (router-collapse, which
    does not diverge) its routing ended collapsed: its per-token entropy below the healthy
    runs' lowest, or its dropped fraction above their highest."""
    if run["scenario"] in HEALTHY:
        return False
    if run["scenario"] in DIVERGING:
        return run["divergence_step"] is not None
    return not _routing_healthy(run, routes)


def saved(run: dict[str, Any], band: tuple[float, float], routes: dict[str, tuple[float, float]]):
    """Finished the horizon healthy: the final loss inside the healthy band (the diverging
    scenarios), the routing not collapsed (router-collapse)."""
    if run["status"] != "finished":
        return False
    if run["scenario"] in DIVERGING:
        return run["final_loss"] is not None and band[0] <= run["final_loss"] <= band[1]
    return _routing_healthy(run, routes)


def _routing_healthy(run: dict[str, Any], routes: dict[str, tuple[float, float]]) -> bool:
    """One-sided, in the direction of a collapse: entropy not below, drops not above, the
    healthy runs' range (more even routing than the healthy runs' is not a collapse)."""
    entropy, dropped = run["token_entropy"], run["dropped"] or 0.0  # dropless: none dropped
    if entropy is None:
        return False
    return entropy >= routes["token_entropy"][0] and dropped <= routes["dropped"][1]


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    found = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(found), 3) if found else None


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
    if "routes" in result:  # results before router-collapse was judged have none
        entropy, dropped = result["routes"]["token_entropy"], result["routes"]["dropped"]
        rows.append(
            (
                "healthy routing at the end (shipped "
                + ("capacity-1 " if result.get("arch", "gpt-moe") == "gpt-moe" else "")
                + "healthy runs)",
                f"token entropy {entropy[0]:.3f}–{entropy[1]:.3f} nats; "
                f"dropped {dropped[0]:.3f}–{dropped[1]:.3f}",
            )
        )
    for row in result["rows"]:
        if row["scenario"] in HEALTHY:
            value = f"{row['runs with an action']}/{row['runs']} runs with an action (false)"
        else:
            value = (
                f"{row['diverged']}/{row['runs']} diverged; saved {row['saved']}; "
                f"{row['actions']} actions; steps re-done {row['steps re-done (median)']}"
            )
            if "stopped" in row:
                value += (
                    f"; {row['stopped']} stopped; steps trained {row['steps trained (median)']}"
                )
            if row["scenario"] == "router-collapse" and row.get("routing entropy (median)"):
                value += f"; final routing entropy {row['routing entropy (median)']} nats (median)"
        rows.append((f"{row['scenario']}, policy {row['policy']}", value))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds a scenario")
    parser.add_argument("--arch", choices=ARCHS, default="gpt-moe")
    parser.add_argument(
        "--seeds", default="33-39", help="fault seeds FIRST-LAST (30-32: judged before the "
        "router rollback and the capacity profile's 40 calibration runs)"
    )  # fmt: skip
    parser.add_argument(
        "--healthy", default="33-35", help="held-out healthy seeds: FIRST-LAST[,FIRST-LAST...]"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS + HEALTHY), help="comma-separated subset"
    )
    parser.add_argument(
        "--merge", type=Path, action="append", default=[], help="an earlier result (JSON): its "
        "runs that still hold are tabulated with these, and not trained again"
    )  # fmt: skip
    args = parser.parse_args()
    policies = _subset(args.policies, POLICIES)
    wanted = _subset(args.scenarios, SCENARIOS + HEALTHY)
    first, last = (int(x) for x in args.seeds.split("-"))
    if args.quick:
        last = first + 2
    seeds = range(first, last + 1)
    healthy = [h for h in HEALTHY if args.arch == "gpt-moe" or "+" not in h]  # capacity: GPT-MoE
    jobs = [(s, seed, p) for s in SCENARIOS for seed in seeds for p in policies]
    if "foreshock" in policies:  # healthy and control runs: any action is a false one
        jobs += [(h, seed, "foreshock") for h in healthy for seed in seed_list(args.healthy)]
    jobs = [j for j in jobs if j[0] in wanted and _trains(j[0], j[2])]
    kept = reusable(jobs, [r for p in args.merge for r in merged_runs(p, args.arch)])
    jobs = [j for j in jobs if j not in kept]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(run_one, [(*job, args.arch) for job in jobs], chunksize=1)
    results = sorted(
        [*kept.values(), *results], key=lambda r: (r["scenario"], r["policy"], r["seed"])
    )
    band, routes = healthy_band(args.arch), routing_band(args.arch)
    rows = summarise(results, band, routes)
    headers = list(rows[0])
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    emit_json(
        {
            "benchmark": "remediation",
            "arch": args.arch,
            "profiles": profile_versions(args.arch),
            "policy": policy_stamp(),
            "band": band,
            "routes": routes,
            "rows": rows,
            "runs": results,
        }
    )


if __name__ == "__main__":
    main()
