"""Remediation through the Hugging Face Trainer on models no profile was calibrated on.

The lab's remediation table (``benchmarks.remediation``) trains in the lab's own loop, on the
models the shipped profiles know. A user's run is neither: it trains through the HF Trainer,
with its own schedule, and no label names a profile, so the zero-shot profile judges it. Each
run here is that: a transformers model of an architecture no profile was calibrated on (the
lab's Qwen2-MoE and dense Qwen2 by default: outside the zero-shot profile's calibration pool
and without a profile of their own), built from its config with the lab's attention kernel
(:mod:`foreshock.lab.hf_attention`: where the fault lives), trained by ``transformers.Trainer``
under warm-up then WSD decay (``lr_scheduler_type="warmup_stable_decay"``), with foreshock's
callback (``remedy=RemedyPolicy()``, no labels: on the zero-shot profile every action rolls
back first; ``foreshock-no-rollback``: ``rollback_uncalibrated = false``, the router's rollback
alone, as on a calibrated profile) or one of the always-on anchors
(:mod:`foreshock.lab.anchors`, at the Trainer's ``on_pre_optimizer_step``). Faults are the
lab's, injected into the training computation by a callback before foreshock's:

* ``fa-lowprec``: the attention backward's biased rounding from the onset (20 % of the run);
* ``lr-high``: every learning rate × 100^(progress over 300 steps) from the onset, on top of
  the schedule the Trainer's scheduler sets.

Per architecture, scenario and policy: runs, diverged (the project's rule, the callback's end
record); of the seeds that diverged with no action, those kept from diverging, those saved
(kept from diverging and ending with a held-out loss within the healthy runs' range: at most
their highest), and the median held-out loss above (or below) that highest [nats/token];
actions and the steps they re-did (a rollback lengthens the run by them: the dataset is longer
than the run), and for the healthy runs (``foreshock`` only) the runs with an automatic action.

    python -m benchmarks.hf_remediation --quick   # 1 seed, 2 healthy per arch
    python -m benchmarks.hf_remediation           # 3 fault seeds, 10 healthy per arch

``--policies foreshock --merge OLD.json`` trains only foreshock's runs and takes every other
run from an earlier result's last line (the runs of the other policies never construct a
remedy, so a change to the remedies leaves them as they were; foreshock's healthy runs with no
action likewise, and they are retrained all the same).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ._table import emit_json, format_table

STEPS, ONSET, BATCH, PEAK, EVERY = 1200, 240, 16, 1e-3, 25
DATA = STEPS * 3 // 2  # batches in the dataset
ARCHS = ("qwen2-moe", "qwen2")
POLICIES = ("none", "foreshock", "foreshock-no-rollback", "zclip", "clip-1.0", "spam")
# foreshock's variants: the default policy (on the zero-shot profile, every action restores
# the newest snapshot before the warning's first evidence first); the same without that
# rollback (the router's alone, as on a calibrated profile)
FORESHOCK = {"foreshock": {}, "foreshock-no-rollback": {"rollback_uncalibrated": False}}
FAULTS = ("fa-lowprec", "lr-high")


def _callbacks(scenario: str, policy: str, lab: Any, path: Path) -> tuple[list[Any], Any]:
    """The fault's callback, the anchor's (if any), and foreshock's: in that order, so the
    rates foreshock keeps are the faulted ones."""
    import transformers

    from foreshock.integrations.huggingface import ForeshockCallback
    from foreshock.lab.anchors import ANCHORS, anchor
    from foreshock.lab.faults import Fault
    from foreshock.remediation.remedy import RemedyPolicy

    fault = Fault.default(scenario, onset=ONSET, ramp=300) if scenario != "healthy" else None
    layers = list(lab.attention.values())
    guard = anchor(policy) if policy in ANCHORS else None

    class Inject(transformers.TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if fault is None:
                return
            fault.apply_attention(layers, state.global_step)
            factor = fault.lr_factor(state.global_step)
            if factor != 1.0:
                for group in kw["optimizer"].param_groups:
                    group["lr"] = group["lr"] * factor

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if guard is not None:
                params = [p for p in kw["model"].parameters() if p.requires_grad]
                guard.before_step(params, kw["optimizer"])

    remedy = RemedyPolicy(**FORESHOCK[policy]) if policy in FORESHOCK else None
    foreshock = ForeshockCallback(path, run_id=f"{scenario}-{policy}", every=EVERY, remedy=remedy)
    return [Inject(), foreshock], foreshock


def train(job: tuple[str, str, int, str]) -> dict[str, Any]:
    """One run: (arch, scenario, seed, policy) → what its end record and held-out loss say."""
    import torch
    import transformers

    from foreshock.lab.arch import build, default_model
    from foreshock.lab.data import ByteBatches, stdlib_bytes
    from foreshock.lab.hf_attention import register
    from foreshock.transport.run_files import load_run

    arch, scenario, seed, policy = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    register()
    config = default_model(arch)
    lab = build(arch, config)
    batches = ByteBatches(stdlib_bytes(), config.block_size, BATCH, seed=seed)
    # more batches than the run's steps: a rollback's steps re-done lengthen it (the callback's
    # ``extend_horizon``), as they would a user's run on a dataset longer than max_steps
    data = [{"input_ids": x, "labels": x} for _ in range(DATA) for x in batches.next()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        callbacks, foreshock = _callbacks(scenario, policy, lab, path)
        args = transformers.TrainingArguments(
            output_dir=str(Path(tmp) / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
            learning_rate=PEAK, weight_decay=0.1, lr_scheduler_type="warmup_stable_decay",
            warmup_steps=STEPS // 10, lr_scheduler_kwargs={"num_decay_steps": STEPS // 5},
            save_strategy="no", report_to="none", use_cpu=True, seed=seed, disable_tqdm=True,
            logging_steps=STEPS,
        )  # fmt: skip
        trainer = transformers.Trainer(
            model=lab.model, args=args, train_dataset=data, callbacks=callbacks
        )
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
        trainer.train()
        run = load_run(path)
    end = run.end or {}
    remedy = end.get("remedy") or {}
    applied = [a for a in remedy.get("actions", []) if a["applied"]]
    return {
        "arch": arch,
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "profile": foreshock.feed.detector.profile.name if foreshock.feed.detector else None,
        "divergence_step": end.get("divergence_step"),
        "actions": [a["kind"] for a in applied],
        "acted_at": [[a["step"], a.get("rolled_back_to")] for a in applied],
        "steps_redone": remedy.get("steps_redone", 0),
        "held_out_loss": _held_out_loss(lab.model, config.block_size),
    }


def _held_out_loss(model: Any, block: int) -> float | None:
    """Mean next-byte loss on 8 fixed batches the runs never train on (nats/token)."""
    import torch

    from foreshock.lab.data import ByteBatches, stdlib_bytes

    model.eval()
    batches = ByteBatches(stdlib_bytes(), block, BATCH, seed=10**6)
    with torch.no_grad():
        losses = [float(model(input_ids=(x := batches.next()[0]), labels=x).loss) for _ in range(8)]
    value = statistics.mean(losses)
    return round(value, 4) if math.isfinite(value) else None


def jobs(
    seeds: int, healthy: int, archs: tuple[str, ...], policies: tuple[str, ...] = POLICIES
) -> list[tuple[str, str, int, str]]:
    out = [(a, "healthy", s, "foreshock") for a in archs for s in range(100, 100 + healthy)]
    out = out if set(FORESHOCK) & set(policies) else []
    for arch in archs:
        for scenario in FAULTS:
            out += [(arch, scenario, s, p) for s in range(seeds) for p in policies]
    return out


def merged(runs: list[dict[str, Any]], earlier: Path) -> list[dict[str, Any]]:
    """``runs`` over an earlier result's runs (its last line), by (arch, scenario, seed,
    policy)."""
    text = earlier.read_text().strip()
    try:  # a stored result (benchmarks/results/), else a run's output (its last line)
        old = json.loads(text)
    except json.JSONDecodeError:
        old = json.loads(text.splitlines()[-1])
    key = lambda r: (r["arch"], r["scenario"], r["seed"], r["policy"])  # noqa: E731
    fresh = {key(r) for r in runs}
    return [r for r in old.get("result", old)["runs"] if key(r) not in fresh] + runs


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for arch in sorted({r["arch"] for r in runs}):
        healthy = [r for r in runs if r["arch"] == arch and r["scenario"] == "healthy"]
        losses = [r["held_out_loss"] for r in healthy if r["held_out_loss"] is not None]
        ceiling = max(losses, default=math.inf)
        rows.append(
            {**_row(arch, "healthy", "foreshock", healthy, None), "not diverged": "-",
             "held-out above healthy max": None, "inside the healthy band (every seed)": "-"}
        )  # fmt: skip
        for scenario in FAULTS:
            of = [r for r in runs if r["arch"] == arch and r["scenario"] == scenario]
            needing = {r["seed"] for r in of if r["policy"] == "none" and r["divergence_step"]}
            for policy in POLICIES:
                mine = [r for r in of if r["policy"] == policy]
                judged = [r for r in mine if r["seed"] in needing]
                saved = [
                    r
                    for r in judged
                    if r["divergence_step"] is None and (r["held_out_loss"] or math.inf) <= ceiling
                ]
                row = _row(arch, scenario, policy, mine, f"{len(saved)}/{len(judged)}")
                row["not diverged"] = f"{sum(r['divergence_step'] is None for r in judged)}/"
                row["not diverged"] += str(len(judged))
                gaps = [(r["held_out_loss"] or math.inf) - ceiling for r in judged]
                row["held-out above healthy max"] = (
                    round(statistics.median(gaps), 4) if gaps else None
                )
                inside = [
                    r
                    for r in mine
                    if r["divergence_step"] is None and (r["held_out_loss"] or math.inf) <= ceiling
                ]
                row["inside the healthy band (every seed)"] = f"{len(inside)}/{len(mine)}"
                rows.append(row)
    return rows


def _row(arch: str, scenario: str, policy: str, mine: list[dict], saved: str | None) -> dict:
    return {
        "arch": arch,
        "scenario": scenario,
        "policy": policy,
        "runs": len(mine),
        "diverged": sum(r["divergence_step"] is not None for r in mine),
        "saved": saved or "-",
        "runs with an action": sum(bool(r["actions"]) for r in mine),
        "steps re-done (median)": statistics.median([r.get("steps_redone", 0) for r in mine])
        if mine
        else 0,
        "profile": ",".join(sorted({str(r["profile"]) for r in mine})),
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (
            f"{r['arch']}, {r['scenario']}, {r['policy']}",
            f"{r['diverged']}/{r['runs']} diverged; of those that diverged with no action: "
            f"{r['not diverged']} kept from diverging, saved {r['saved']} (median held-out loss "
            f"{_gap(r['held-out above healthy max'])} the healthy runs' highest); every seed: "
            f"{r['inside the healthy band (every seed)']} ended inside the healthy band; "
            f"{r['runs with an action']} runs with an action, median "
            f"{r['steps re-done (median)']:g} steps re-done (profile {r['profile']})"
            if r["scenario"] != "healthy"
            else f"{r['diverged']}/{r['runs']} diverged; {r['runs with an action']} runs with an "
            f"action (profile {r['profile']})",
        )
        for r in result["rows"]
    ]


def _gap(gap: float | None) -> str:
    if gap is None or not math.isfinite(gap):
        return "n/a vs"
    return f"{abs(gap):.4f} nats {'above' if gap > 0 else 'below'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 fault seed, 2 healthy runs")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--healthy", type=int, default=10)
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--policies", default=",".join(POLICIES), help="the policies to train")
    parser.add_argument("--merge", type=Path, help="take the other runs from this result")
    args = parser.parse_args()
    seeds, healthy = (1, 2) if args.quick else (args.seeds, args.healthy)
    policies = tuple(args.policies.split(","))
    todo = jobs(seeds, healthy, tuple(args.archs.split(",")), policies)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = []
        for run in pool.map(train, todo):
            runs.append(run)
            print(f"[{len(runs)}/{len(todo)}] {run}", file=sys.stderr, flush=True)
    if args.merge is not None:
        runs = merged(runs, args.merge)
    rows = [r for r in summarise(runs) if r["runs"]]
    print(format_table(list(rows[0]), [list(r.values()) for r in rows]))
    emit_json({"benchmark": "hf_remediation", "steps": STEPS, "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
