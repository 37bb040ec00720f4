"""What each remedy costs a healthy run: the price of one false action.

A warning on a healthy run is a false one, and with remediation on it is an action. Whether an
action may run unasked where the profile is uncertain (the zero-shot profile; a rule whose
stated per-run false-alarm rate is high) depends on what it costs when it is wrong. Each
variant here trains the same healthy transformers MoE through the Hugging Face Trainer and
foreshock's callback (``remedy=RemedyPolicy()``, its ``lr_scheduler_type="cosine"`` with a
warm-up), and at step ``--at`` hands the callback's remediation one false warning of a family
— as if the detectors had opened it, its evidence from 50 steps before — so the default policy
decides and applies its remedy through the same code as a real warning:

* ``attention-numerics``: ``precise-attention`` (the model trains with ``eager`` attention;
  the remedy switches every layer to SDPA);
* ``optimizer``: ``hold-lr`` (× 0.5 of the rate when the evidence began, held to the end);
* ``router``: ``scale-router-lr`` (the newest snapshot before the evidence restored, then the
  routers' rate × 0.1);
* ``stop``: the policy with every action ``stop``;
* ``precise-attention+rollback``, ``hold-lr+rollback``: as on the zero-shot profile, where
  every action first restores the newest snapshot before the evidence, and the run is
  lengthened by the steps undone (the dataset is half again as long as the run).

The callback's own detectors run with no rule, so the injected warning is the only one any
action answers (with the zero-shot rules this tiny Mixtral's healthy runs got their own
attention warnings: see docs/remediation.md). Per variant and seed: the held-out loss at the
end (nats/token, 16 fixed batches of text the run never trained on) and its change from the
same seed with no action, the steps re-done, and the steps trained; beside them the spread
of the no-action runs' held-out loss over seeds, the noise any change must exceed.

    python -m benchmarks.action_cost            # 3 seeds, 600 steps (~10 min on 2 cores)
    python -m benchmarks.action_cost --quick    # 1 seed, 200 steps
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ._table import emit_json, format_table

SEQ, BATCH, PEAK, EVERY = 64, 8, 1e-3, 25
FAMILIES = {  # variant -> the family of the false warning
    "none": None,
    "precise-attention": "attention-numerics",
    "hold-lr": "optimizer",
    "scale-router-lr": "router",
    "stop": "attention-numerics",
    # as on the zero-shot profile (``rollback_uncalibrated``): the snapshot before the
    # evidence restored first, the run lengthened by the steps undone
    "precise-attention+rollback": "attention-numerics",
    "hold-lr+rollback": "optimizer",
}


def _model(attention: str) -> Any:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
        max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        attn_implementation=attention,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config)


def _windows(n: int, seed: int) -> list[Any]:
    from foreshock.lab.data import ByteBatches, stdlib_bytes

    batches = ByteBatches(stdlib_bytes(1_000_000), SEQ, BATCH, seed=seed)
    return [row for _ in range(math.ceil(n / BATCH)) for row in batches.next()[0]][:n]


def _false_warning(family: str, step: int) -> Any:
    """A warning the detectors could have opened at ``step``, its evidence from step − 50."""
    from foreshock.transport.warning import Role, RunWarning

    role = Role.OPTIMIZER if family == "optimizer" else Role.CAUSE
    recent = [[step - 50, 1.0, 3.0], [step - 25, 1.1, 3.5], [step, 1.2, 4.0]]
    return RunWarning(
        f"false-{family}-{step}", "cost", family, None, "injected", "up", step, role,
        1.0, 1.0, None, "cost", {"recent": recent},
    )  # fmt: skip


def _held_out_loss(model: Any) -> float:
    """Mean next-byte loss on 16 fixed batches from seed 10**6 (nats/token)."""
    import torch

    model.eval()
    losses = []
    with torch.no_grad():
        for i in range(16):
            x = torch.stack(_windows(BATCH, 10**6 + i))
            losses.append(float(model(input_ids=x, labels=x).loss))
    return statistics.mean(losses)


def train(job: tuple[str, int, int, int]) -> dict[str, Any]:
    """One healthy run with one false warning of ``variant``'s family at step ``at``."""
    import torch
    import transformers

    from foreshock.detectors.config import DetectorConfig
    from foreshock.integrations.huggingface import ForeshockCallback
    from foreshock.remediation.remedy import DEFAULT_ACTIONS, RemedyPolicy
    from foreshock.transport.run_files import load_run

    variant, seed, steps, at = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    policy = RemedyPolicy()
    if variant == "stop":
        policy = replace(policy, actions=dict.fromkeys(DEFAULT_ACTIONS, "stop"))
    if variant.endswith("+rollback"):
        policy = replace(policy, rollback=True)
    family = FAMILIES[variant]

    class FalseWarning(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            runner = callback.remedy.runner
            if family is not None and state.global_step == at and runner is not None:
                runner.at_boundary(at, [_false_warning(family, at)])
                control.should_training_stop = control.should_training_stop or runner.stopped

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        # detectors with no rule: the injected warning is the only one any action answers
        silent = DetectorConfig(())
        callback = ForeshockCallback(
            path, run_id=f"cost-{variant}", every=EVERY, warnings=silent, remedy=policy
        )
        args = transformers.TrainingArguments(
            output_dir=str(Path(tmp) / "out"), max_steps=steps, per_device_train_batch_size=BATCH,
            learning_rate=PEAK, lr_scheduler_type="cosine", warmup_steps=steps // 10,
            save_strategy="no", report_to="none", use_cpu=True, seed=seed, disable_tqdm=True,
            logging_steps=steps,
        )  # fmt: skip
        # longer than the run: a rollback's steps are trained again (``extend_horizon``)
        data = [{"input_ids": x, "labels": x} for x in _windows(steps * BATCH * 3 // 2, seed)]
        model = _model("eager")
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=data, callbacks=[FalseWarning(), callback]
        )
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
        trainer.train()
        end = load_run(path).end or {}
    remedy = end.get("remedy") or {}
    return {
        "variant": variant,
        "seed": seed,
        "actions": [(a["kind"], a["applied"], a.get("error")) for a in remedy.get("actions", [])],
        "steps_redone": remedy.get("steps_redone", 0),
        "steps_trained": trainer.state.global_step,
        "status": end.get("status"),
        "held_out_loss": round(_held_out_loss(model), 4),
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant: the median change in held-out loss from the same seed with no action."""
    base = {r["seed"]: r["held_out_loss"] for r in runs if r["variant"] == "none"}
    rows = []
    for variant in FAMILIES:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        change = [r["held_out_loss"] - base[r["seed"]] for r in mine if r["seed"] in base]
        loss = statistics.median(r["held_out_loss"] for r in mine)
        rows.append(
            {
                "variant": variant,
                "runs": len(mine),
                "held-out loss (median)": round(loss, 4),
                "held-out loss (min-max)": [
                    min(r["held_out_loss"] for r in mine),
                    max(r["held_out_loss"] for r in mine),
                ],
                "change vs no action (median)": round(statistics.median(change), 4)
                if change
                else None,
                "steps re-done (median)": statistics.median(r["steps_redone"] for r in mine),
                "steps trained (median)": statistics.median(r["steps_trained"] for r in mine),
            }
        )
    return rows


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows: per variant, the held-out loss change and the steps."""
    rows = []
    for r in result["rows"]:
        change = r["change vs no action (median)"]
        low, high = r["held-out loss (min-max)"]
        value = (
            f"held-out loss {r['held-out loss (median)']} nats/token [{low}, {high}]"
            + ("" if change is None or r["variant"] == "none" else f" ({change:+.4f})")
            + f"; {r['steps re-done (median)']} steps re-done, {r['steps trained (median)']}"
            f" trained ({r['runs']} runs)"
        )
        what = "no action" if r["variant"] == "none" else f"a false {r['variant']}"
        rows.append((f"{what} at step {result['at']} of {result['steps']}", value))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 200 steps")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds, steps = (1, 200) if args.quick else (args.seeds, args.steps)
    at = steps // 2
    jobs = [(v, s, steps, at) for s in range(seeds) for v in FAMILIES]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = list(pool.map(train, jobs))
    rows = summarise(runs)
    print(f"One false warning at step {at} of {steps} on a healthy Mixtral (HF Trainer, cosine)")
    print(format_table(list(rows[0]), [list(r.values()) for r in rows]))
    emit_json({"benchmark": "action_cost", "steps": steps, "at": at, "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
