"""``foreshock sink``, ``foreshock store …`` (info, check, maintain, prune, export, migrate) and
``foreshock report`` (the lead-time table). No torch.

``--store`` takes a folder or a URI (``s3://…``); without it, the ``[store]`` section of the
settings file or ``$FORESHOCK_STORE`` decides (:mod:`foreshock.storage.location`)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

from foreshock.table import format_table
from foreshock.telemetry import add_metrics_options

from .location import RETAIN_HOURS

__all__ = ["add_storage_commands", "lead_report"]


def location_of(args: argparse.Namespace):
    from .location import load_location

    return load_location(args.store, getattr(args, "config", None))


def _sink(args: argparse.Namespace) -> int:
    from foreshock.transport.service import config_from_args, serve

    from .sink import SinkConfig, StorageSink

    config = config_from_args(SinkConfig, args, root=location_of(args))
    started = f"{config.root.uri} (group {args.group})"
    return serve("sink", StorageSink, config, args, lambda _: started, _sunk)


def _sunk(sink) -> str:
    return json.dumps(sink.stats.as_dict())


def _damaged(args: argparse.Namespace, command: str) -> bool:
    """Say which commits are damaged (a sentence each, and the way out); True if any. A
    torn commit used to end every store command in a Python and Rust backtrace."""
    from .repair import damaged_commits

    damage = damaged_commits(location_of(args))
    for d in damage:
        print(f"foreshock store {command}: {d.sentence()}", file=sys.stderr)
    if damage:
        print(
            f"foreshock store {command}: `foreshock store repair --store {args.store or '…'}` "
            "rewrites the log to the last good version",
            file=sys.stderr,
        )
    return bool(damage)


def _repair(args: argparse.Namespace) -> int:
    """Rewrite damaged tables' logs to their last good version (see storage.repair)."""
    from .repair import repair

    try:
        done = repair(location_of(args))
    except ValueError as exc:
        print(f"foreshock store repair: {exc}", file=sys.stderr)
        return 2
    for line in done:
        print(line)
    print("nothing damaged" if not done else f"repaired {len(done)} table(s)")
    return 0


def _info(args: argparse.Namespace) -> int:
    from . import queries
    from .reader import open_history

    if _damaged(args, "info"):
        return 2
    with open_history(location_of(args)) as history:
        rows = [
            [
                table,
                history.versions[table],
                history.files[table],
                history.sql(f"SELECT count(*) AS n FROM {table}")["n"][0].as_py(),
            ]
            for table in history.versions
        ]
        runs = queries.run_count(history)
    print(format_table(["table", "version", "files", "rows"], rows))
    print(f"runs: {runs}; snapshot {history.version}; store {history.location.uri}")
    return 0


def _check(args: argparse.Namespace) -> int:
    """Every stream complete? Exit 1 if one ended with seqs missing (see storage.reconcile)."""
    from . import stream_queries
    from .reader import open_history
    from .reconcile import check_streams

    if _damaged(args, "check"):
        return 2
    with open_history(location_of(args)) as history:
        checks = check_streams(history)
        doubled = stream_queries.duplicate_records(history)
        mismatched = stream_queries.value_count_mismatches(history)
    if args.json:
        print(
            json.dumps(
                {
                    "streams": [c.to_dict() for c in checks],
                    "duplicated": doubled,
                    "value_mismatches": mismatched,
                }
            )
        )
    else:
        rows = [
            [
                c.run_id,
                c.rank,
                c.attempt,
                c.status,
                c.stored,
                c.expected,
                " ".join(f"{a}-{b}" if a != b else str(a) for a, b in c.missing),
            ]
            for c in checks
            if args.all or c.status != "complete"
        ]
        print(
            format_table(
                ["run", "rank", "attempt", "status", "stored", "expected", "missing seqs"], rows
            )
        )
        counts = {s: sum(c.status == s for c in checks) for s in ("complete", "incomplete", "open")}
        print(", ".join(f"{n} {s}" for s, n in counts.items()) + " streams")
        for row in doubled:
            extra = row["extra"]
            print(
                f"DUPLICATED: {row['run_id']} rank {row['rank']} attempt {row['attempt']}: "
                f"{extra} seqs stored twice"
            )
        for row in mismatched:
            print(f"VALUES: {row['run_id']}: {row['stored']} stored, records say {row['expected']}")
    bad = doubled or mismatched or any(c.status == "incomplete" for c in checks)
    return 1 if bad else 0


