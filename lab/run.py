"""One labelled lab run: train a lab architecture with a fault scenario and the Monitor attached.

``arch`` is the lab's own GPT-MoE or a transformers model (Mixtral, Llama, Qwen3-MoE, OLMoE,
DeepSeek-V3: :mod:`foreshock.lab.arch`); the labels record it, the dispatch (dropless or
capacity-limited) and the detector ``profile`` they make together, so that a replay applies
the calibration that fits the run, and what was built (``arch_config``, ``parameters``).

The run is written through the file sink as JSON Lines: a ``start`` record (labels: scenario,
seed, onset, magnitude, model dimensions and optimizer config, versions), the Monitor's metric
records, and an ``end`` record (status, divergence step by :mod:`foreshock.detectors.divergence`,
CPU time).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from foreshock import __version__
from foreshock.detectors.divergence import DivergenceRule, divergence_step
from foreshock.detectors.profiles import profile_of
from foreshock.producers.monitor import Monitor, MonitorConfig
from foreshock.producers.sinks import JsonlSink, Sink
from foreshock.recipe import Recipe
from foreshock.remediation.remedy import RemedyPolicy, policy_summary
from foreshock.transport.records import RUN_SCHEMA, finite_or_none

from .anchors import anchor
from .arch import LabModel, build, check_fault
from .data import ByteBatches, stdlib_bytes
from .faults import Fault
from .lab_model import set_switch
from .loss_trigger import LossTriggerPolicy
from .model import GPTConfig
from .remedies import LabRemedies

__all__ = ["RUN_SCHEMA", "LabResult", "RunConfig", "config_from_labels", "run_lab"]


@dataclass(frozen=True)
class RunConfig:
    fault: Fault = field(default_factory=Fault)
    seed: int = 0
    steps: int = 1600
    every: int = 25
    batch_size: int = 16
    lr: float = 1e-3  # the peak learning rate
    weight_decay: float = 0.1
    schedule: str = "constant"  # the recipe (foreshock.recipe): constant|cosine|linear|wsd
    warmup: int = 0  # linear warm-up steps
    decay_start: int | None = None  # wsd: the decay's first step (default 80 % of the horizon)
    horizon: int | None = None  # the schedule's horizon (default ``steps``)
    model: GPTConfig = field(default_factory=GPTConfig)
    divergence: DivergenceRule = field(default_factory=DivergenceRule)
    after_divergence: int | None = 250  # steps kept past the divergence step; None = horizon
    name: str | None = None  # the run id; default "[<arch>-]<scenario>-s<seed>"
    project: str | None = None  # a label the dashboard filters on
    arch: str = "gpt-moe"  # "gpt-moe" (the lab's own) or a transformers one (arch.ARCHS)
    policy: RemedyPolicy | None = None  # act on warnings in the run (lab.remedies); None: off
    loss_trigger: LossTriggerPolicy | None = None  # the loss-triggered rollback baseline
    anchor: str | None = None  # an always-on guard at every step (lab.anchors.ANCHORS)

    @property
    def recipe(self) -> Recipe:
        """The learning-rate schedule over ``steps`` (validated: a bad one is refused)."""
        horizon = self.horizon or self.steps
        return Recipe(self.schedule, self.lr, self.warmup, horizon, self.decay_start)

    @property
    def run_id(self) -> str:
        prefix = "" if self.arch == "gpt-moe" else f"{self.arch}-"
        return self.name or f"{prefix}{self.fault.scenario}-s{self.seed}"


@dataclass
class LabResult:
    run_id: str
    path: Path | None
    divergence_step: int | None
    losses: list[float]
    cpu_seconds: float
    wall_seconds: float


class _Progress:
    """A one-line progress bar on stderr: step, loss, ETA."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.start = total, enabled, time.perf_counter()

    def update(self, step: int, loss: float) -> None:
        if not self.enabled or (step % 10 and step != self.total - 1):
            return
        done = step + 1
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done)
        bar = "#" * (30 * done // self.total)
        print(
            f"\r[{bar:<30}] {done}/{self.total} loss {loss:6.3f} ETA {eta:5.0f}s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def _labels(config: RunConfig, lab: LabModel) -> dict[str, Any]:
    project = {} if config.project is None else {"project": config.project}
    if lab.settings:  # a transformers model: its config as built, and the library's version
        import transformers

        built = {"arch_config": lab.settings, "transformers": transformers.__version__}
    else:
        built = {}
    labels = {
        **project,
        "arch": config.arch,
        "dispatch": dispatch_of(config.model),
        "scenario": config.fault.scenario,
        "seed": config.seed,
        "onset": config.fault.onset if config.fault.scenario != "healthy" else None,
        "magnitude": config.fault.magnitude if config.fault.scenario != "healthy" else None,
        "fault": config.fault.labels(),
        "steps": config.steps,
        "after_divergence": config.after_divergence,
        "every": config.every,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "recipe": config.recipe.to_labels(),
        "weight_decay": config.weight_decay,
        "model": asdict(config.model),  # dimensions: n_layer, n_embd, n_head, n_kv_head, ...
        **built,
        **({} if config.policy is None else {"remedy": policy_summary(config.policy)}),
        **({} if config.loss_trigger is None else {"loss_trigger": config.loss_trigger.summary()}),
        **({} if config.anchor is None else {"anchor": config.anchor}),
        "parameters": lab.n_parameters,
        "divergence_rule": asdict(config.divergence),
        "foreshock": __version__,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # which kernels ran
    }
    return {**labels, "profile": profile_of(labels)}


def dispatch_of(model: GPTConfig) -> str:
    """ "dropless", or "capacity-<c>" for capacity-limited expert dispatch."""
    c = model.capacity_factor
    return f"capacity-{c:g}" if c else "dropless"


def config_from_labels(labels: dict[str, Any], steps: int | None = None) -> RunConfig:
    """The RunConfig a recorded run's ``start`` labels describe (the inverse of its labels).

    ``steps`` overrides the horizon, e.g. to retrain only a run's first records. The run id is
    the default one, so the config trains a run under its own name.
    """
    recipe = Recipe.from_labels(labels.get("recipe")) or Recipe(lr=labels["lr"])
    return RunConfig(
        fault=Fault(**labels["fault"]),
        schedule=recipe.schedule,
        warmup=recipe.warmup,
        decay_start=recipe.decay_start,
        horizon=recipe.horizon if recipe.horizon != labels["steps"] else None,
        seed=labels["seed"],
        steps=labels["steps"] if steps is None else steps,
        every=labels["every"],
        batch_size=labels["batch_size"],
        lr=labels["lr"],
        weight_decay=labels["weight_decay"],
        model=GPTConfig(**labels["model"]),
        divergence=DivergenceRule(**labels["divergence_rule"]),
        after_divergence=labels["after_divergence"],
        arch=labels.get("arch", "gpt-moe"),
        anchor=labels.get("anchor"),
    )


def _param_groups(lab: LabModel, fault: Fault) -> list[dict[str, Any]] | Any:
    """One group, or — for a router-only learning-rate fault — routers apart from the rest."""
    if not fault.router_only:
        return lab.model.parameters()
    routers = {id(w) for w in lab.routers}
    rest = [p for p in lab.model.parameters() if id(p) not in routers]
    return [
        {"params": list(lab.routers), "faulted": True},
        {"params": rest, "faulted": False},
    ]


def _attach(lab: LabModel, monitor: Monitor) -> None:
    """The lab's observers: each attention layer's max logit, each capacity router's drops."""
    for name, layer in lab.attention.items():
        set_switch(layer, "logit_observer", lambda s, n=name: monitor.observe_max_logit(n, s))
    for name, moe in lab.moe.items():
        observe = monitor.observe_router_drops
        set_switch(moe, "drop_observer", lambda d, a, n=name, o=observe: o(n, d, a))


def _past_divergence(losses: list[float], config: RunConfig) -> bool:
    """True once the run is ``after_divergence`` steps past its divergence step (checked every
    25 steps: the rule rescans the whole loss history)."""
    if config.after_divergence is None or len(losses) % 25:
        return False
    diverged_at = divergence_step(losses, config.divergence)
    return diverged_at is not None and len(losses) - 1 >= diverged_at + config.after_divergence


def _rewound(
    remedies: LabRemedies,
    update: int,
    record: dict[str, Any] | None,
    losses: list[float],
    batches: ByteBatches,
) -> bool:
    """The remedies' turn after a step; True when a rollback restored an earlier step: the
    history is cut back to it and the batches a restore skips are drawn and dropped."""
    remedies.after_record(update, record)
    remedies.after_loss(losses)
    restored = remedies.take_rewind()
    if restored is None:
        return False
    del losses[restored:]
    skip = remedies.trigger.policy.skip_batches if remedies.trigger is not None else 0
    for _ in range(skip):
        batches.next()
    return True


def _status(diverged_at: int | None, remedies: LabRemedies | None) -> str:
    if diverged_at is not None:
        return "diverged"
    return "stopped" if remedies is not None and remedies.stopped else "finished"


def _remedy_summary(remedies: LabRemedies) -> dict[str, Any]:
    """What the policy did, for the end record: its actions, steps re-done, snapshot bytes."""
    ring = remedies.ring
    return {
        "actions": [a.to_message() for a in remedies.actions],
        "rollbacks": len(remedies.trigger.fired) if remedies.trigger is not None else 0,
        "steps_redone": remedies.redone,
        "snapshot_bytes": 0 if ring is None else ring.nbytes,
    }


def run_lab(
    config: RunConfig, out: str | Path | None, progress: bool = True, sink: Sink | None = None
) -> LabResult:
    """Train one run and write it to ``sink``, or to the JSON Lines file ``out`` (replaced)."""
    check_fault(config.arch, config.fault, config.model.n_experts)  # before the file is replaced
    recipe = config.recipe
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    path = Path(out) if out is not None else None
    if sink is None:
        if path is None:
            raise ValueError("run_lab needs an output path or a sink")
        path.unlink(missing_ok=True)
        sink = JsonlSink(path)
    lab = build(config.arch, config.model)
    model = lab.model
    optimizer = torch.optim.AdamW(
        _param_groups(lab, config.fault),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=True,  # one kernel for all parameters: ~8 % of a CPU step saved
    )
    batches = ByteBatches(stdlib_bytes(), config.model.block_size, config.batch_size, config.seed)
    monitor = Monitor(
        model,
        sink,
        run_id=config.run_id,
        config=MonitorConfig(every=config.every, spectra_worker=False),  # one thread a run
        optimizer=optimizer,
    )
    _attach(lab, monitor)
    start = {
        "schema": RUN_SCHEMA,
        "kind": "start",
        "run_id": config.run_id,
        "time": time.time(),
        "labels": _labels(config, lab),
        "monitor": monitor.describe(),
    }
    sink.write(start)
    remedies = None
    if config.policy is not None or config.loss_trigger is not None:
        remedies = LabRemedies(config.policy, lab, optimizer, start, trigger=config.loss_trigger)
    guard = None if config.anchor is None else anchor(config.anchor)
    params = [p for p in lab.model.parameters() if p.requires_grad]
    bar = _Progress(config.steps, progress)
    losses: list[float] = []
    cpu0, wall0, monitor_seconds = time.process_time(), time.perf_counter(), 0.0
    torch.set_flush_denormal(True)  # subnormals take a slow path on x86: ~5 % of a step
    try:
        update = 0  # the optimizer updates done; the step is the run's history length
        while len(losses) < config.steps:
            step = len(losses)  # behind ``update`` after a rollback: the schedule rewinds
            fault = config.fault
            fault.apply_attention(list(lab.attention.values()), step)
            if remedies is not None:
                remedies.before_step(step)
            for group in optimizer.param_groups:
                faulted = group.get("faulted", True)
                factor = fault.lr_factor(step) if faulted else 1.0
                if remedies is not None:
                    factor = remedies.lr_factor(factor, faulted)
                group["lr"] = recipe.lr_at(step) * factor
            batches.batch_size = fault.batch_size(config.batch_size, step)
            x, y = batches.next()
            loss = lab.loss(x, y)
            loss.backward()
            if guard is not None:
                guard.before_step(params, optimizer)
            optimizer.step()
            if lab.after_step is not None:
                lab.after_step()  # e.g. DeepSeek-V3's router-bias update
            tick = time.perf_counter()
            record = monitor.step(update, loss=loss)
            monitor_seconds += time.perf_counter() - tick
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            update += 1
            bar.update(step, losses[-1])
            if remedies is not None and _rewound(remedies, update - 1, record, losses, batches):
                continue
            if len(losses) > config.divergence.warmup and not torch.isfinite(loss):
                break  # nothing more to learn from a NaN run
            if _past_divergence(losses, config) or (remedies is not None and remedies.stopped):
                break
    finally:
        torch.set_flush_denormal(False)  # process-wide: do not leak it to the caller
    bar.close()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    diverged_at = divergence_step(losses, config.divergence)
    sink.write(
        {
            "schema": RUN_SCHEMA,
            "kind": "end",
            "run_id": config.run_id,
            "time": time.time(),
            "status": _status(diverged_at, remedies),
            "divergence_step": diverged_at,
            "last_step": len(losses) - 1,
            "records": monitor.records_written,
            "monitor_errors": monitor.errors,
            "final_loss": finite_or_none(losses[-1]),
            "best_loss": min((x for x in losses if math.isfinite(x)), default=None),
            "cpu_seconds": round(cpu, 2),
            "wall_seconds": round(wall, 2),
            "monitor_seconds": round(monitor_seconds, 3),
            **({} if remedies is None else _remedy_summary(remedies)),
        }
    )
    monitor.close()
    return LabResult(config.run_id, path, diverged_at, losses, cpu, wall)
