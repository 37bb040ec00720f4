"""Warnings under real recipes: warm-up then cosine, linear and WSD decay, other peak learning
rates, horizons of 2,000-10,000 steps, faults deep in the decay.

Every profile and rule was first calibrated on constant-rate 1,600-step lab runs; this
benchmark judges them on runs trained with the recipes users train with, **after** the rules
were frozen (``FROZEN``; the runs' ``start`` time is checked). The runs are lab runs
(``foreshock lab run`` with ``--schedule``/``--warmup``/``--lr``) of four models: the lab's
GPT-MoE (with and without expert capacity), the lab's Mixtral, a Qwen3-MoE (no profile was
calibrated on it, nor was the zero-shot profile) and a Mixtral of another size (3 layers,
hidden 160, 6 experts: the model of the recipe issue). Each is replayed through the
detectors as the worker would (:func:`~foreshock.detectors.profiles.shipped_profiles`: the
profile is chosen by signature and recipe), judged by :mod:`~foreshock.detectors.judge`:

* healthy runs: mechanism false warnings per run and per 10,000 steps, and the actions the
  default remediation policy would take on them (:class:`~foreshock.remediation.remedy.Remediator`
  deciding on every warning in order);
* faults (fa-lowprec, lr-high, router-collapse where the model routes; onset at 20 %, 50 % and
  80 % of the horizon, most under cosine decay): warned before the divergence with a right
  cause, and the lead, per onset phase, beside today's constant-rate leads of the zero-shot
  profile (``benchmarks/results/zero_shot.json``). A fault run that does not diverge at the
  low learning rates of the decay is reported as such, and not counted.

``python -m benchmarks.recipes --generate`` trains the runs of :data:`PLAN` that are missing
(two at a time) into ``lab/runs/recipes-judged``; without it the stored runs are judged.
``--quick`` judges a handful.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from foreshock.detectors.config import OPTIMIZER_TEST
from foreshock.detectors.judge import judge
from foreshock.detectors.profiles import shipped_profiles
from foreshock.detectors.replay import replay_run
from foreshock.detectors.schedule_clock import ScheduleClock
from foreshock.recipe import Recipe
from foreshock.remediation.remedy import Remediator, RemedyPolicy
from foreshock.transport.run_files import load_run

from ._table import emit_json, format_table, median

ROOT = Path(__file__).resolve().parent.parent
JUDGED = ROOT / "lab" / "runs" / "recipes-judged"
CALIBRATION = ROOT / "lab" / "runs" / "recipes-calibration"  # where the rules were chosen
# The rules were frozen at this time (UTC; the commit that froze them says so): every judged
# run must have started training after it.
FROZEN = "2026-12-05T21:36:13"
HORIZON = 2000
ONSETS = {"20%": 400, "50%": 1000, "80%": 1600}
MODELS = {  # tag -> foreshock lab run options
    "gpt-moe": ["--arch", "gpt-moe"],
    "gpt-moe+capacity": ["--arch", "gpt-moe", "--capacity", "1"],
    "mixtral": ["--arch", "mixtral"],
    "qwen3-moe": ["--arch", "qwen3-moe"],
    "olmoe": ["--arch", "olmoe"],
    "mixtral-l3h160e6": [
        "--arch",
        "mixtral",
        "--n-layers",
        "3",
        "--hidden",
        "160",
        "--experts",
        "6",
    ],
}


@dataclass(frozen=True)
class Spec:
    """One planned run: its model, scenario, recipe and (faults) onset."""

    model: str
    scenario: str
    seed: int
    schedule: str = "cosine"
    warmup: int = 100
    lr_factor: float = 1.0
    steps: int = HORIZON
    onset: int | None = None

    @property
    def recipe_tag(self) -> str:
        factor = "" if self.lr_factor == 1 else f"{self.lr_factor:g}x"
        warm = f"-w{self.warmup}" if self.warmup else ""
        return f"{self.schedule}{factor}{warm}-{self.steps}"

    @property
    def run_id(self) -> str:
        onset = f"-at{self.onset}" if self.onset is not None else ""
        return f"{self.model}-{self.scenario}-{self.recipe_tag}{onset}-s{self.seed}"

    def command(self, out: Path) -> list[str]:
        args = [*MODELS[self.model], "--scenario", self.scenario, "--seed", str(self.seed)]
        args += ["--schedule", self.schedule, "--warmup", str(self.warmup)]
        args += ["--lr", f"{1e-3 * self.lr_factor:g}", "--steps", str(self.steps)]
        args += [] if self.onset is None else ["--onset", str(self.onset)]
        run_id = ["--run-id", self.run_id, "--quiet", "--out", str(out)]
        return [sys.executable, "-m", "foreshock.app.cli", "lab", "run", *args, *run_id]


def _healthy() -> list[Spec]:
    """30 healthy runs: every schedule and rate on the three main models, long horizons
    (10,000 steps on the GPT-MoE, 4,000 on transformers MoEs), the Mixtral of the recipe
    issue, and an OLMoE no rule or profile was made on."""
    mix = [("cosine", 100, 1.0), ("linear", 200, 1.0), ("wsd", 100, 1.0)]
    constant = [("constant", 0, 0.5), ("constant", 0, 1.0), ("constant", 0, 2.0)]
    specs = [
        Spec("gpt-moe", "healthy", 400, "linear", 500, steps=10_000),
        Spec("mixtral", "healthy", 400, "wsd", 200, steps=4000),
        Spec("olmoe", "healthy", 400, "cosine", 200, steps=4000),
    ]
    for model in ("gpt-moe", "mixtral", "qwen3-moe"):
        recipes = [*mix, *constant, ("cosine", 100, 2.0)]
        if model == "qwen3-moe":
            recipes = [*mix, constant[0], constant[2]]
        specs += [Spec(model, "healthy", seed, *r) for seed, r in enumerate(recipes, start=402)]
    return [
        *specs,
        Spec("mixtral-l3h160e6", "healthy", 410, "cosine", 200),
        Spec("mixtral-l3h160e6", "healthy", 411, "linear", 100),
        Spec("mixtral-l3h160e6", "healthy", 412, "constant", 0, 0.5),
        Spec("gpt-moe+capacity", "healthy", 410, "wsd", 100),
        Spec("olmoe", "healthy", 410, "linear", 200),
        Spec("olmoe", "healthy", 411, "wsd", 100),
        Spec("olmoe", "healthy", 412, "constant", 0, 2.0),
        Spec("olmoe", "healthy", 413, "constant", 0, 0.5),
    ]


def _faults() -> list[Spec]:
    """20 fault runs: onsets at 20 %, 50 % and 80 % of the horizon under cosine and linear
    decay, and in the stable phase of WSD, where the learning rate is still the peak's."""
    at = ONSETS
    return [
        Spec("gpt-moe", "fa-lowprec", 420, onset=at["20%"]),
        Spec("gpt-moe", "lr-high", 420, "wsd", onset=at["50%"]),
        Spec("gpt-moe", "lr-high", 421, "linear", 200, onset=at["20%"]),
        Spec("gpt-moe+capacity", "router-collapse", 420, "wsd", onset=at["20%"]),
        Spec("gpt-moe+capacity", "router-collapse", 421, onset=at["50%"]),
        Spec("mixtral", "fa-lowprec", 420, onset=at["20%"]),
        Spec("mixtral", "fa-lowprec", 421, "wsd", onset=at["50%"]),
        Spec("mixtral", "fa-lowprec", 422, onset=at["80%"]),
        Spec("mixtral", "fa-lowprec", 423, "linear", 200, onset=at["20%"]),
        Spec("mixtral", "lr-high", 420, onset=at["20%"]),
        Spec("mixtral", "lr-high", 421, "wsd", onset=at["50%"]),
        Spec("mixtral", "lr-high", 422, "linear", 200, onset=at["20%"]),
        Spec("mixtral-l3h160e6", "fa-lowprec", 420, "cosine", 200, onset=at["20%"]),
        Spec("mixtral-l3h160e6", "lr-high", 421, "wsd", onset=at["50%"]),
        Spec("qwen3-moe", "lr-high", 420, "wsd", onset=at["20%"]),
        Spec("qwen3-moe", "lr-high", 421, onset=at["20%"]),
        Spec("qwen3-moe", "fa-lowprec", 420, "wsd", onset=at["20%"]),
        Spec("olmoe", "fa-lowprec", 420, "wsd", onset=at["20%"]),
        Spec("olmoe", "lr-high", 420, "wsd", onset=at["20%"]),
        Spec("olmoe", "lr-high", 421, onset=at["50%"]),
    ]


