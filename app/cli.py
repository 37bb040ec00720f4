"""The ``foreshock`` command line. Subcommands import their heavy dependencies lazily, so
``foreshock --help`` and the torch-free services never import torch.

The options every command shares — ``--config`` and ``--log-level`` — are taken anywhere on
the line (``foreshock --config x.toml detect`` and ``foreshock detect --config x.toml`` alike;
the later one wins), and every command logs through :func:`foreshock.logs.configure`. A
setting with a bad value ends the command with one line naming it (exit 2), not a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from foreshock import __version__, logs
from foreshock.dashboard.commands import add_dashboard_commands
from foreshock.delivery.commands import add_producer_commands
from foreshock.notify.commands import add_notify_commands
from foreshock.operate.approver_commands import add_approver_commands
from foreshock.operate.detect_commands import add_detector_commands
from foreshock.operate.profiles_commands import add_profiles_commands
from foreshock.operate.warnings_commands import add_warnings_commands
from foreshock.storage.commands import add_storage_commands
from foreshock.transport.commands import add_transport_commands
from foreshock.transport.settings import SettingsError

__all__ = ["build_parser", "main"]


def _needs_torch(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """Run a torch-side subcommand; without torch, say how to install it (exit 2)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            print(
                f"foreshock {args.command} needs torch: pip install 'foreshock[torch]'",
                file=sys.stderr,
            )
            return 2

    return run


@_needs_torch
def _smoke(args: argparse.Namespace) -> int:
    from foreshock.lab.smoke import run_smoke, summary_table

    print(f"foreshock smoke: {args.steps} steps, every {args.every}, seed {args.seed}")
    result, run = run_smoke(args.steps, args.every, args.seed, args.out)
    print(run.start["monitor"]["discovery"])
    print()
    print(summary_table(run.records))
    print()
    end = run.end or {}  # run_smoke always writes the end record
    errors, monitor_s = end["monitor_errors"], end["monitor_seconds"]
    print(
        f"records: {len(run.records)} -> {result.path}   errors: {errors}   "
        f"training: {result.wall_seconds:.1f} s   monitor: {monitor_s:.2f} s "
        f"({monitor_s / max(result.wall_seconds, 1e-9):.2%} of training time)"
    )
    return 1 if errors or not run.records else 0


def _policy(value: str | None) -> Any:
    """``--remedy``: none, ``default`` (the default policy) or a policy file."""
    if value is None:
        return None
    from foreshock.remediation.remedy import RemedyPolicy

    return RemedyPolicy() if value == "default" else RemedyPolicy.from_file(value)


@_needs_torch
def _lab_run(args: argparse.Namespace) -> int:
    from foreshock.lab.arch import SIZES, check_fault, default_model
    from foreshock.lab.faults import Fault, default_capacity
    from foreshock.lab.run import RunConfig, run_lab
    from foreshock.recipe import Recipe

    capacity = args.capacity
    if capacity is None:
        capacity = default_capacity(args.scenario, args.arch)
    sizes = {field: getattr(args, option[2:].replace("-", "_")) for field, option in SIZES.items()}
    try:  # a run the architecture cannot build, or a fault it has no place for: one line
        model = default_model(args.arch, capacity, **sizes)
        layers = tuple(int(x) for x in args.layers.split(",")) if args.layers else None
        fault = Fault.default(
            args.scenario,
            args.onset,
            args.magnitude,
            ramp=args.ramp,
            bits=args.bits,
            layers=layers,
            lr_target=args.lr_target,
        )
        check_fault(args.arch, fault, model.n_experts)
        policy = _policy(args.remedy)
        if args.anchor is not None:
            from foreshock.lab.anchors import anchor

            anchor(args.anchor)  # an unknown name: a clear error before training
        recipe = Recipe(args.schedule, args.lr, args.warmup, args.steps, args.decay_start)
    except (ValueError, OSError) as exc:
        print(f"foreshock lab run: {exc}", file=sys.stderr)
        return 2
    config = RunConfig(
        fault=fault,
        seed=args.seed,
        steps=args.steps,
        lr=recipe.lr,
        schedule=recipe.schedule,
        warmup=recipe.warmup,
        decay_start=recipe.decay_start,
        every=args.every,
        after_divergence=None if args.to_horizon else 250,
        model=model,
        name=args.run_id,
        project=args.project,
        arch=args.arch,
        policy=policy,
        anchor=args.anchor,
    )
    sink = None
    if args.kafka is not None:
        from foreshock.delivery.kafka_sink import KafkaSink
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
        print(
            f"kafka: {sink.delivered} delivered, {sink.spooled} spooled"
            + (f" (kept in {sink.spool_path})" if sink.pending() else "")
        )
    return 0


def _add_recipe(group: argparse._ArgumentGroup) -> None:
    from foreshock.recipe import SCHEDULES

    group.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    group.add_argument("--schedule", choices=SCHEDULES, default="constant", help="decay kind")
    group.add_argument("--warmup", type=int, default=0, help="linear warm-up steps (default 0)")
    group.add_argument(
        "--decay-start", type=int, help="wsd: the decay's first step (default 80%% of --steps)"
    )


