"""The ``foreshock`` command line. Subcommands import their heavy dependencies lazily, so
``foreshock --help`` and the torch-free services never import torch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from foreshock import __version__
from foreshock.dashboard.commands import add_dashboard_commands
from foreshock.detectors.commands import add_detector_commands
from foreshock.storage.commands import add_storage_commands
from foreshock.transport.commands import add_transport_commands

__all__ = ["main"]


def _needs_torch(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """Run a torch-side subcommand; without torch, say how to install it (exit 2)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            print(f"foreshock {args.command} needs torch: pip install 'foreshock[torch]'",
                  file=sys.stderr)  # fmt: skip
            return 2

    return run


@_needs_torch
def _smoke(args: argparse.Namespace) -> int:
    from foreshock.producers.smoke import run_smoke, summary_table

    print(f"foreshock smoke: {args.steps} steps, every {args.every}, seed {args.seed}")
    result, run = run_smoke(args.steps, args.every, args.seed, args.out)
    print(run.start["monitor"]["discovery"])
    print()
    print(summary_table(run.records))
    print()
    errors = run.end["monitor_errors"]
    monitor_s = run.end["monitor_seconds"]
    print(
        f"records: {len(run.records)} -> {result.path}   errors: {errors}   "
        f"training: {result.wall_seconds:.1f} s   monitor: {monitor_s:.2f} s "
        f"({monitor_s / max(result.wall_seconds, 1e-9):.2%} of training time)"
    )
    return 1 if errors or not run.records else 0


@_needs_torch
def _lab_run(args: argparse.Namespace) -> int:
    from foreshock.lab.arch import default_model
    from foreshock.lab.faults import Fault, default_capacity
    from foreshock.lab.run import RunConfig, run_lab

    capacity = args.capacity
    if capacity is None:
        capacity = default_capacity(args.scenario, args.arch)
    model = default_model(args.arch, capacity)
    layers = tuple(int(x) for x in args.layers.split(",")) if args.layers else None
    fault = Fault.default(
        args.scenario, args.onset, args.magnitude,
        ramp=args.ramp, bits=args.bits, layers=layers, lr_target=args.lr_target,
    )  # fmt: skip
    config = RunConfig(fault=fault, seed=args.seed, steps=args.steps, every=args.every,
                       after_divergence=None if args.to_horizon else 250, model=model,
                       name=args.run_id, project=args.project, arch=args.arch)  # fmt: skip
    sink = None
    if args.kafka is not None:
        from foreshock.producers.kafka_sink import KafkaSink
        from foreshock.transport.settings import load_settings

        settings = load_settings(args.config)
        sink = KafkaSink(settings.with_bootstrap(args.kafka) if args.kafka else settings)
    result = run_lab(config, args.out, progress=not args.quiet, sink=sink)
    diverged = result.divergence_step is not None
    status = f"diverged at step {result.divergence_step}" if diverged else "no divergence"
    print(
        f"{result.run_id}: {status}; final loss {result.losses[-1]:.3f}; "
        f"{result.cpu_seconds:.0f} s CPU -> {result.path or 'kafka'}"
    )
    if sink is not None:
        print(f"kafka: {sink.delivered} delivered, {sink.spooled} spooled"
              + (f" (kept in {sink.spool_path})" if sink.pending() else ""))  # fmt: skip
    return 0


def _add_lab(sub: argparse._SubParsersAction) -> None:
    from foreshock.lab.scenarios import SCENARIOS

    lab = sub.add_parser("lab", help="the fault-injection lab")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    run = lab_sub.add_parser("run", help="train one labelled run with a fault scenario")
    run.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    run.add_argument(
        "--arch", choices=("gpt-moe", "mixtral"), default="gpt-moe",
        help="the lab's own GPT-MoE, or a tiny transformers Mixtral (GQA, 2 key/value heads)",
    )  # fmt: skip
    run.add_argument(
        "--capacity", type=float, metavar="FACTOR",
        help="expert capacity factor c (gpt-moe): each expert takes ceil(c*tokens*top_k/E) "
        "assignments, the rest are dropped; 0 = dropless (default: 1.0 for router-*, else 0)",
    )  # fmt: skip
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=1600, help="training steps (default 1600)")
    run.add_argument("--onset", type=int, help="fault onset step (scenario default)")
    run.add_argument("--magnitude", type=float, help="fault magnitude (scenario default)")
    run.add_argument("--ramp", type=int, default=1000, help="lr-high: ramp steps (default 1000)")
    run.add_argument("--bits", type=int, default=1, help="combined: mantissa bits (default 1)")
    run.add_argument("--layers", help="fa-*: comma-separated attention layers (default all)")
    run.add_argument(
        "--lr-target", choices=("model", "router"), default="model",
        help="lr-high: raise every learning rate (model) or only the routers' (router)",
    )  # fmt: skip
    run.add_argument("--every", type=int, default=25, help="monitor every δ steps (default 25)")
    run.add_argument(
        "--to-horizon",
        action="store_true",
        help="keep training after a divergence (default: stop 250 steps past it)",
    )
    out = run.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="JSON Lines output path")
    out.add_argument("--kafka", nargs="?", const="", metavar="BOOTSTRAP",
                     help="send the run to Kafka (settings from --config/environment, or "
                     "these bootstrap servers)")  # fmt: skip
    run.add_argument("--run-id", help="run id (default <scenario>-s<seed>)")
    run.add_argument("--project", help="project label (the dashboard filters on it)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_lab_run)


def _demo(args: argparse.Namespace) -> int:
    from foreshock.demo import DemoConfig, run_demo

    return run_demo(DemoConfig(live=args.live, replayed=args.replayed, speed=args.speed,
                               duration=args.duration, workers=args.workers, port=args.port,
                               store=args.store))  # fmt: skip


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from pathlib import Path

    demo = sub.add_parser("demo", help="the whole system on this machine, watching a fleet")
    demo.add_argument("--live", type=int, default=2, help="real lab runs trained now (0-4)")
    demo.add_argument("--replayed", type=int, default=40, help="recorded runs replayed")
    demo.add_argument("--speed", type=float, default=8.0, help="replay pace × recorded")
    demo.add_argument("--duration", type=float, default=480.0, help="stop after S seconds")
    demo.add_argument("--workers", type=int, default=1, help="detector workers")
    demo.add_argument("--port", type=int, default=8501, help="dashboard port")
    demo.add_argument("--store", type=Path, help="history folder (default foreshock-demo/<time>)")
    demo.set_defaults(func=_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="foreshock",
        description="Early warning for LLM training runs from mechanism monitors.",
    )
    parser.add_argument("--version", action="version", version=f"foreshock {__version__}")
    parser.add_argument("--config", help="TOML settings file (default $FORESHOCK_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)
    smoke = sub.add_parser(
        "smoke", help="train a small GPT-MoE briefly with the monitors and print a summary"
    )
    smoke.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    smoke.add_argument("--every", type=int, default=10, help="monitor every δ steps (default 10)")
    smoke.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    smoke.add_argument(
        "--out", default="runs/smoke.jsonl", help="JSON Lines output (default runs/smoke.jsonl)"
    )
    smoke.set_defaults(func=_smoke)
    _add_lab(sub)
    _add_demo(sub)
    add_transport_commands(sub)
    add_detector_commands(sub)
    add_storage_commands(sub)
    add_dashboard_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