PLAN = [*_healthy(), *_faults()]


def generate(specs: list[Spec], folder: Path, jobs: int) -> None:
    """Train the missing runs of ``specs`` into ``folder`` (gzipped), ``jobs`` at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [s for s in specs if not (folder / f"{s.run_id}.jsonl.gz").exists()]

    def train(spec: Spec) -> None:
        out = folder / f"{spec.run_id}.jsonl"
        done = subprocess.run(spec.command(out), capture_output=True, text=True)
        if done.returncode != 0:  # one failed run is reported, the others still train
            print(f"FAILED {spec.run_id}: {done.stderr[-2000:]}", file=sys.stderr, flush=True)
            return
        subprocess.run(["gzip", "-f", str(out)], check=True)
        print(f"trained {spec.run_id}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(train, missing))


def _phase(run: Any) -> str | None:
    """The onset phase of a fault run: its onset as a share of the horizon."""
    onset, recipe = run.labels.get("onset"), Recipe.from_labels(run.labels.get("recipe"))
    if onset is None or recipe is None:
        return None
    return f"{round(100 * onset / recipe.horizon)}%"


def _actions(alerts: list[Any]) -> int:
    """The actions the default remediation policy would take on these warnings, in order."""
    remediator = Remediator(RemedyPolicy(), None)
    taken = 0
    for alert in sorted(alerts, key=lambda a: a.step):
        decided = remediator.decide(alert.step, [alert])
        taken += len(decided)
        for decision in decided:
            remediator.apply({**decision, "dry_run": True})
    return taken


def judge_run(path: Path, profiles: Any) -> dict[str, Any]:
    """One run's figures: its recipe, profile, verdict, false warnings and policy actions."""
    run = load_run(path)
    report = replay_run(run, profiles)
    verdict = judge(run.labels["scenario"], report.divergence_step, report.alerts)
    recipe = Recipe.from_labels(run.labels.get("recipe"))
    steps = (run.end or {}).get("last_step", run.records[-1]["step"]) + 1
    return {
        "run": report.run_id,
        "model": report.run_id.split("-" + run.labels["scenario"])[0],
        "scenario": run.labels["scenario"],
        "recipe": recipe.describe() if recipe else "?",
        "schedule": recipe.schedule if recipe else "?",
        "steps": steps,
        "started": run.start.get("time"),
        "profile": report.profile,
        "diverged": report.divergence_step,
        "phase": _phase(run),
        "false": sum(verdict.false_warnings.values()),
        "actions": _actions(report.alerts) if not verdict.faulty else None,
        "right": verdict.attribution == "correct",
        "cause": verdict.cause,
        "lead": verdict.lead(),
    }


