"""``foreshock detect`` (live worker or ``--replay``) and ``foreshock calibrate`` (no torch)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from importlib.resources import files
from pathlib import Path

from foreshock.table import format_table

from .config import DetectorConfig

__all__ = ["add_detector_commands", "default_config"]


def default_config() -> DetectorConfig:
    """The config calibrated on the shipped healthy lab runs (``detectors/calibrated.json``)."""
    path = files("foreshock.detectors").joinpath("calibrated.json")
    return DetectorConfig.load(str(path)) if path.is_file() else DetectorConfig()


def _load_config(path: str | None) -> DetectorConfig:
    return DetectorConfig.load(path) if path else default_config()


def _replay(args: argparse.Namespace) -> int:
    from .replay import replay

    config = _load_config(args.detector_config)
    reports = replay(args.replay, config)
    if args.json:
        for report in reports:
            print(json.dumps({
                "run_id": report.run_id, "scenario": report.labels.get("scenario"),
                "divergence_step": report.divergence_step, "config_version": config.version,
                "warnings": [a.to_message() for a in report.alerts],
            }))  # fmt: skip
        return 0
    rows = []
    for report in reports:
        div = report.divergence_step
        for alert in report.alerts or [None]:
            if alert is None:
                rows.append([report.run_id, "-", "-", "-", "-", "-", div, "-"])
                continue
            lead = None if div is None else div - alert.step
            rows.append([report.run_id, alert.family, alert.module or "-", alert.role,
                         alert.step, alert.false_alarm_rate, div, lead])  # fmt: skip
    print(format_table(["run", "family", "module", "role", "step", "false-alarm rate",
                        "divergence", "lead"], rows))  # fmt: skip
    print(f"detector config {config.version}")
    return 0


def _live(args: argparse.Namespace) -> int:
    from foreshock.transport.settings import load_settings

    from .worker import DetectorWorker

    worker = DetectorWorker(load_settings(args.config), _load_config(args.detector_config),
                            group_id=args.group)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"foreshock detect: group {args.group}, config {worker.config.version}", flush=True)
    worker.run(stop, idle_exit=args.idle_exit)
    print(f"foreshock detect: {worker.messages} messages, {worker.warnings} events", flush=True)
    return 0


def _detect(args: argparse.Namespace) -> int:
    return _replay(args) if args.replay else _live(args)


def _calibrate(args: argparse.Namespace) -> int:
    from .calibrate import calibrate, leave_one_out_margin, uncalibrated
    from .replay import replay

    base = _load_config(args.detector_config) if args.detector_config else DetectorConfig()
    reports = replay(args.healthy, uncalibrated(base))
    margin = args.margin if args.margin is not None else leave_one_out_margin(reports, base, args.k)
    config = calibrate(reports, base, k=args.k, margin=margin)
    config.save(args.out)
    rows = [[m, h] for m, h in config.thresholds.items()]
    print(format_table(["metric", "threshold h"], rows))
    print(f"false-alarm rate per run and family: {config.false_alarm}")
    print(f"-> {args.out} (version {config.version})", file=sys.stderr)
    return 0


def add_detector_commands(sub: argparse._SubParsersAction) -> None:
    detect = sub.add_parser("detect", help="online detectors: live worker, or --replay runs")
    detect.add_argument("--replay", nargs="+", type=Path, metavar="RUN",
                        help="run files written by `foreshock lab run --out`")  # fmt: skip
    detect.add_argument("--json", action="store_true", help="one JSON object per run")
    detect.add_argument("--detector-config", help="calibrated config (default: shipped)")
    detect.add_argument("--group", default="foreshock-detectors", help="consumer group")
    detect.add_argument("--idle-exit", type=float, help="live: stop after this many idle s")
    detect.set_defaults(func=_detect)
    cal = sub.add_parser("calibrate", help="set detector thresholds from healthy runs")
    cal.add_argument("--healthy", nargs="+", type=Path, required=True, metavar="RUN")
    cal.add_argument("--out", required=True, help="config file to write (JSON)")
    cal.add_argument("--k", type=int, default=1, help="k-th largest healthy maximum")
    cal.add_argument(
        "--margin",
        type=float,
        help="relative margin over it (default: per metric, by leave-one-out)",
    )
    cal.add_argument("--detector-config", help="rules to start from (default: built-in)")
    cal.set_defaults(func=_calibrate)