def _add_lab(sub: argparse._SubParsersAction) -> None:
    from foreshock.lab.arch_table import ARCHS
    from foreshock.lab.scenarios import SCENARIOS

    lab = sub.add_parser("lab", help="the fault-injection lab")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    run = lab_sub.add_parser(
        "run",
        help="train one labelled run with a fault scenario",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="architectures (--arch):\n"
        + "\n".join(f"  {name:12} {arch.summary}" for name, arch in ARCHS.items()),
    )
    run.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    run.add_argument(
        "--arch",
        choices=tuple(ARCHS),
        default="gpt-moe",
        help="the lab's own GPT-MoE, or a tiny transformers model built offline from its "
        "config class (llama is dense: no router scenarios); docs/lab.md lists them",
    )
    size = run.add_argument_group(
        "model size", "default: the lab's dimensions for the arch (docs/lab.md)"
    )
    size.add_argument("--n-layers", type=int, metavar="N", help="transformer blocks")
    size.add_argument("--hidden", type=int, metavar="D", help="model width d")
    size.add_argument("--heads", type=int, metavar="H", help="query heads (hidden/H = head width)")
    size.add_argument(
        "--kv-heads", type=int, metavar="H", help="key/value heads (GQA; 0 = one per query head)"
    )
    size.add_argument("--experts", type=int, metavar="E", help="experts per MoE layer")
    size.add_argument("--top-k", type=int, metavar="K", help="experts per token")
    run.add_argument(
        "--capacity",
        type=float,
        metavar="FACTOR",
        help="expert capacity factor c (gpt-moe): each expert takes ceil(c*tokens*top_k/E) "
        "assignments, the rest are dropped; 0 = dropless (default: 1.0 for router-*, else 0)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=1600, help="training steps (default 1600)")
    _add_recipe(run.add_argument_group("recipe", "the learning-rate schedule (docs/recipes.md)"))
    run.add_argument("--onset", type=int, help="fault onset step (scenario default)")
    run.add_argument("--magnitude", type=float, help="fault magnitude (scenario default)")
    run.add_argument("--ramp", type=int, default=1000, help="lr-high: ramp steps (default 1000)")
    run.add_argument("--bits", type=int, default=1, help="combined: mantissa bits (default 1)")
    run.add_argument(
        "--layers", help="fa-*: comma-separated attention layers to fault (default all)"
    )
    run.add_argument(
        "--lr-target",
        choices=("model", "router"),
        default="model",
        help="lr-high: raise every learning rate (model) or only the routers' (router)",
    )
    run.add_argument("--every", type=int, default=25, help="monitor every δ steps (default 25)")
    run.add_argument(
        "--remedy",
        metavar="POLICY",
        help="act on the in-process warnings: 'default' or a policy file (TOML/JSON; "
        "docs/remediation.md); default: off",
    )
    run.add_argument(
        "--anchor",
        metavar="NAME",
        help="an always-on guard at every step, the baseline remediation is compared with: "
        "clip-1.0, zclip or spam (lab/anchors.py); default: none",
    )
    run.add_argument(
        "--to-horizon",
        action="store_true",
        help="keep training after a divergence (default: stop 250 steps past it)",
    )
    out = run.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="JSON Lines output path")
    out.add_argument(
        "--kafka",
        nargs="?",
        const="",
        metavar="BOOTSTRAP",
        help="send the run to Kafka (settings from --config/environment, or "
        "these bootstrap servers)",
    )
    run.add_argument("--run-id", help="run id (default <scenario>-s<seed>)")
    run.add_argument("--project", help="project label (the dashboard filters on it)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_lab_run)


def _demo(args: argparse.Namespace) -> int:
    from foreshock.app.demo import DemoConfig, run_demo

    return run_demo(
        DemoConfig(
            live=args.live,
            replayed=args.replayed,
            speed=args.speed,
            duration=args.duration,
            workers=args.workers,
            port=args.port,
            store=args.store,
        )
    )


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


def _add_smoke(sub: argparse._SubParsersAction) -> None:
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


def _import_runs(args: argparse.Namespace) -> int:
    """``store import`` (storage's command, the detectors' replay: wired here, above both)."""
    from foreshock.operate.store_runs import import_runs

    return import_runs(args)


# Each adds its subcommands to the `foreshock` subparsers; a new group of commands is one line.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_smoke,
    _add_lab,
    _add_demo,
    add_transport_commands,
    add_producer_commands,
    add_detector_commands,
    add_profiles_commands,
    add_notify_commands,
    add_warnings_commands,
    add_approver_commands,
    partial(add_storage_commands, import_runs=_import_runs),
    add_dashboard_commands,
)


def _log_level(text: str) -> str:
    try:
        return logs.parse_level(text, None)  # argparse names the option itself
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_common_options(parser: argparse.ArgumentParser, default: object) -> None:
    """``--config`` and ``--log-level``: on the top-level parser with real defaults, on every
    subcommand's with ``argparse.SUPPRESS`` (so a subcommand that was not given one keeps the
    value given before it, instead of resetting it)."""
    parser.add_argument(
        "--config",
        default=default,
        metavar="PATH",
        help="TOML settings file (default $FORESHOCK_CONFIG)",
    )
    parser.add_argument(
        "--log-level",
        default=default,
        type=_log_level,
        metavar="LEVEL",
        help=f"{', '.join(logs.LEVELS)}, any case (default ${logs.ENV}, else {logs.DEFAULT_LEVEL})",
    )


class _Subcommand(argparse.ArgumentParser):
    """Every subcommand's parser (nested ones too: ``add_subparsers`` reuses the class): it
    takes the common options itself, so they may follow the subcommand."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _add_common_options(self, argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="foreshock",
        description="Early warning for LLM training runs from mechanism monitors.",
    )
    parser.add_argument("--version", action="version", version=f"foreshock {__version__}")
    _add_common_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Subcommand)
    for add_commands in COMMANDS:
        add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        level = logs.configure(args.log_level)
    except ValueError as exc:  # a bad FORESHOCK_LOG_LEVEL
        print(f"foreshock {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.log_level:  # the services this one starts (demo, dashboard) log at it too
        os.environ[logs.ENV] = level
    try:
        return args.func(args)
    except SettingsError as exc:
        print(f"foreshock {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