def _constant_leads() -> dict[tuple[str, str], Any]:
    """Today's constant-rate zero-shot leads (each architecture held out), stored results."""
    path = ROOT / "benchmarks" / "results" / "zero_shot.json"
    rows = json.loads(path.read_text())["result"]["rows"]
    return {(r["held out"], r["scenario"]): r["median lead"] for r in rows}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The healthy and the fault tables' figures (see the module docstring)."""
    healthy = [r for r in rows if r["scenario"] == "healthy"]
    steps = sum(r["steps"] for r in healthy)
    warned = sum(1 for r in healthy if r["false"])
    faults = [r for r in rows if r["scenario"] != "healthy"]
    diverged = [r for r in faults if r["diverged"] is not None]
    leads: dict[str, list[int]] = defaultdict(list)
    for r in diverged:
        if r["right"] and r["lead"] is not None:
            leads[r["phase"]].append(r["lead"])
    return {
        "healthy_runs": len(healthy),
        "healthy_steps": steps,
        "healthy_warned": warned,
        "false_warnings": sum(r["false"] for r in healthy),
        "false_per_10k_steps": round(1e4 * sum(r["false"] for r in healthy) / max(steps, 1), 3),
        "policy_actions_on_healthy": sum(r["actions"] or 0 for r in healthy),
        "fault_runs": len(faults),
        "diverged": len(diverged),
        "right_before_divergence": sum(1 for r in diverged if r["right"]),
        "not_diverged": [r["run"] for r in faults if r["diverged"] is None],
        "lead_median_by_phase": {p: median(v) for p, v in sorted(leads.items())},
    }


