"""``foreshock sink``, ``foreshock store …`` (info, check, compact, prune, export, migrate) and
``foreshock report`` (the lead-time table). No torch."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from foreshock.services import stop_on_signals
from foreshock.table import format_table
from foreshock.telemetry import MetricsPortError, add_metrics_options

__all__ = ["add_storage_commands", "lead_report"]

DEFAULT_STORE = "foreshock-history"


def _sink(args: argparse.Namespace) -> int:
    from foreshock.transport.settings import load_settings

    from .segments import StoreLockedError
    from .sink import StorageSink

    try:
        sink = StorageSink(load_settings(args.config), args.store, group_id=args.group,
                           retention_days=args.retention_days, metrics_port=args.metrics_port,
                           metrics_host=args.metrics_host)  # fmt: skip
    except StoreLockedError as exc:
        print(f"foreshock sink: {exc}", file=sys.stderr)
        return 2
    except MetricsPortError as exc:
        print(f"foreshock sink: {exc}", file=sys.stderr)
        return 2
    stop = stop_on_signals()
    print(f"foreshock sink: {args.store} (group {args.group})", flush=True)
    if sink.telemetry is not None:
        print(f"foreshock sink: metrics at {sink.telemetry.url}", flush=True)
    sink.run(stop, idle_exit=args.idle_exit)
    print(f"foreshock sink: {json.dumps(sink.stats)}", flush=True)
    return 0


def _info(args: argparse.Namespace) -> int:
    from . import queries
    from .reader import open_history

    with open_history(args.store) as history:
        rows = []
        for table, entries in history.manifest["tables"].items():
            rows.append([table, len(entries), sum(e["rows"] for e in entries)])
        runs = queries.run_count(history)
    print(format_table(["table", "segments", "rows"], rows))
    print(f"runs: {runs}; generation {history.generation}; "
          f"schema version {history.manifest['schema_version']}")  # fmt: skip
    return 0


def _check(args: argparse.Namespace) -> int:
    """Every stream complete? Exit 1 if one ended with seqs missing (see storage.reconcile)."""
    from .reader import open_history
    from .reconcile import check_streams

    with open_history(args.store) as history:
        checks = check_streams(history)
    if args.json:
        print(json.dumps([c.to_dict() for c in checks]))
    else:
        rows = [[c.run_id, c.rank, c.status, c.stored, c.expected,
                 " ".join(f"{a}-{b}" if a != b else str(a) for a, b in c.missing)]
                for c in checks if args.all or c.status != "complete"]  # fmt: skip
        print(format_table(["run", "rank", "status", "stored", "expected", "missing seqs"], rows))
        counts = {s: sum(c.status == s for c in checks) for s in ("complete", "incomplete", "open")}
        print(", ".join(f"{n} {s}" for s, n in counts.items()) + " streams")
    return 1 if any(c.status == "incomplete" for c in checks) else 0


def _writer(args: argparse.Namespace):
    from .segments import SegmentStore, StoreLockedError

    try:
        return SegmentStore(args.store, grace=0.0)
    except StoreLockedError as exc:
        print(f"foreshock store: {exc}", file=sys.stderr)
        return None


def _compact(args: argparse.Namespace) -> int:
    store = _writer(args)
    if store is None:
        return 2
    with store:
        print(f"{store.compact()} merges")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from .retention import prune

    store = _writer(args)
    if store is None:
        return 2
    with store:
        runs = prune(store, args.older_than_days)
        store.delete_retired()
    print(f"pruned {len(runs)} runs" + (f": {', '.join(runs)}" if runs else ""))
    return 0


def _export(args: argparse.Namespace) -> int:
    from .retention import export_query, export_run

    if args.run:
        try:
            counts = export_run(args.store, args.run, args.out)
        except ValueError as exc:
            print(f"foreshock store export: {exc}", file=sys.stderr)
            return 2
        print(f"{args.run} -> {args.out}: {counts}")
    else:
        print(f"{export_query(args.store, args.query, args.out)} rows -> {args.out}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from .migrations import migrate
    from .schema import SCHEMA_VERSION

    before = migrate(args.store)
    print(f"store {args.store}: schema version {before} -> {SCHEMA_VERSION}")
    return 0


def lead_report(rows: list[dict]) -> dict:
    """Per scenario: medians of the first warning steps, divergence and leads."""

    def med(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    scenarios: dict[str, list[dict]] = {}
    for row in rows:
        scenarios.setdefault(row["scenario"] or "(unlabelled)", []).append(row)
    return {s: {"runs": len(r), "diverged": sum(x["divergence_step"] is not None for x in r),
                **{f: med([x[f] for x in r]) for f in
                   ("attention_step", "router_step", "symptom_step", "divergence_step",
                    "mechanism_lead", "symptom_lead")}}
            for s, r in sorted(scenarios.items())}  # fmt: skip


_COLUMNS = ["attention_step", "router_step", "symptom_step", "divergence_step",
            "mechanism_lead", "symptom_lead"]  # fmt: skip
_HEADER = ["first attention-numerics warning", "first router warning", "first symptom warning",
           "loss divergence", "lead: mechanism", "lead: symptom"]  # fmt: skip


def _markdown(header: list[str], rows: list[list]) -> str:
    cells = [[("–" if v is None else str(v)) for v in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def _report(args: argparse.Namespace) -> int:
    from . import queries
    from .reader import open_history

    with open_history(args.store) as history:
        runs = queries.lead_table(history)
    summary = lead_report(runs)
    if args.json:
        print(json.dumps({"runs": runs, "scenarios": summary}))
        return 0
    header = ["scenario", "runs", "diverged", *(f"{h} (median)" for h in _HEADER)]
    rows = [[s, v["runs"], v["diverged"], *(v[c] for c in _COLUMNS)] for s, v in summary.items()]
    per_run = [[r["run_id"], r["scenario"], r["first_mechanism"], *(r[c] for c in _COLUMNS)]
               for r in runs]  # fmt: skip
    run_header = ["run", "scenario", "first mechanism warning (family:role)", *_HEADER]
    if args.markdown:
        print(_markdown(header, rows) + "\n\n" + _markdown(run_header, per_run))
    else:
        print(format_table(header, rows) + "\n\n" + format_table(run_header, per_run))
    return 0


def add_storage_commands(sub: argparse._SubParsersAction) -> None:
    sink = sub.add_parser("sink", help="store the metrics, warnings and dead letters (Kafka)")
    sink.add_argument("--store", default=DEFAULT_STORE, help="store folder (created)")
    sink.add_argument("--group", default="foreshock-sink", help="consumer group")
    sink.add_argument("--retention-days", type=float, help="prune runs idle this long")
    sink.add_argument("--idle-exit", type=float, help="stop after this many idle seconds")
    add_metrics_options(sink)  # --metrics-port, --metrics-host
    sink.set_defaults(func=_sink)
    store = sub.add_parser("store", help="inspect and maintain a store")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    for name, func, text in (("info", _info, "tables, segments and rows"),
                             ("compact", _compact, "merge small segments now"),
                             ("migrate", _migrate, "bring the schema up to date")):  # fmt: skip
        cmd = store_sub.add_parser(name, help=text)
        cmd.add_argument("--store", default=DEFAULT_STORE)
        cmd.set_defaults(func=func)
    check = store_sub.add_parser("check", help="is every run's stream complete? (exit 1 if not)")
    check.add_argument("--store", default=DEFAULT_STORE)
    check.add_argument("--json", action="store_true")
    check.add_argument("--all", action="store_true", help="list complete streams too")
    check.set_defaults(func=_check)
    prune = store_sub.add_parser("prune", help="remove runs with no data for N days")
    prune.add_argument("--store", default=DEFAULT_STORE)
    prune.add_argument("--older-than-days", type=float, required=True)
    prune.set_defaults(func=_prune)
    export = store_sub.add_parser("export", help="a run, or a query's result, to Parquet")
    export.add_argument("--store", default=DEFAULT_STORE)
    what = export.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", help="run id: one Parquet file per table in --out (a folder)")
    what.add_argument("--query", help="SQL over the views (runs, steps, metric_values, ...)")
    export.add_argument("--out", required=True)
    export.set_defaults(func=_export)
    report = sub.add_parser("report", help="lead-time table: first warnings vs divergence")
    report.add_argument("--store", default=DEFAULT_STORE)
    form = report.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true")
    form.add_argument("--markdown", action="store_true")
    report.set_defaults(func=_report)
