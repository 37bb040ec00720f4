"""Monitor overhead as a fraction of training-step time, at δ = 10 and δ = 100, side by side.

What it measures (``--model``), single-threaded, with a Monitor (default MonitorConfig, a
JsonlSink to a temp file) at every = δ ∈ {10, 100}, against no monitor; byte-level stdlib text:

* ``lab`` (default): the small GPT-MoE from ``foreshock.lab`` (4 layers, 4 heads, width 128,
  8 experts top-2 at the lab's default expert width, context 64, batch 8: 512 tokens per step,
  ~2.4 M parameters; AdamW), with max-logit observers on every attention layer as in
  ``lab.smoke``. Target: ≤ 1 % at δ = 10. A small model is the hard case: the monitor's
  cost is per layer, not per token, so a bigger batch or context only dilutes it
  (``--block-size`` sets the context).
* ``gpt2-124m``: ``transformers.GPT2LMHeadModel(GPT2Config())``, built offline with random
  weights (124 M parameters: 12 layers, 12 heads, n_embd 768, vocab 50257 fed byte ids),
  batch 1 × context 128 — what this 2-core CPU trains in ~1.4 s a step; fused AdamW (a faster
  step makes the monitor's share larger, not smaller). Target: ≤ 1 % at δ = 100. Its monitor
  measures 12 layers of fused ``c_attn`` with biases (d' = 769), no routers, no max-logit
  observer.
* ``mixtral-tiny``: ``transformers.MixtralForCausalLM`` with hidden 128, 4 heads, 2 key/value
  heads (GQA), 4 layers, 8 experts top-2, expert width 256, vocab 256; batch 8 × context 64 as
  the lab; fused AdamW; the monitor finds its attention and its 4 routers (router hooks on).

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
three alike. A *round* is 100 steps of each configuration (10 blocks each, ~20 s in all on the
lab model here, more on a loaded machine); each figure is the median over rounds of the
per-round paired ratio, with the quartiles beside it. A quick run on a model whose step takes
seconds gives the no-monitor and δ = 10 configurations fewer blocks per round (spread evenly
among the δ = 100 ones, which need all 10 for their one monitoring step); the per-round ratios
are of per-step means either way. One Monitor per δ is created at the start and kept for the
whole run, so its snapshots persist (a fresh Monitor's first monitoring step only snapshots, and
would understate the cost). Each monitor counts its own steps; its blocks cover its steps 10j+1
… 10j+10, so a round holds exactly (its steps)/δ monitoring steps, each preceded (in the same
block) by the arming step that lets the router hooks gather that step's routing, and every block
ends on a step after which the monitor is disarmed ((10j+11) % δ ≠ 0). A monitor outside its
block therefore costs only its disarmed hooks' early return (µs per step, in every block alike,
the baseline included); the benchmark checks after every block that it is disarmed. Before the
rounds each monitor is warmed (one snapshot, one full measurement; untimed). The δ between a
monitor's snapshots is counted in its own steps, not training steps (the other configurations
train in between): that changes the values it measures, not their cost.

    python -m benchmarks.overhead                               # lab, 9 rounds (~3 min)
    python -m benchmarks.overhead --quick                       # lab, 2 rounds (~1 min)
    python -m benchmarks.overhead --model gpt2-124m --quick     # 1 round of 2/2/10 blocks (~4 min)
    python -m benchmarks.overhead --model gpt2-124m             # 2 rounds of 10 blocks (~15 min)
    python -m benchmarks.overhead --model mixtral-tiny          # 9 rounds (~3 min)

``--sharded`` measures instead the Monitor's cost per rank under torch.distributed (gloo, CPU):
a 4-layer Llama (d = 512) sharded with FSDP2 on 2 and 4 ranks against the single process — per
rank monitor time and its parts, bytes received per monitoring step, memory, and the target
single / ranks + the transfer (``benchmarks._sharded_overhead``):

    python -m benchmarks.overhead --sharded                     # 12 timed steps each (~3 min)
    python -m benchmarks.overhead --sharded --quick             # 4 timed steps each (~2 min)

The Monitor's default config computes its spectra (and routing summaries, router geometry)
on a worker thread (``MonitorConfig(spectra_worker=True)``): ``direct`` is the training
thread's share and ``worker`` the worker's (its time per step, same base).
``--spectra-in-step`` measures them computed in the step instead (``spectra_worker=False``,
the lab's setting); ``--save`` then stores ``<name>_in_step.json``.

``--save`` also stores the closing JSON line as ``benchmarks/results/overhead.json`` (lab),
``overhead_<model>.json`` or ``overhead_sharded.json``, in ``benchmarks.readme``'s record format.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.producers.discovery import discover
from foreshock.producers.monitor import Monitor, MonitorConfig
from foreshock.producers.sinks import JsonlSink

from ._table import emit_json, format_table, median, quantile, single_thread

EVERY = (10, 100)
BLOCK = 10  # steps per block: a divisor of every δ, so blocks end disarmed (see docstring)
ROUND = 100  # steps of each configuration per full round: a multiple of every δ
SLOTS = ROUND // BLOCK  # block slots per round
LR = 1e-3
assert all(d % BLOCK == 0 and ROUND % d == 0 for d in EVERY)


@dataclass(frozen=True)
class Workload:
    """One ``--model``: what is trained, and how long a full and a quick run are.

    ``blocks``/``quick_blocks``: blocks per round of (no monitor, δ = 10, δ = 100), at most
    ``SLOTS`` each; a configuration's steps per round must hold whole intervals of its δ.
    ``target``: (δ, largest share of step time) the direct measure should stay within.
    """

    batch_size: int
    block_size: int
    rounds: int
    quick_rounds: int
    warm_up_steps: int = 10
    blocks: tuple[int, int, int] = (SLOTS, SLOTS, SLOTS)
    quick_blocks: tuple[int, int, int] = (SLOTS, SLOTS, SLOTS)
    target: tuple[int, float] | None = None


WORKLOADS = {
    "lab": Workload(batch_size=8, block_size=64, rounds=9, quick_rounds=2, target=(10, 0.01)),
    "gpt2-124m": Workload(
        batch_size=1,
        block_size=128,
        rounds=2,
        quick_rounds=1,
        warm_up_steps=2,
        quick_blocks=(2, 2, SLOTS),
        target=(100, 0.01),
    ),
    "mixtral-tiny": Workload(batch_size=8, block_size=64, rounds=9, quick_rounds=2),
}


def model_config(block_size: int) -> GPTConfig:
    return GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=block_size, n_experts=8, top_k=2)


@dataclass
class Trainee:
    """A model, its loss on a batch, its optimizer, and what the JSON says about it."""

    model: nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, y) -> scalar loss
    optimizer: torch.optim.Optimizer
    describe: dict[str, Any]
    observed: dict[str, nn.Module] = field(default_factory=dict)  # name -> has logit_observer


def build(name: str, block_size: int) -> Trainee:
    torch.manual_seed(0)
    if name == "lab":
        config = model_config(block_size)
        lab = GPT(config)
        return Trainee(
            lab,
            lambda x, y: lab(x, y)[1],
            torch.optim.AdamW(lab.parameters(), lr=LR),
            {
                "n_layer": config.n_layer,
                "n_head": config.n_head,
                "n_embd": config.n_embd,
                "block_size": block_size,
                "n_experts": config.n_experts,
                "top_k": config.top_k,
                "optimizer": "AdamW",
            },
            {f"h.{i}.attn": block.attn for i, block in enumerate(lab.h)},
        )
    import transformers  # the "hf" extra

    transformers.logging.set_verbosity_error()
    if name == "gpt2-124m":
        gpt2 = transformers.GPT2Config()  # GPT-2 small: 12 layers, 12 heads, 768 wide
        model: nn.Module = transformers.GPT2LMHeadModel(gpt2)
        describe = {
            "n_layer": gpt2.n_layer,
            "n_head": gpt2.n_head,
            "n_embd": gpt2.n_embd,
            "vocab_size": gpt2.vocab_size,
        }
    elif name == "mixtral-tiny":
        mixtral = transformers.MixtralConfig(
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=4,
            intermediate_size=256,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=256,
            max_position_embeddings=256,
        )
        model = transformers.MixtralForCausalLM(mixtral)
        describe = {
            "n_layer": mixtral.num_hidden_layers,
            "n_head": mixtral.num_attention_heads,
            "n_kv_head": mixtral.num_key_value_heads,
            "n_embd": mixtral.hidden_size,
            "n_experts": mixtral.num_local_experts,
            "top_k": mixtral.num_experts_per_tok,
            "vocab_size": mixtral.vocab_size,
        }
    else:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(WORKLOADS)}")
    model.train()

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=x, use_cache=False).logits  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    describe |= {"block_size": block_size, "optimizer": "AdamW (fused)"}
    return Trainee(model, loss, optimizer, describe)


@dataclass
class Arm:
    """One configuration: no monitor, or a Monitor with its own step counter."""

    name: str
    blocks: int  # per round
    every: int | None = None
    monitor: Monitor | None = None
    local_step: int = 0
    steps: int = 0  # timed, all rounds
    acc: dict[str, float] = field(default_factory=dict)  # sums over the current round [s]
    rounds: list[dict[str, float]] = field(default_factory=list)  # per-step means per round
    measure_calls: list[float] = field(default_factory=list)  # step() on monitoring steps [s]
    idle_calls: list[float] = field(default_factory=list)  # step() on the other steps [s]

    def close_round(self) -> None:
        steps = self.acc.pop("steps")
        self.rounds.append({k: v / steps for k, v in self.acc.items()})
        self.acc = {}

    def runs_in(self, slot: int) -> bool:
        """Whether this arm has a block in ``slot`` of a round: its blocks spread evenly."""
        return (slot + 1) * self.blocks // SLOTS > slot * self.blocks // SLOTS


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
    def __init__(
        self,
        model: str,
        workload: Workload,
        blocks: tuple[int, int, int],
        workdir: Path,
        weight_spectra: bool = True,
        spectra_worker: bool = MonitorConfig.spectra_worker,
    ) -> None:
        self.trainee = build(model, workload.block_size)
        self.model = self.trainee.model
        self.optimizer = self.trainee.optimizer
        self.batches = ByteBatches(stdlib_bytes(), workload.block_size, workload.batch_size, seed=0)
        self.clock = ForwardClock()
        routers = [spec.module for spec in discover(self.model).routers]
        for router in routers:  # runs before every monitor's router hook ...
            router.register_forward_hook(self.clock.start_hook)
        self.arms = [Arm("none", blocks[0])]
        for every, n_blocks in zip(EVERY, blocks[1:], strict=True):
            if n_blocks * BLOCK % every or not 0 < n_blocks <= SLOTS:
                raise ValueError(f"every={every}: {n_blocks} blocks don't hold whole intervals")
            monitor = Monitor(
                self.model,
                JsonlSink(workdir / f"every{every}.jsonl"),
                run_id=f"overhead-every{every}",
                config=MonitorConfig(
                    every=every, weight_spectra=weight_spectra, spectra_worker=spectra_worker
                ),
            )
            self.arms.append(Arm(f"every{every}", n_blocks, every, monitor))
        for router in routers:  # ... and this one after them
            router.register_forward_hook(self.clock.stop_hook)

    # ---- pieces ---------------------------------------------------------------------------
    def _attach_observers(self, monitor: Monitor | None) -> None:
        clock = self.clock

        def observer(name: str, mon: Monitor):
            def observe(scores: torch.Tensor) -> None:
                tick = time.perf_counter()
                mon.observe_max_logit(name, scores)
                clock.seconds += time.perf_counter() - tick

            return observe

        for name, attn in self.trainee.observed.items():
            attn.logit_observer = None if monitor is None else observer(name, monitor)

    def _train_step(self) -> torch.Tensor:
        x, y = self.batches.next()
        loss = self.trainee.loss(x, y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

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
        arm.steps += BLOCK
        for other in self.arms[1:]:  # every monitor must be disarmed outside its block
            if getattr(other.monitor, "_armed", False):
                raise RuntimeError(f"{other.name} is still armed after a {arm.name} block")

    def run_round(self, index: int) -> None:
        gc.collect()
        for slot in range(SLOTS):
            shift = (index * SLOTS + slot) % len(self.arms)
            for arm in self.arms[shift:] + self.arms[:shift]:
                if arm.runs_in(slot):
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
            **_worker_share(arm, key, median(base)),
        }
    return out


def _worker_share(arm: Arm, key: str, base: float) -> dict[str, Any]:
    """The spectra worker's time per step of this arm, and its share of a step (None: off)."""
    spectra = arm.monitor.spectra if arm.monitor else None
    if spectra is None:
        return {f"worker_{key}": None, f"worker_solve_s_{key}": None, f"spectra_skipped_{key}": 0}
    per_step = sum(spectra.solve_s) / max(arm.steps, 1)
    return {
        f"worker_{key}": per_step / base,
        f"worker_solve_s_{key}": median(spectra.solve_s) if spectra.solve_s else None,
        f"spectra_skipped_{key}": spectra.skipped,
    }