def healthy_table(rows: list[dict[str, Any]]) -> str:
    """Per model and schedule: runs, steps, runs warned, warnings per 10k steps, actions."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["scenario"] == "healthy":
            by[(r["model"], r["schedule"])].append(r)
    lines = []
    for (model, schedule), rs in sorted(by.items()):
        steps = sum(r["steps"] for r in rs)
        false = sum(r["false"] for r in rs)
        warned = sum(1 for r in rs if r["false"])
        actions = sum(r["actions"] or 0 for r in rs)
        profiles = ",".join(sorted({r["profile"] for r in rs}))
        lines.append(
            [
                model,
                schedule,
                len(rs),
                steps,
                warned,
                round(1e4 * false / steps, 2),
                actions,
                profiles,
            ]
        )
    head = ["model", "schedule", "runs", "steps", "warned", "per 10k", "actions", "profile"]
    return format_table(head, lines)


def fault_table(rows: list[dict[str, Any]]) -> str:
    """Per fault run: recipe, onset phase, divergence, first cause, lead, constant-rate lead."""
    constant = _constant_leads()
    lines = [
        [r["run"], r["recipe"], r["phase"], r["diverged"], r["cause"], r["right"], r["lead"],
         constant.get((r["model"], r["scenario"]))]
        for r in rows
        if r["scenario"] != "healthy"
    ]  # fmt: skip
    head = ["run", "recipe", "onset", "diverged", "first cause", "right", "lead", "constant lead"]
    return format_table(head, lines)


def print_tables(rows: list[dict[str, Any]]) -> None:
    print("Healthy runs under recipes: mechanism false warnings, the default policy's actions")
    print(healthy_table(rows))
    print("\nFaults under recipes (lead: divergence - first mechanism warning, right cause)")
    print(fault_table(rows))


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows in the docs (``benchmarks.readme``): the summary, healthy runs per model and
    schedule, fault runs per scenario and onset phase, and the variants tried."""
    s, runs = result["summary"], result["runs"]
    phases = ", ".join(f"{p}: {v}" for p, v in s["lead_median_by_phase"].items())
    healthy = f"{s['healthy_warned']}/{s['healthy_runs']} runs"
    rate = f"{s['false_per_10k_steps']} per 10,000 steps ({s['healthy_steps']} steps)"
    right = f"{s['right_before_divergence']}/{s['diverged']}"
    quiet = f"{len(s['not_diverged'])} fault runs did not diverge"
    rows = [
        ("healthy runs under recipes with a mechanism false warning", f"{healthy}; {rate}"),
        ("the default remediation policy's actions on them", str(s["policy_actions_on_healthy"])),
        ("diverging fault runs warned before divergence, right cause", f"{right} ({quiet})"),
        ("median lead per onset phase (steps)", phases or "-"),
    ]
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        key = (
            (r["model"], r["schedule"])
            if r["scenario"] == "healthy"
            else (r["model"], r["scenario"])
        )
        by[key].append(r)
    for (model, what), rs in sorted(by.items()):
        if rs[0]["scenario"] == "healthy":
            steps = sum(r["steps"] for r in rs)
            warned = sum(1 for r in rs if r["false"])
            rows.append((f"healthy {model}, {what}", f"{warned}/{len(rs)} warned in {steps} steps"))
            continue
        cells = []
        for r in sorted(rs, key=lambda r: (r["phase"] or "", r["run"])):
            where = f"{r['phase']} {r['schedule']}"
            if r["diverged"] is None:
                cells.append(f"{where}: no divergence (first {r['cause']})")
            elif r["lead"] is None or not r["right"]:
                cells.append(f"{where}: diverged at {r['diverged']}, not warned right before")
            else:
                cells.append(f"{where}: lead {r['lead']}, {r['cause']}")
        constant = _constant_leads().get((model, what))
        at_constant = "" if constant is None else f" (constant-rate zero-shot lead: {constant})"
        rows.append((f"{what} on {model}", "; ".join(cells) + at_constant))
    for v in result.get("variants", []):
        named = v["diverged faults named right"]
        value = f"healthy warned {v['healthy warned']}, actions {v.get('actions')}; "
        rows.append((f"calibration runs, {v['variant']}", f"{value}diverged faults right {named}"))
    return rows


class _AtStep100(ScheduleClock):
    """Before the schedule was read: every run's window at step 100."""

    def update(self, step: int, lr: Any) -> int | None:
        return super().update(step, None)


class _AtPeak(ScheduleClock):
    """The window waits for the peak, but counts steps from the run's start."""

    def update(self, step: int, lr: Any) -> int | None:
        return None if super().update(step, lr) is None else step


@dataclass(frozen=True)
class Variant:
    """One way of reading recipes that was tried: the warm-up clock, the σ floor after a
    warm-up (share of the level; None: none), the zero-shot thresholds it was judged with
    (those of the ``first`` or ``second`` freeze, or the ``shipped`` ones), and the weight
    trend: the records it is fitted on and how far back its window ends (None: the
    warm-up's line for good)."""

    clock: type = ScheduleClock
    floor: float | None = 0.04
    thresholds: str = "shipped"
    trend_records: int = 12
    trend_gap: int | None = 8


