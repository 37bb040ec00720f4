"""Monitor overhead as a fraction of training-step time, at δ = 10 and δ = 100, side by side.

What it measures: a small GPT-MoE from ``foreshock.lab`` (4 layers, 4 heads, width 128, 8
experts top-2 at the lab's default expert width, context 64, batch 8: 512 tokens per step, ~2.4 M
parameters — the run prints the count; AdamW, byte-level stdlib text), single-threaded, with a
Monitor (default MonitorConfig, a JsonlSink to a temp file, max-logit observers on every
attention layer as in ``producers.smoke``) at every = δ ∈ {10, 100}, against no monitor.
Target: ≤ 2 % at δ = 10. A small model is the hard case: the monitor's cost is per layer, not
per token, so a bigger batch or context only dilutes it (``--block-size`` sets the context).

Two measures, both as fractions of the no-monitor step time of the same round:

* end to end: (mean step time with the monitor − without) / without. Steps are timed from the
  batch fetch to ``zero_grad``, so the monitor's call and its forward hooks are inside;
* direct: time spent inside the monitor per step — ``Monitor.step()`` plus its router forward
  hooks (timed by two plain hooks registered before and after the monitors') plus the max-logit
  observer calls — amortized over the round. It leaves out indirect costs (cache pollution) but
  is far less noisy than a difference of two noisy step times on a shared machine.

Design — interleaving, and keeping the inactive monitor out of the way. One process runs the
three configurations (no monitor, δ = 10, δ = 100) in blocks of 10 steps, in an order rotated
every block triple, so machine noise and drift (seconds to minutes on a shared machine) hit all
three alike. A *round* is 100 steps of each configuration (10 blocks each, ~1 min in all); each
figure is the median over rounds of the per-round paired ratio, with the quartiles beside it.
One Monitor per δ is created at the start and kept for the whole run, so its snapshots persist
(a fresh Monitor's first monitoring step only snapshots, and would understate the cost). Each
monitor counts its own steps; its blocks cover its steps 10j+1 … 10j+10, so a round holds exactly
100/δ monitoring steps, each preceded (in the same block) by the arming step that lets the
router hooks gather that step's routing, and every block ends on a step after which the monitor
is disarmed ((10j+11) % δ ≠ 0). A monitor outside its block therefore costs only its disarmed
hooks' early return (µs per step, in every block alike, the baseline included); the benchmark
checks after every block that it is disarmed. Before the rounds each monitor is warmed (one
snapshot, one full measurement; untimed). The δ between a monitor's snapshots is counted in its
own steps, not training steps (the other configurations train in between): that changes the
values it measures, not their cost.

    python -m benchmarks.overhead            # 9 rounds (~7 min)
    python -m benchmarks.overhead --quick    # 2 rounds (~2 min)
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.producers.monitor import Monitor, MonitorConfig
from foreshock.producers.sinks import JsonlSink

from ._table import emit_json, format_table, median, quantile, single_thread

EVERY = (10, 100)
BLOCK = 10  # steps per block: a divisor of every δ, so blocks end disarmed (see docstring)
ROUND = 100  # steps of each configuration per round: a multiple of every δ
TARGET = 0.02  # at δ = 10
BATCH_SIZE = 8
LR = 1e-3
assert all(d % BLOCK == 0 and ROUND % d == 0 for d in EVERY)


def model_config(block_size: int) -> GPTConfig:
    return GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=block_size, n_experts=8, top_k=2)


@dataclass
class Arm:
    """One configuration: no monitor, or a Monitor with its own step counter."""

    name: str
    every: int | None = None
    monitor: Monitor | None = None
    local_step: int = 0
    acc: dict[str, float] = field(default_factory=dict)  # sums over the current round [s]
    rounds: list[dict[str, float]] = field(default_factory=list)  # per-step means per round
    measure_calls: list[float] = field(default_factory=list)  # step() on monitoring steps [s]
    idle_calls: list[float] = field(default_factory=list)  # step() on the other steps [s]

    def close_round(self) -> None:
        steps = self.acc.pop("steps")
        self.rounds.append({k: v / steps for k, v in self.acc.items()})
        self.acc = {}


class ForwardClock:
    """Seconds spent in the monitors' router hooks and max-logit observers during forwards."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._tick = 0.0

    def start_hook(self, *_: Any) -> None:
        self._tick = time.perf_counter()

    def stop_hook(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._tick


class Bench:
    def __init__(self, block_size: int, workdir: Path, weight_spectra: bool = True) -> None:
        torch.manual_seed(0)
        self.config = model_config(block_size)
        self.model = GPT(self.config)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.batches = ByteBatches(stdlib_bytes(), block_size, BATCH_SIZE, seed=0)
        self.clock = ForwardClock()
        gates = [block.mlp.gate for block in self.model.h]
        for gate in gates:  # runs before every monitor's router hook ...
            gate.register_forward_hook(self.clock.start_hook)
        self.arms = [Arm("none")]
        for every in EVERY:
            monitor = Monitor(
                self.model,
                JsonlSink(workdir / f"every{every}.jsonl"),
                run_id=f"overhead-every{every}",
                config=MonitorConfig(every=every, weight_spectra=weight_spectra),
            )
            self.arms.append(Arm(f"every{every}", every, monitor))
        for gate in gates:  # ... and this one after them
            gate.register_forward_hook(self.clock.stop_hook)

    # ---- pieces ---------------------------------------------------------------------------
    def _attach_observers(self, monitor: Monitor | None) -> None:
        clock = self.clock

        def observer(name: str, mon: Monitor):
            def observe(scores: torch.Tensor) -> None:
                tick = time.perf_counter()
                mon.observe_max_logit(name, scores)
                clock.seconds += time.perf_counter() - tick

            return observe

        for i, block in enumerate(self.model.h):
            name = f"h.{i}.attn"
            block.attn.logit_observer = None if monitor is None else observer(name, monitor)

    def _train_step(self) -> torch.Tensor:
        x, y = self.batches.next()
        _, loss = self.model(x, y)
        loss.backward()
        self.optimizer.step()
        return loss

    def warm_up(self, steps: int) -> None:
        """Untimed: allocator and kernels, then each monitor's snapshot and one full measurement."""
        self._attach_observers(None)
        for _ in range(steps):
            self._train_step()
            self.optimizer.zero_grad(set_to_none=True)
        for arm in self.arms[1:]:
            assert arm.monitor is not None
            self._attach_observers(arm.monitor)
            for _ in range(2):  # the first call snapshots, the second measures Δ
                loss = self._train_step()
                arm.monitor.step(0, loss=loss)
                self.optimizer.zero_grad(set_to_none=True)
        self._attach_observers(None)

    def run_block(self, arm: Arm) -> None:
        monitor = arm.monitor
        self._attach_observers(monitor)
        self.clock.seconds = 0.0
        in_step = total = 0.0
        for _ in range(BLOCK):
            start = time.perf_counter()
            loss = self._train_step()
            if monitor is not None:
                arm.local_step += 1
                tick = time.perf_counter()
                monitor.step(arm.local_step, loss=loss)
                took = time.perf_counter() - tick
                in_step += took
                calls = arm.measure_calls if arm.local_step % arm.every == 0 else arm.idle_calls
                calls.append(took)
            self.optimizer.zero_grad(set_to_none=True)
            total += time.perf_counter() - start
        self._attach_observers(None)
        for key, value in (("step", total), ("in_step", in_step), ("forward", self.clock.seconds)):
            arm.acc[key] = arm.acc.get(key, 0.0) + value
        arm.acc["steps"] = arm.acc.get("steps", 0) + BLOCK
        for other in self.arms[1:]:  # every monitor must be disarmed outside its block
            if getattr(other.monitor, "_armed", False):
                raise RuntimeError(f"{other.name} is still armed after a {arm.name} block")

    def run_round(self, index: int) -> None:
        gc.collect()
        for j in range(ROUND // BLOCK):
            shift = (index * (ROUND // BLOCK) + j) % len(self.arms)
            for arm in self.arms[shift:] + self.arms[:shift]:
                self.run_block(arm)
        for arm in self.arms:
            arm.close_round()

    def close(self) -> None:
        for arm in self.arms[1:]:
            assert arm.monitor is not None
            arm.monitor.close()


# ---- figures --------------------------------------------------------------------------------
def summarize(arms: list[Arm]) -> dict[str, Any]:
    base = [r["step"] for r in arms[0].rounds]
    out: dict[str, Any] = {"step_s_none": median(base)}
    for arm in arms[1:]:
        key, rounds = arm.name, arm.rounds
        ratios = [r["step"] / b - 1.0 for r, b in zip(rounds, base, strict=True)]
        direct = [(r["in_step"] + r["forward"]) / b for r, b in zip(rounds, base, strict=True)]
        forward = [r["forward"] / b for r, b in zip(rounds, base, strict=True)]
        out |= {
            f"step_s_{key}": median([r["step"] for r in rounds]),
            f"overhead_{key}": median(ratios),
            f"overhead_{key}_q25": quantile(ratios, 0.25),
            f"overhead_{key}_q75": quantile(ratios, 0.75),
            f"direct_{key}": median(direct),
            f"direct_{key}_q25": quantile(direct, 0.25),
            f"direct_{key}_q75": quantile(direct, 0.75),
            f"direct_{key}_forward_hooks": median(forward),
            f"monitor_s_per_step_{key}": median([r["in_step"] + r["forward"] for r in rounds]),
            f"measure_call_s_{key}": median(arm.measure_calls),
            f"measure_call_s_{key}_min": min(arm.measure_calls),
            f"idle_call_s_{key}": median(arm.idle_calls),
            f"records_{key}": arm.monitor.records_written if arm.monitor else 0,
            f"errors_{key}": arm.monitor.errors if arm.monitor else 0,
        }
    return out


def table(arms: list[Arm], f: dict[str, Any]) -> str:
    headers = [
        "config", "steps", "step s", "end-to-end", "[q25, q75]", "direct", "[q25, q75]",
        "fwd hooks", "monitor s/step", "s/measuring call", "s/idle call",
    ]  # fmt: skip
    n_steps = ROUND * len(arms[0].rounds)
    rows: list[list[object]] = [["no monitor", n_steps, f["step_s_none"], *["-"] * 8]]
    for arm in arms[1:]:
        k = arm.name
        rows.append([
            f"every={arm.every}", n_steps, f[f"step_s_{k}"],
            f"{f[f'overhead_{k}']:+.2%}",
            f"[{f[f'overhead_{k}_q25']:+.2%}, {f[f'overhead_{k}_q75']:+.2%}]",
            f"{f[f'direct_{k}']:.2%}",
            f"[{f[f'direct_{k}_q25']:.2%}, {f[f'direct_{k}_q75']:.2%}]",
            f"{f[f'direct_{k}_forward_hooks']:.3%}",
            f"{f[f'monitor_s_per_step_{k}']:.2e}", f"{f[f'measure_call_s_{k}']:.2e}",
            f"{f[f'idle_call_s_{k}']:.1e}",
        ])  # fmt: skip
    return format_table(headers, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 9")
    parser.add_argument("--rounds", type=int, help=f"rounds of {ROUND} steps per configuration")
    parser.add_argument("--block-size", type=int, default=64, help="model context length")
    parser.add_argument(
        "--no-weight-spectra", action="store_true", help="MonitorConfig(weight_spectra=False)"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 9)
    single_thread()

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="foreshock-overhead-") as tmp:
        bench = Bench(args.block_size, Path(tmp), weight_spectra=not args.no_weight_spectra)
        n_params = sum(p.numel() for p in bench.model.parameters())
        cfg = bench.config
        print(
            f"Monitor overhead: GPT {cfg.n_layer}L×{cfg.n_head}H×{cfg.n_embd}, "
            f"{cfg.n_experts} experts top-{cfg.top_k}, context {cfg.block_size}, "
            f"batch {BATCH_SIZE}, {n_params / 1e6:.2f} M params, AdamW, 1 thread; "
            f"weight_spectra={not args.no_weight_spectra}; "
            f"{rounds} rounds × {ROUND} steps per config in {BLOCK}-step blocks "
            f"({'quick' if args.quick else 'full'})",
            flush=True,
        )
        bench.warm_up(steps=10)
        for r in range(rounds):
            bench.run_round(r)
            line = "  ".join(f"{a.name} {a.rounds[-1]['step'] * 1e3:.1f}ms" for a in bench.arms)
            print(f"  round {r + 1}/{rounds}: mean step {line}", flush=True)
        bench.close()
    wall = time.perf_counter() - start

    figures = summarize(bench.arms)
    print()
    print(table(bench.arms, figures))
    meets_direct = figures["direct_every10"] <= TARGET
    meets_e2e = figures["overhead_every10"] <= TARGET
    print()
    print("end-to-end: median over rounds of (mean step with monitor / without, same round) − 1;")
    print("direct: time inside Monitor.step() + its forward hooks/observers per step, same base;")
    print("fwd hooks: the part of direct spent in router hooks and max-logit observers.")
    print("End-to-end differences inside the round-to-round spread [q25, q75] are noise.")
    print(
        f"target ≤ {TARGET:.0%} at every=10: direct {figures['direct_every10']:.2%} "
        f"({'met' if meets_direct else 'NOT met'}), end-to-end {figures['overhead_every10']:+.2%} "
        f"({'met' if meets_e2e else 'NOT met'}); wall {wall:.0f}s"
    )
    emit_json({
        "benchmark": "overhead",
        "quick": args.quick,
        "model": {
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
            "block_size": cfg.block_size, "n_experts": cfg.n_experts, "top_k": cfg.top_k,
            "params": n_params,
        },
        "batch_size": BATCH_SIZE,
        "tokens_per_step": BATCH_SIZE * cfg.block_size,
        "rounds": rounds,
        "steps_per_config_per_round": ROUND,
        "block_steps": BLOCK,
        "threads": torch.get_num_threads(),
        "weight_spectra": not args.no_weight_spectra,
        **figures,
        "target_every10": TARGET,
        "meets_target_direct": meets_direct,
        "meets_target_end_to_end": meets_e2e,
        "wall_s": wall,
    })  # fmt: skip


if __name__ == "__main__":
    main()