def table(arms: list[Arm], f: dict[str, Any]) -> str:
    headers = [
        "config",
        "steps",
        "step s",
        "end-to-end",
        "[q25, q75]",
        "direct",
        "[q25, q75]",
        "fwd hooks",
        "worker",
        "monitor s/step",
        "s/measuring call",
        "s/idle call",
    ]
    rows: list[list[object]] = [["no monitor", arms[0].steps, f["step_s_none"], *["-"] * 9]]
    for arm in arms[1:]:
        k = arm.name
        rows.append(
            [
                f"every={arm.every}",
                arm.steps,
                f[f"step_s_{k}"],
                f"{f[f'overhead_{k}']:+.2%}",
                f"[{f[f'overhead_{k}_q25']:+.2%}, {f[f'overhead_{k}_q75']:+.2%}]",
                f"{f[f'direct_{k}']:.2%}",
                f"[{f[f'direct_{k}_q25']:.2%}, {f[f'direct_{k}_q75']:.2%}]",
                f"{f[f'direct_{k}_forward_hooks']:.3%}",
                "-" if f[f"worker_{k}"] is None else f"{f[f'worker_{k}']:.2%}",
                f"{f[f'monitor_s_per_step_{k}']:.2e}",
                f"{f[f'measure_call_s_{k}']:.2e}",
                f"{f[f'idle_call_s_{k}']:.1e}",
            ]
        )
    return format_table(headers, rows)


