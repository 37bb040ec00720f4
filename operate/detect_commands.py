"""``foreshock detect`` (live worker or ``--replay``), ``foreshock calibrate`` and
``foreshock tune`` (no torch)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.make_profile import MIN_HEALTHY_RUNS
from foreshock.detectors.profiles import (
    ProfileConfigs,
    load_profiles,
    merged,
    shipped_profiles,
    with_live,
)
from foreshock.detectors.registry import profiles_folder
from foreshock.detectors.signatures import describe
from foreshock.table import format_table

from .tune_commands import add_tune_command, profiles_folder_of, selection

__all__ = ["add_detector_commands", "default_config"]


def default_config() -> ProfileConfigs:
    """The configs calibrated on the shipped healthy lab runs, one per profile (architecture
    and dispatch, ``detectors/calibrated/<profile>.json``): each run gets the one that fits."""
    return shipped_profiles()


def _load_config(path: str | None) -> DetectorConfig | ProfileConfigs:
    return DetectorConfig.load(path) if path else default_config()


def _detect_config(
    args: argparse.Namespace, quiet: bool = False
) -> DetectorConfig | ProfileConfigs:
    """``--detector-config``, else the store's live config (``--store``), else the shipped one;
    with ``--store``, the profiles published there beside either."""
    if args.store is None:
        return _load_config(args.detector_config)
    from foreshock.detectors.registry import live_config

    config = live_config(args.store)
    published = load_profiles(profiles_folder(args.store))
    if config is None:  # the shipped profiles, and those published into this store
        if not quiet:
            print(
                f"foreshock detect: no live config in {args.store} (run `foreshock tune`); "
                f"using the shipped profiles and {len(published.configs)} published there",
                file=sys.stderr,
            )
        return merged(default_config(), published)
    return with_live(config, published) if published.configs else config


def _replay(args: argparse.Namespace) -> int:
    from foreshock.detectors.replay import replay

    config = _detect_config(args)
    try:
        reports = replay(args.replay, config)
    except (ValueError, OSError) as exc:
        print(f"foreshock detect --replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for report in reports:
            print(
                json.dumps(
                    {
                        "run_id": report.run_id,
                        "scenario": report.labels.get("scenario"),
                        "divergence_step": report.divergence_step,
                        "config_version": config.version,
                        "profile": report.profile,
                        "profile_reason": report.profile_reason,
                        "unruled": report.unruled,
                        "reach": report.reach,
                        "warnings": [a.to_message() for a in report.alerts],
                    }
                )
            )
        return 0
    rows: list[list[object]] = []
    for report in reports:
        div = report.divergence_step
        if not report.alerts:
            rows.append([report.run_id, report.profile, "-", "-", "-", "-", "-", "-", div, "-"])
        for alert in report.alerts:
            lead = None if div is None else div - alert.step
            rule = f"{alert.evidence.get('detector')} {alert.series.split('@')[0]}"
            rows.append(
                [
                    report.run_id,
                    report.profile,
                    alert.family,
                    alert.module or "-",
                    alert.role,
                    rule,
                    alert.step,
                    alert.false_alarm_rate,
                    div,
                    lead,
                ]
            )
    headers = ["run", "profile", "family", "module", "role", "rule", "step"]
    print(format_table([*headers, "false-alarm rate", "divergence", "lead"], rows))
    for report in reports:
        print(_profile_note(report))
    print(f"detector config {config.version}")
    return 0


def _profile_note(report) -> str:
    """Which profile judged a run, why, and what it left unread."""
    text = f"{report.run_id}: profile {report.profile} ({report.profile_reason})"
    if report.unruled:
        text += "; no rule for " + ", ".join(
            f"{metric} ({why})" for metric, why in report.unruled.items()
        )
    reach = "".join(f"\n  {metric}: {what}" for metric, what in report.reach.items())
    return text + (f"\n  what each rule takes to fire on this run:{reach}" if reach else "")


def _live(args: argparse.Namespace) -> int:
    from foreshock.detectors.worker import DetectorWorker, WorkerConfig
    from foreshock.transport.service import config_from_args, serve

    reload = build = switched = None
    if args.store is not None:  # the store's profiles as they are now, and its builder
        from functools import partial

        from .profile_builder import build_profiles, record_switch

        reload = partial(_detect_config, args, quiet=True)
        build = partial(build_profiles, args.store)
        switched = partial(record_switch, args.store)
    config = config_from_args(
        WorkerConfig, args, detectors=_detect_config(args), reload=reload, build_profiles=build,
        on_switch=switched,
    )  # fmt: skip
    started = f"group {args.group}, config {config.detectors.version}"
    return serve("detect", DetectorWorker, config, args, lambda _: started, _detected)


def _detected(worker) -> str:
    return f"{worker.stats.messages} messages, {worker.stats.warnings} events"


def _detect(args: argparse.Namespace) -> int:
    return _replay(args) if args.replay else _live(args)


def _calibrate(args: argparse.Namespace) -> int:
    """A profile from healthy runs (files, or a store's runs selected by label): bands,
    thresholds and the optimizer test (``make_profile``), published by ``--name`` beside
    the shipped profiles, or written to ``--out``."""
    from foreshock.detectors.make_profile import ProfileError, make_profile, recipes_of
    from foreshock.detectors.profiles import save_profile
    from foreshock.detectors.replay import replay_run

    try:
        runs = _healthy_runs(args)
        base = DetectorConfig.load(args.detector_config) if args.detector_config else None
        config, signatures = make_profile(runs, replay_run, args.allow_few, base)
        where: str | Path
        if args.name:
            recipes = recipes_of(runs)
            where = save_profile(profiles_folder_of(args), args.name, config, signatures, recipes)
        else:
            config.save(args.out)
            where = Path(args.out)
    except (ProfileError, ValueError, OSError) as exc:
        print(f"foreshock calibrate: {exc}", file=sys.stderr)
        return 2
    if "too_few_runs" in config.calibration:
        print(
            f"WARNING: {config.calibration['too_few_runs']}: thresholds are noise", file=sys.stderr
        )
    rows = [[m, h] for m, h in config.thresholds.items()]
    print(format_table(["metric", "threshold h"], rows))
    print(f"{len(runs)} healthy runs of {describe(signatures[0])}; bands: {len(config.bands)}")
    print(f"optimizer test: weight norm above its band by {config.inflation_h} widths")
    print(f"-> {where} (version {config.version})", file=sys.stderr)
    return 0


def _healthy_runs(args: argparse.Namespace) -> list:
    """``--healthy`` files, else the finished runs of ``--from-store`` whose labels match
    every ``--select KEY=VALUE``."""
    from foreshock.transport.run_files import load_run

    if args.healthy:
        return [load_run(path) for path in args.healthy]
    from .tune import load_runs

    wanted = selection(args.select)
    runs, _, _ = load_runs(args.from_store)
    return [
        r
        for r in runs
        if all(str(r.start.get("labels", {}).get(k)) == v for k, v in wanted.items())
    ]


def add_detector_commands(sub: argparse._SubParsersAction) -> None:
    detect = sub.add_parser("detect", help="online detectors: live worker, or --replay runs")
    detect.add_argument(
        "--replay",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="run files written by `foreshock lab run --out`",
    )
    detect.add_argument("--json", action="store_true", help="one JSON object per run")
    source = detect.add_mutually_exclusive_group()
    source.add_argument("--detector-config", help="calibrated config (default: shipped)")
    source.add_argument("--store", help="use the live config `foreshock tune` published here")
    detect.add_argument("--group", default="foreshock-detectors", help="consumer group")
    detect.add_argument("--idle-exit", type=float, help="live: stop after this many idle s")
    from foreshock.telemetry import add_metrics_options

    add_metrics_options(detect)  # live: --metrics-port, --metrics-host
    detect.set_defaults(func=_detect)
    cal = sub.add_parser("calibrate", help="make a profile (bands, thresholds) from healthy runs")
    runs = cal.add_mutually_exclusive_group(required=True)
    runs.add_argument("--healthy", nargs="+", type=Path, metavar="RUN", help="run files")
    runs.add_argument("--from-store", metavar="ROOT", help="the finished runs of a store…")
    cal.add_argument(
        "--select",
        nargs="*",
        default=["scenario=healthy"],
        metavar="KEY=VALUE",
        help="…whose labels say so (default: scenario=healthy)",
    )
    out = cal.add_mutually_exclusive_group(required=True)
    out.add_argument("--name", help="publish a named profile beside the shipped ones")
    out.add_argument("--out", help="write the config to this file (JSON) instead")
    cal.add_argument("--profiles", help="folder to publish into (default: the store's)")
    cal.add_argument("--store", help="store whose registry gets the profile")
    cal.add_argument(
        "--allow-few",
        action="store_true",
        help=f"allow fewer than {MIN_HEALTHY_RUNS} healthy runs (warned: thresholds are noise)",
    )
    cal.add_argument("--detector-config", help="rules to start from (default: the band rules)")
    cal.set_defaults(func=_calibrate)
    add_tune_command(sub)
