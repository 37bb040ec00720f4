"""``foreshock tune``: choose a detector config on a store's runs, publish it (and a named
profile) to the store's registry. Its table and its flags; the search itself is
:mod:`foreshock.operate.tune` (no torch)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.registry import profiles_folder
from foreshock.storage.store_files import StoreFiles
from foreshock.table import format_table

__all__ = ["add_tune_command", "profiles_folder_of", "selection"]


def profiles_folder_of(args: argparse.Namespace) -> Path | StoreFiles:
    """Where ``--name`` publishes: ``--profiles``, else the store's registry."""
    if args.profiles:
        return Path(args.profiles)
    root = args.store or getattr(args, "from_store", None)
    if root is None:
        raise ValueError("--name needs --profiles DIR or --store ROOT to publish into")
    return profiles_folder(root)


def _progress(done: int, total: int) -> None:
    end = "\n" if done == total else ""
    line = f"\rforeshock tune: {100 * done // total:3d}% ({done}/{total} run loads and replays)"
    print(line, end=end, file=sys.stderr, flush=True)


def _tune_table(report: dict) -> str:
    """The chosen point's per-family figures, then one line per grid point."""
    chosen = report["points"][report["chosen"]["index"]]
    rows = [
        [
            f["family"],
            f["runs"],
            f["detected"],
            f["lead_median"],
            f["lead_p10"],
            f["lead_p90"],
            f["attribution_ok"],
            f["false_warnings"],
            f["healthy_runs"],
        ]
        for f in chosen["families"]
    ]
    families = format_table(
        [
            "family",
            "faulty runs",
            "warned before divergence",
            "lead median",
            "p10",
            "p90",
            "attribution ok",
            "false warnings",
            "healthy runs",
        ],
        rows,
    )
    names = list(report["grid"])
    grid = []
    for i, point in enumerate(report["points"]):
        figures = [f for f in point["families"] if f["detection_rate"] is not None]
        grid.append(
            [
                "*" if i == report["chosen"]["index"] else "",
                *(point["params"][n] for n in names),
                sum(f["false_warnings"] or 0 for f in point["families"]),
                min(f["detection_rate"] for f in figures),
                min(
                    (f["lead_median"] for f in figures if f["lead_median"] is not None),
                    default=None,
                ),
                point["version"],
            ]
        )
    points = format_table(
        ["", *names, "false warnings", "worst detection rate", "shortest median lead", "version"],
        grid,
    )
    split = report["split"]
    return (
        f"{families}\n\n{points}\n\ncalibrated on {len(split['calibration'])} healthy "
        f"runs, judged on {len(split['judged'])} (held out: {split['held_out_seeds']})\n"
        f"rule: {report['rule']}\nstore versions read (--store-versions to reproduce): "
        f"{json.dumps(report['store_versions'])}"
    )


def _tune(args: argparse.Namespace) -> int:
    from foreshock.detectors.registry import RegistryError, history, publish, rollback

    from .tune import DEFAULT_GRID, TuneError, tune

    try:
        if args.rollback is not None:
            version = rollback(args.store, args.rollback or None, note=args.note)
            print(f"live detector config in {args.store}: {version}")
            return 0
        if args.history:
            for entry in history(args.store):
                print(json.dumps(entry))
            return 0
        grid = {
            "k": args.grid_k or DEFAULT_GRID["k"],
            "confirm": args.grid_confirm or DEFAULT_GRID["confirm"],
            "trend_beta": args.grid_trend_beta or DEFAULT_GRID["trend_beta"],
        }
        config, report = tune(
            args.store,
            grid,
            args.held_out_seeds,
            progress=None if args.json else _progress,
            versions=args.store_versions,
            select=selection(args.select),
        )
        if args.dry_run:
            published = None
        elif args.name:
            published = str(_publish_profile(args, config, report))
        else:
            published = publish(args.store, config, report, args.note)
    except (TuneError, RegistryError, ValueError) as exc:
        print(f"foreshock tune: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**report, "config": config.to_dict(), "published": published}))
        return 0
    print(_tune_table(report))
    where = f"profile {args.name} ({published})" if args.name else "live"
    print(
        f"-> {f'published, {where}' if published else 'not published (--dry-run)'}: "
        f"detector config {config.version}"
    )
    return 0


def selection(items: list[str]) -> dict[str, str]:
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"--select takes KEY=VALUE, got {bad[0]!r}")
    return dict(item.split("=", 1) for item in items)


def _publish_profile(args: argparse.Namespace, config: DetectorConfig, report: dict) -> str:
    """``tune --name``: the tuned config as a named profile of the one model it was tuned
    on, beside the shipped ones (``--select`` picks that model's runs from a mixed store)."""
    from foreshock.detectors.profiles import save_profile

    signature = report["signature"]
    if signature is None:
        raise ValueError(
            "--name publishes a profile of one model, and the calibration runs are of several "
            "(or sent no architecture signature): pick one model's runs with --select KEY=VALUE"
        )
    return save_profile(profiles_folder_of(args), args.name, config, [signature])


def _seed_range(text: str) -> range:
    from .tune import parse_seed_range

    try:
        return parse_seed_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_tune_command(sub: argparse._SubParsersAction) -> None:
    from foreshock.storage.location import DEFAULT_STORE

    tune = sub.add_parser("tune", help="tune detectors on a store's runs; publish or roll back")
    tune.add_argument("--store", default=DEFAULT_STORE, help="store folder (runs and configs)")
    tune.add_argument(
        "--store-versions",
        type=json.loads,
        metavar="JSON",
        help='the table versions to read, e.g. {"steps": 12, ...}: an earlier '
        "tune's store_versions, to reproduce it exactly",
    )
    tune.add_argument(
        "--held-out-seeds",
        type=_seed_range,
        metavar="A-B",
        help="healthy seeds kept out of calibration (default: seed %% 3 == 0)",
    )
    tune.add_argument("--grid-k", nargs="+", type=float, metavar="K", help="CUSUM allowances")
    tune.add_argument(
        "--grid-confirm",
        nargs="+",
        type=int,
        metavar="N",
        help="records in alarm before a warning opens",
    )
    tune.add_argument(
        "--grid-trend-beta",
        nargs="+",
        type=float,
        metavar="B",
        help="EMA weights of the trend baseline",
    )
    tune.add_argument(
        "--select",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="tune on the runs whose labels have these values only",
    )
    tune.add_argument(
        "--name", help="publish a named profile of the runs' model instead of the live config"
    )
    tune.add_argument("--profiles", help="folder --name publishes into (default: the store's)")
    tune.add_argument("--dry-run", action="store_true", help="report only; publish nothing")
    tune.add_argument("--json", action="store_true", help="the whole report as one JSON object")
    tune.add_argument("--note", default="", help="why: kept in the registry's history")
    what = tune.add_mutually_exclusive_group()
    what.add_argument(
        "--rollback",
        nargs="?",
        const="",
        metavar="VERSION",
        help="make the previous live config (or VERSION) live again",
    )
    what.add_argument("--history", action="store_true", help="the live config's changes")
    tune.set_defaults(func=_tune)