def result_name(model: str) -> str:
    """The stored result of a model: ``overhead`` for the lab, else ``overhead_<model>``."""
    return "overhead" if model == "lab" else f"overhead_{model}"


def store(name: str, result: dict[str, Any], argv: list[str]) -> Path:
    """Keep the result in ``benchmarks/results`` in ``benchmarks.readme``'s record format."""
    from . import readme

    # the command it names: benchmarks.overhead, whatever the name
    readme.save(name, result, [a for a in argv if a != "--save"], module="overhead")
    return readme.RESULTS / f"{name}.json"


def sharded(args: argparse.Namespace, argv: list[str]) -> None:
    """``--sharded``: run, print, store and emit ``benchmarks._sharded_overhead``'s result."""
    from ._sharded_overhead import run_sharded

    worlds = [int(w) for w in args.ranks.split(",")]
    result = run_sharded(args.quick, worlds, args.parallel.split(","))
    if args.save:
        print(f"stored {store('overhead_sharded', result, argv)}")
    emit_json(result)


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result (a ``--sharded`` one, ``"sharded": true``:
    :func:`benchmarks._sharded_overhead.figures`'s): for the model, the monitor's time per
    training step inside the monitor at δ = 10 and δ = 100 (with the target share beside the
    target δ), then the end-to-end step-time difference at δ = 10."""
    if result.get("sharded"):
        from . import _sharded_overhead

        return _sharded_overhead.figures(result)
    model = result["model"].get("name", "lab")
    every, share = result.get("target_every"), result.get("target_share")
    worker = result.get("spectra_worker", False)
    where = "on the training thread, spectra on a worker" if worker else "inside the monitor"
    rows = [
        (
            f"{model}: monitor time per training step at δ = {d} ({where})",
            f"{result[f'direct_every{d}']:.2%}"
            + (f" (target ≤ {share:.0%})" if share is not None and d == every else ""),
        )
        for d in (10, 100)
    ]
    if worker:
        rows += [
            (f"{model}: the spectra worker's time per training step at δ = {d}",
             f"{result[f'worker_every{d}']:.2%} (off the training thread)")
            for d in (10, 100)
        ]  # fmt: skip
    rows.append(
        (
            f"{model}: end-to-end step-time difference at δ = 10 (noise of a few %)",
            f"{result['overhead_every10']:+.2%}",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(WORKLOADS), default="lab", help="what to train")
    parser.add_argument("--quick", action="store_true", help="the model's short version")
    parser.add_argument("--rounds", type=int, help=f"rounds of up to {ROUND} steps per config")
    parser.add_argument("--block-size", type=int, help="context length (default: the model's)")
    parser.add_argument(
        "--no-weight-spectra", action="store_true", help="MonitorConfig(weight_spectra=False)"
    )
    parser.add_argument("--save", action="store_true", help="store the result (see docstring)")
    parser.add_argument(
        "--sharded", action="store_true", help="per-rank cost under FSDP2 (see docstring)"
    )
    parser.add_argument(
        "--spectra-in-step",
        action="store_true",
        help="MonitorConfig(spectra_worker=False): the eigen-solves in the training step",
    )
    parser.add_argument("--ranks", default="2,4", help="with --sharded: world sizes")
    parser.add_argument("--parallel", default="fsdp2", help="with --sharded: fsdp2 and/or tp")
    args = parser.parse_args(argv)
    if args.sharded:
        return sharded(args, argv if argv is not None else sys.argv[1:])
    workload = WORKLOADS[args.model]
    if args.block_size:
        workload = replace(workload, block_size=args.block_size)
    rounds = args.rounds or (workload.quick_rounds if args.quick else workload.rounds)
    blocks = workload.quick_blocks if args.quick else workload.blocks
    weight_spectra = not args.no_weight_spectra
    single_thread()

    spectra_worker = MonitorConfig.spectra_worker and not args.spectra_in_step
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="foreshock-overhead-") as tmp:
        bench = Bench(args.model, workload, blocks, Path(tmp), weight_spectra, spectra_worker)
        n_params = sum(p.numel() for p in bench.model.parameters())
        described = ", ".join(f"{k} {v}" for k, v in bench.trainee.describe.items())
        print(
            f"Monitor overhead: {args.model} ({described}), batch {workload.batch_size}, "
            f"{n_params / 1e6:.2f} M params, 1 thread; weight_spectra={weight_spectra}; "
            f"{rounds} rounds of {'/'.join(str(b * BLOCK) for b in blocks)} steps "
            f"(no monitor/δ=10/δ=100) in {BLOCK}-step blocks ({'quick' if args.quick else 'full'})",
            flush=True,
        )
        bench.warm_up(steps=workload.warm_up_steps)
        for r in range(rounds):
            bench.run_round(r)
            line = "  ".join(f"{a.name} {a.rounds[-1]['step'] * 1e3:.1f}ms" for a in bench.arms)
            print(f"  round {r + 1}/{rounds}: mean step {line}", flush=True)
        bench.close()
    wall = time.perf_counter() - start

    figures = summarize(bench.arms)
    print()
    print(table(bench.arms, figures))
    print()
    print("end-to-end: median over rounds of (mean step with monitor / without, same round) − 1;")
    print("direct: time inside Monitor.step() + its forward hooks/observers per step, same base;")
    print("fwd hooks: the part of direct spent in router hooks and max-logit observers;")
    print("worker: the spectra worker thread's solve time per step, same base (off the step).")
    print("End-to-end differences inside the round-to-round spread [q25, q75] are noise.")
    target: dict[str, Any] = {}
    if workload.target is not None:
        every, share = workload.target
        direct, e2e = figures[f"direct_every{every}"], figures[f"overhead_every{every}"]
        target = {
            "target_every": every,
            "target_share": share,
            "meets_target_direct": direct <= share,
            "meets_target_end_to_end": e2e <= share,
        }
        print(
            f"target ≤ {share:.0%} at every={every}: direct {direct:.2%} "
            f"({'met' if direct <= share else 'NOT met'}), end-to-end {e2e:+.2%} "
            f"({'met' if e2e <= share else 'NOT met'}); wall {wall:.0f}s"
        )
    else:
        print(f"no target for {args.model}; wall {wall:.0f}s")
    result = {
        "benchmark": "overhead",
        "quick": args.quick,
        "model": {"name": args.model, **bench.trainee.describe, "params": n_params},
        "batch_size": workload.batch_size,
        "tokens_per_step": workload.batch_size * workload.block_size,
        "rounds": rounds,
        "steps_per_config_per_round": {a.name: a.blocks * BLOCK for a in bench.arms},
        "block_steps": BLOCK,
        "threads": torch.get_num_threads(),
        "weight_spectra": weight_spectra,
        "spectra_worker": spectra_worker,
        **figures,
        **target,
        "wall_s": wall,
    }
    if args.save:
        name = result_name(args.model) + ("" if spectra_worker else "_in_step")
        saved = store(name, result, argv if argv is not None else sys.argv[1:])
        print(f"stored {saved}")
    emit_json(result)


if __name__ == "__main__":
    main()