# The zero-shot thresholds each earlier freeze judged with (16:03 and 18:27 UTC).
FROZEN_THRESHOLDS = {
    "first": ({"router.load_entropy": 0.0341, OPTIMIZER_TEST: 0.25}, 0.1888),
    "second": ({"router.load_entropy": 0.1038, OPTIMIZER_TEST: 0.25}, 0.0875),
}
VARIANTS = {
    "window at step 100 (before recipes)": Variant(_AtStep100, None, "first", 6, None),
    "window at step 100, read from the peak": Variant(_AtPeak, None, "first", 6, None),
    "window 100 steps after the peak": Variant(ScheduleClock, None, "first", 6, None),
    "+ σ floor 2 % after a warm-up (first freeze)": Variant(ScheduleClock, 0.02, "first", 6, None),
    "+ σ floor 4 %": Variant(ScheduleClock, 0.04, "first", 6, None),
    "+ weight trend on 12 records, load entropy floored (second freeze)": Variant(
        thresholds="second", trend_gap=None
    ),
    "+ weight trend refit on the records 8 back, warning at 0.10 nats (chosen)": Variant(),
}


def _profiles(variant: Variant) -> Any:
    """The shipped profiles, with the zero-shot thresholds of an earlier freeze if asked."""
    profiles = shipped_profiles()
    if variant.thresholds in FROZEN_THRESHOLDS:
        frozen, inflation_h = FROZEN_THRESHOLDS[variant.thresholds]
        zero = profiles.configs["zero-shot"]
        thresholds = {**zero.thresholds, **frozen}
        profiles.configs["zero-shot"] = replace(
            zero, thresholds=thresholds, inflation_h=inflation_h
        )
    return profiles


def variants(folder: Path) -> list[dict[str, Any]]:
    """The calibration runs' mechanism false warnings (healthy), the default policy's actions
    on them, and right first warnings (diverged faults) under each variant that was tried."""
    import foreshock.detectors.engine as engine
    import foreshock.detectors.inflation as inflation
    import foreshock.detectors.schedule_clock as clock

    kept = (
        engine.ScheduleClock,
        clock.WARMED_UP_REL_FLOOR,
        inflation.TREND_RECORDS,
        inflation.TREND_GAP,
    )
    paths = sorted(folder.glob("*.jsonl.gz"))
    rows = []
    try:
        for name, variant in VARIANTS.items():
            engine.ScheduleClock = variant.clock  # type: ignore[misc]
            clock.WARMED_UP_REL_FLOOR = variant.floor or 0.0
            inflation.TREND_RECORDS = variant.trend_records
            inflation.TREND_GAP = variant.trend_gap
            judged = [judge_run(p, _profiles(variant)) for p in paths]
            healthy = [r for r in judged if r["scenario"] == "healthy"]
            diverged = [r for r in judged if r["scenario"] != "healthy" and r["diverged"]]
            leads = [r["lead"] for r in diverged if r["right"]]
            rows.append(
                {
                    "variant": name,
                    "healthy warned": f"{sum(1 for r in healthy if r['false'])}/{len(healthy)}",
                    "actions": sum(r["actions"] or 0 for r in healthy),
                    "diverged faults named right": f"{len(leads)}/{len(diverged)}",
                    "lead median": median(leads) if leads else None,
                }
            )
    finally:
        (
            engine.ScheduleClock,  # type: ignore[misc]
            clock.WARMED_UP_REL_FLOOR,
            inflation.TREND_RECORDS,
            inflation.TREND_GAP,
        ) = kept
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", action="store_true", help="train the missing runs first")
    parser.add_argument("--runs", type=Path, default=JUDGED, help="folder of the judged runs")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="judge 6 stored runs only")
    args = parser.parse_args()
    if args.generate:
        generate(PLAN, args.runs, args.jobs)
    paths = sorted(args.runs.glob("*.jsonl.gz"))[: 6 if args.quick else None]
    if not paths:
        sys.exit(f"no runs in {args.runs}: --generate trains them")
    profiles = shipped_profiles()
    rows = [judge_run(p, profiles) for p in paths]
    frozen = time.mktime(time.strptime(FROZEN, "%Y-%m-%dT%H:%M:%S")) - time.timezone
    early = [r["run"] for r in rows if (r["started"] or 0) < frozen]
    if early:
        sys.exit(f"trained before the rules were frozen ({FROZEN}): {early}")
    summary = summarise(rows)
    print_tables(rows)
    tried = variants(CALIBRATION)
    print("\nWhat was tried, on the calibration runs (trained before the rules were frozen)")
    print(format_table(list(tried[0]), [list(r.values()) for r in tried]))
    emit_json({"benchmark": "recipes", "summary": summary, "variants": tried, "runs": rows})


if __name__ == "__main__":
    main()