def _maintain(args: argparse.Namespace) -> int:
    from .store import DeltaStore

    report = DeltaStore(location_of(args)).maintain(args.retain_hours, vacuum=not args.no_vacuum)
    rows = [[t, r["files_removed"], r["files_added"], r["vacuumed"]] for t, r in report.items()]
    print(format_table(["table", "files compacted", "into", "files vacuumed"], rows))
    return 0


def _prune(args: argparse.Namespace) -> int:
    from .retention import prune
    from .store import DeltaStore

    runs = prune(DeltaStore(location_of(args)), args.older_than_days)
    print(
        f"pruned {len(runs)} runs"
        + (f": {', '.join(runs)}" if runs else "")
        + " (their files go at the next vacuum: `foreshock store maintain`)"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from .retention import export_query, export_run

    if args.run:
        try:
            counts = export_run(location_of(args), args.run, args.out)
        except ValueError as exc:
            print(f"foreshock store export: {exc}", file=sys.stderr)
            return 2
        print(f"{args.run} -> {args.out}: {counts}")
    else:
        from .reader import QueryError

        try:
            rows = export_query(location_of(args), args.query, args.out)
        except (ValueError, QueryError) as exc:  # refused, or a query DuckDB cannot run
            print(f"foreshock store export: {exc}", file=sys.stderr)
            return 2
        print(f"{rows} rows -> {args.out}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .migrations import SEGMENT_MANIFEST, migrate, migrate_segments
    from .schema import SCHEMA_VERSION

    location = location_of(args)
    if location.is_local and (Path(location.uri) / SEGMENT_MANIFEST).exists():
        counts = migrate_segments(location.uri)
        print(
            f"store {location.uri}: segment store -> Delta tables, rows {counts} (checked); "
            f"the old segments are in {Path(location.uri) / 'data'}: delete them when done"
        )
    before = migrate(location)
    print(f"store {location.uri}: schema version {before} -> {SCHEMA_VERSION}")
    return 0


def lead_report(rows: list[dict]) -> dict:
    """Per scenario: medians of the first warning steps, divergence and leads."""

    def med(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    scenarios: dict[str, list[dict]] = {}
    for row in rows:
        scenarios.setdefault(row["scenario"] or "(unlabelled)", []).append(row)
    return {
        s: {
            "runs": len(r),
            "diverged": sum(x["divergence_step"] is not None for x in r),
            **{
                f: med([x[f] for x in r])
                for f in (
                    "attention_step",
                    "router_step",
                    "symptom_step",
                    "divergence_step",
                    "mechanism_lead",
                    "symptom_lead",
                )
            },
        }
        for s, r in sorted(scenarios.items())
    }


_COLUMNS = [
    "attention_step",
    "router_step",
    "symptom_step",
    "divergence_step",
    "mechanism_lead",
    "symptom_lead",
]
_HEADER = [
    "first attention-numerics warning",
    "first router warning",
    "first symptom warning",
    "loss divergence",
    "lead: mechanism",
    "lead: symptom",
]


def _markdown(header: list[str], rows: list[list]) -> str:
    cells = [[("–" if v is None else str(v)) for v in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def _report(args: argparse.Namespace) -> int:
    from . import queries
    from .reader import open_history

    with open_history(location_of(args)) as history:
        runs = queries.lead_table(history)
    summary = lead_report(runs)
    if args.json:
        print(json.dumps({"runs": runs, "scenarios": summary}))
        return 0
    header = ["scenario", "runs", "diverged", *(f"{h} (median)" for h in _HEADER)]
    rows = [[s, v["runs"], v["diverged"], *(v[c] for c in _COLUMNS)] for s, v in summary.items()]
    per_run = [
        [r["run_id"], r["scenario"], r["first_mechanism"], *(r[c] for c in _COLUMNS)] for r in runs
    ]
    run_header = ["run", "scenario", "first mechanism warning (family:role)", *_HEADER]
    if args.markdown:
        print(_markdown(header, rows) + "\n\n" + _markdown(run_header, per_run))
    else:
        print(format_table(header, rows) + "\n\n" + format_table(run_header, per_run))
    return 0


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        help="folder or URI (default: [store] uri in --config, "
        "$FORESHOCK_STORE, else ./foreshock-history)",
    )


def add_storage_commands(
    sub: argparse._SubParsersAction, import_runs: Callable[[argparse.Namespace], int] | None = None
) -> None:
    """``foreshock sink``, ``store …`` and ``report``. ``store import`` replays the runs' warnings
    through the detectors, a room above this one: the CLI hands its handler in
    (:func:`foreshock.operate.store_runs.import_runs`)."""
    sink = sub.add_parser("sink", help="store the metrics, warnings and dead letters (Kafka)")
    sink.add_argument(
        "--store",
        help="folder or URI (default: [store] uri in --config, "
        "$FORESHOCK_STORE, else ./foreshock-history)",
    )
    sink.add_argument("--group", default="foreshock-sink", help="consumer group")
    sink.add_argument(
        "--take-over",
        action="store_true",
        help="start although another sink group wrote this store in the last 10 min "
        "(only once that group is stopped: two groups store every record twice)",
    )
    sink.add_argument("--retention-days", type=float, help="prune runs idle this long")
    sink.add_argument(
        "--retain-hours",
        type=float,
        default=RETAIN_HOURS,
        help="vacuum keeps versions this young readable (default: a week)",
    )
    sink.add_argument("--idle-exit", type=float, help="stop after this many idle seconds")
    add_metrics_options(sink)  # --metrics-port, --metrics-host
    sink.set_defaults(func=_sink)
    store = sub.add_parser("store", help="inspect and maintain a store")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    commands = [
        ("info", _info, "tables, versions, files and rows"),
        ("migrate", _migrate, "segment store -> Delta tables; schema up to date"),
        ("repair", _repair, "a damaged commit: the log rewritten to the last good version"),
    ]
    for name, func, text in commands:
        cmd = store_sub.add_parser(name, help=text)
        _store_option(cmd)
        cmd.set_defaults(func=func)
    if import_runs is not None:
        imports = store_sub.add_parser("import", help="runs from JSON Lines files (no broker)")
        _store_option(imports)
        imports.add_argument("runs", nargs="+", metavar="RUN", help="run files (.jsonl[.gz])")
        imports.add_argument("--no-warnings", action="store_true", help="skip the detectors")
        imports.set_defaults(func=import_runs)
    maintain = store_sub.add_parser("maintain", help="compact small files, vacuum old ones")
    _store_option(maintain)
    maintain.add_argument(
        "--retain-hours",
        type=float,
        default=RETAIN_HOURS,
        help="keep versions this young readable (default: a week)",
    )
    maintain.add_argument("--no-vacuum", action="store_true", help="compact only")
    maintain.set_defaults(func=_maintain)
    check = store_sub.add_parser(
        "check", help="every stream complete, nothing stored twice? (exit 1 if not)"
    )
    _store_option(check)
    check.add_argument("--json", action="store_true")
    check.add_argument("--all", action="store_true", help="list complete streams too")
    check.set_defaults(func=_check)
    prune = store_sub.add_parser("prune", help="remove runs with no data for N days")
    _store_option(prune)
    prune.add_argument("--older-than-days", type=float, required=True)
    prune.set_defaults(func=_prune)
    export = store_sub.add_parser("export", help="a run, or a query's result, to Parquet")
    _store_option(export)
    what = export.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", help="run id: one Parquet file per table in --out (a folder)")
    what.add_argument("--query", help="SQL over the views (runs, steps, metric_values, ...)")
    export.add_argument("--out", required=True)
    export.set_defaults(func=_export)
    report = sub.add_parser("report", help="lead-time table: first warnings vs divergence")
    _store_option(report)
    form = report.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true")
    form.add_argument("--markdown", action="store_true")
    report.set_defaults(func=_report)
