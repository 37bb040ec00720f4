"""Generate ``benchmarks/README.md`` from measured results — never typed by hand.

``python -m benchmarks.readme --run NAME [NAME ...]`` (or ``--run all``) runs each benchmark's
command, keeps its closing JSON line in ``benchmarks/results/<name>.json`` together with the
command, the time and the machine, then rewrites the README from every stored result, and the
generated parts of the docs (``docs/detectors.md``'s detection table, ``docs/benchmarks.md``'s
figures). ``python -m benchmarks.readme`` alone only rewrites them. Each row names the command
that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foreshock import catalogue

HERE = Path(__file__).parent
RESULTS = HERE / "results"

Rows = Callable[[dict[str, Any]], list[tuple[str, str]]]


def _spectra(r: dict) -> list[tuple[str, str]]:
    return [
        (
            f"compressed cores vs dense SVD of each head's d×d Δ2, one layer, d = {x['d']} "
            f"({x['heads']} heads of {r['d_head']})",
            f"{x['speedup_dense_over_best']:.0f}× faster; entropy error "
            f"{min(x['err_eigh'], x['err_svd']):.1e}",
        )
        for x in r["results"]
    ]


def _overhead(r: dict) -> list[tuple[str, str]]:
    model = r["model"].get("name", "lab")
    every, share = r.get("target_every"), r.get("target_share")
    rows = [
        (
            f"{model}: monitor time per training step at δ = {d} (inside the monitor)",
            f"{r[f'direct_every{d}']:.2%}"
            + (f" (target ≤ {share:.0%})" if share is not None and d == every else ""),
        )
        for d in (10, 100)
    ]
    rows.append(
        (
            f"{model}: end-to-end step-time difference at δ = 10 (noise of a few %)",
            f"{r['overhead_every10']:+.2%}",
        )
    )
    return rows


def _sharded_equality(r: dict) -> list[tuple[str, str]]:
    """Each parallelism's global records against the single process (``sharded_equality``)."""
    rows = []
    for m in r["modes"]:
        fam = {f: v["worst"] for f, v in m["families"].items()}
        rows.append(
            (
                f"{m['parallelism']}, {m['ranks']} ranks: worst difference, "
                "relative on a scale ≥ 1",
                f"{m['worst']:.1e} (attention {fam.get('attention-numerics', 0):.1e}, router "
                f"{fam.get('router', 0):.1e}, symptoms {fam.get('symptom', 0):.1e}); "
                f"{m['values_compared']} values in {m['records']} records, "
                f"{len(m['missing'])} missing",
            )
        )
    return rows


def _zero_shot(r: dict) -> list[tuple[str, str]]:
    """Per held-out group and scenario: right of judged, median lead, envelope lead."""
    rows = []
    for row in r["rows"]:
        what = {
            "healthy": "quiet (no mechanism warning)",
            "fa-lowprec": "attention named first",
            "lr-high": "warned, not named attention",
        }[row["scenario"]]
        value = f"{row['right']} {what}"
        if row["median lead"] is not None:
            value += f"; median lead {row['median lead']}"
        if row.get("envelope lead") is not None:
            value += f" (envelope {row['envelope lead']})"
        if row.get("tightest") is not None:
            value += f"; tightest thresholds: {_tightest(row)}"
        rows.append((f"{row['held out']} held out: {row['scenario']} ({row['runs']} runs)", value))
    return rows


def _tightest(row: dict) -> str:
    """The zero-shot row's ceiling (every margin 0: see ``benchmarks.zero_shot``)."""
    if row["scenario"] == "healthy":
        return f"{row['tightest']} quiet"
    return f"lead {row['tightest']}"


def _flapping(r: dict) -> list[tuple[str, str]]:
    """Per profile's held-out fault runs: warnings opened and reopened, without and with."""
    rows = [("release (records below h before a warning resolves)", str(r["release"]))]
    for row in r["rows"]:
        before = f"{row['opened (release 1)']} opened, {row['reopened (release 1)']} reopened"
        chosen = f"release {r['release']}"
        after = f"{row[f'opened ({chosen})']} opened, {row[f'reopened ({chosen})']} reopened"
        same = "same" if row["first warnings unchanged"] else "CHANGED"
        rows.append(
            (
                f"{row['profile']}: {row['held-out runs']} held-out fault runs",
                f"release 1: {before}; {chosen}: {after}; first warnings {same}",
            )
        )
    return rows


def _profile_size(r: dict) -> list[tuple[str, str]]:
    """Per group and profile: quiet healthy, attention named, LR warned, fa-lowprec lead."""
    return [
        (
            f"{row['group']}: {row['profile']}",
            f"healthy quiet {row['healthy']}; fa-lowprec named {row['fa-lowprec']}; "
            f"lr-high warned {row['lr-high']}; fa lead {row['fa lead']}",
        )
        for row in r["rows"]
    ]


def _overhead_sharded(r: dict) -> list[tuple[str, str]]:
    """Per-rank cost under FSDP2 against the single process (``overhead --sharded``)."""
    m, s = r["model"], r["single"]
    rows = [
        (
            f"single process: monitor per monitoring step, Llama {m['num_hidden_layers']} "
            f"layers, d = {m['hidden_size']} ({m['num_attention_heads']} heads), δ = 1",
            f"{s['monitor_ms']:.0f} ms (spectra {s['spectra_ms']:.0f} ms); snapshots "
            f"{s['snapshot_bytes'] / 1e6:.1f} MB, transient "
            f"+{s['heap_peak_delta_bytes'] / 1e6:.1f} MB",
        )
    ]
    for run in r["runs"]:
        ranks, world = run["ranks"], run["world"]
        if run["mode"] == "single-control":
            continue
        slow = max(ranks, key=lambda x: x["monitor_ms"])
        met = sum(x["meets_target"] for x in ranks)
        met_shared = sum(x["meets_target_shared"] for x in ranks)
        shared = f", {world} ranks on {r['cores']} cores" if run["oversubscribed"] else ""
        partials = ranks[0]["bytes_per_step"] - min(x["bytes_per_step"] for x in ranks[1:])
        rows += [
            (
                f"{run['mode']} × {world}: monitor per rank, slowest rank (median){shared}",
                f"{slow['monitor_ms']:.0f} ms vs target {slow['target_ms']:.0f} ms (single / "
                f"{world} + its gathers {slow['gather_ms']:.0f} ms): {met}/{world} ranks met; "
                f"vs {slow['target_shared_ms']:.0f} ms with the single process sharing the "
                f"cores alike: {met_shared}/{world} met; spectra {slow['spectra_ms']:.0f} ms, "
                f"exchange {slow['exchange_ms']:.0f} ms",
            ),
            (
                f"{run['mode']} × {world}: received per rank and monitoring step; memory",
                f"{min(x['bytes_per_step'] for x in ranks) / 1e6:.2f} MB (rank 0 also "
                f"{partials / 1e3:.1f} kB of partial records); snapshots "
                f"{max(x['snapshot_bytes'] for x in ranks) / 1e6:.1f} MB, transient "
                f"+{max(x['heap_peak_delta_bytes'] for x in ranks) / 1e6:.1f} MB per rank",
            ),
        ]
    return rows


def _max_logit(r: dict) -> list[tuple[str, str]]:
    return [
        (
            f"max_logit via the attention registry, tiny Mixtral ({r['layers']} layers, "
            f"batch {r['batch']} × {r['tokens']}): forward + backward on a monitoring step",
            f"{r['overhead_on']:+.1%} vs plain SDPA",
        ),
        (
            "… on every other step (wrapper installed, disarmed)",
            f"{r['overhead_off']:+.1%} (noise)",
        ),
    ]


def _detection(r: dict) -> list[tuple[str, str]]:
    rows = [
        (
            "profile; calibration runs; config",
            f"{r.get('profile', 'gpt-moe')}; "
            f"{r['calibration_runs']} healthy; `{r['config_version']}`",
        )
    ]
    for scenario, s in r["scenarios"].items():
        if scenario in ("healthy", "fa-noise", "router-mild"):
            rows.append(
                (
                    f"false warnings on held-out {scenario} runs",
                    f"{s['detected']} of {s['runs']} runs",
                )
            )
            continue
        a = s["attribution"]
        symptom = s["symptom_lead_median"] if s["symptom_lead_median"] is not None else "–"
        lead = (
            f"; median lead {s['mechanism_lead_median']} steps (mechanism) vs "
            f"{symptom} (symptom: loss, grad norm, weight norm)"
            if s["mechanism_lead_median"] is not None
            else ""
        )
        earlier = (
            f"; own family before any symptom warning in "
            f"{s['own_family_before_symptom']}/{s['diverged']} diverged runs"
            if s.get("diverged")
            else ""
        )
        rows.append(
            (
                f"{scenario}: warned by its own family before divergence",
                f"{s['detected']}/{s['runs']}; attribution right {a['correct']}, wrong "
                f"{a['wrong']}, ambiguous {a['ambiguous']}{lead}{earlier}",
            )
        )
        rows += _envelope(scenario, s.get("envelope", {}))
    return rows


def _envelope(scenario: str, envelope: dict) -> list[tuple[str, str]]:
    """The own family's envelope lead (a ceiling) beside the detectors' lead."""
    rows = []
    for family, e in envelope.items():
        if family == "symptom" or not e.get("family_best_median") or not e.get("diverged"):
            continue
        detectors = e.get("detector_lead_median")
        share = f" ({detectors / e['family_best_median']:.0%})" if detectors else ""
        rows.append(
            (
                f"{scenario}: {family} envelope lead (family best, median)",
                f"{e['family_best_median']} steps; detectors {detectors}{share}",
            )
        )
    return rows


def _router_collapse(r: dict) -> list[tuple[str, str]]:
    rows = []
    for profile, figures in r["profiles"].items():
        for scenario, f in figures.items():
            dropped = "" if f["dropped"] is None else f", dropped fraction {f['dropped']}"
            rows.append(
                (
                    f"{profile}, {scenario} ({f['runs']} runs, {f['diverged']} diverged)",
                    f"loss {f['loss']} (gap {f['loss_gap']:+}), token entropy "
                    f"{f['token_entropy']}{dropped}",
                )
            )
    return rows


def _transport(r: dict) -> list[tuple[str, str]]:
    offered = r["offered_per_producer_per_s"]
    pace = f"{offered:g} msg/s each" if offered else "as fast as the sinks take them"
    who = f"{r['producers']} producers in {r['processes']} processes, {pace}"
    return [
        (f"{who}: messages delivered / lost", f"{r['messages']:,} / {r['lost']}"),
        (
            "delivered rate",
            f"{r['messages_per_s']:,.0f} msg/s = {r['values_per_s']:,.0f} metric values/s",
        ),
        (
            "latency p50 / p95 / p99 (write → consumed)",
            f"{r['latency_p50_s']:.2f} / {r['latency_p95_s']:.2f} / {r['latency_p99_s']:.2f} s",
        ),
    ]


def _detectors(r: dict) -> list[tuple[str, str]]:
    rows = []
    for x in r["rounds"]:
        split = ", ".join(f"{k} {v} s" for k, v in x["time_split_s"].items())
        rows.append(
            (
                f"{x['workers']} worker(s), {x['values']:,} values",
                f"{x['values_per_s']:,} values/s ({split})",
            )
        )
    return rows


def _band_frontier(r: dict) -> list[tuple[str, str]]:
    rows = []
    for v in r["variants"]:
        shipped = " (shipped)" if all(v[k] == r["shipped"][k] for k in r["shipped"]) else ""
        share = "-" if v["share"] is None else f"{v['share']:.1%} of its envelope"
        lead = (
            ""
            if v["fa_lowprec_lead"] is None
            else f"fa-lowprec lead {v['fa_lowprec_lead']} ({share}), "
        )
        rows.append(
            (
                f"floor {v['floor']}, margin {v['margin']}, confirm {v['confirm']}{shipped}: "
                f"{v['profile']}",
                f"{lead}false warnings {v['false_warnings']}/{v['quiet_runs']}, "
                f"wrong causes {v['wrong_cause']}",
            )
        )
    for profile, table in r.get("persistence", {}).items():
        for metric, p in table.items():
            ratio = "" if p["ratio"] is None else f", ratio {p['ratio']}"
            rows.append(
                (
                    f"persistence of healthy excursions: {metric} on {profile}",
                    f"held 1 record {p['held_1']}, 2 records {p['held_2']} widths{ratio}",
                )
            )
    return rows


def _false_alarms(r: dict) -> list[tuple[str, str]]:
    rows = []
    for least, rates in r["false_warning_rate"].items():
        shipped = " (shipped)" if float(least) == r["shipped_least_margin"] else ""
        rows.append(
            (
                f"unseen healthy runs with a false warning, least margin "
                f"{float(least):.0%}{shipped}",
                ", ".join(f"{f} {v:.1%}" for f, v in rates.items()),
            )
        )
    return rows


def _lab_table(r: dict) -> list[tuple[str, str]]:
    return [
        ("runs read", f"{r['runs']} (CPU per run: median {r['cpu_seconds_median']:.0f} s)"),
        ("band", f"pad {r['band']['pad']} × width, {r['band']['consecutive']} checks in a row"),
    ]


def _lab_reproducibility(r: dict) -> list[tuple[str, str]]:
    differing = ", ".join(r["differing"][:8]) + (" …" if len(r["differing"]) > 8 else "")
    return [
        (
            f"shipped runs whose first {r['steps'] - 1} steps retrain bit-identical here "
            f"(CPU {r['cpu_capability']}, torch {r['torch']})",
            f"{r['identical']}/{r['runs']}; differing: {differing or 'none'}",
        )
    ]


def _storage(r: dict) -> list[tuple[str, str]]:
    q = r["query_seconds"]
    rows = [("ingest, Kafka → store (one sink)", f"{r['ingest_values_per_s']:,} values/s")]
    if "ingest_values_per_s_2_sinks" in r:
        scaling = r["ingest_scaling_2_over_1"]
        rows.append(
            (
                "ingest, two sink processes in one group",
                f"{r['ingest_values_per_s_2_sinks']:,} values/s "
                f"({scaling:.2f}× one sink; target ≥ 1.6×)",
            )
        )
    rows += [
        (
            f"fleet query, {r['history_runs']} runs × {r['history_steps']:,} steps",
            f"{q['fleet']:.2f} s",
        ),
        ("run page queries", f"{q['run page']:.2f} s"),
    ]
    remote = r.get("layouts", {}).get(r.get("history_layout"), {}).get("query_seconds", {})
    if "remote_cached" in remote:
        cached, off = remote["remote_cached"], remote["pyarrow_dataset"]
        cold = cached["run page, cold cache"]
        rows.append(
            (
                "run page queries, a remote store's read path (local files read as remote)",
                f"{cached['run page']:.2f} s with the read cache ({cold:.2f} s cold); "
                f"{off['run page']:.2f} s with it off",
            )
        )
    before = r.get("segment_store_before")
    if before and "history_bytes" in r:
        rows.append(
            (
                "history on disk (compacted, vacuumed)",
                f"{r['history_bytes'] / 1e6:.0f} MB (segment store: "
                f"{before['history_bytes'] / 1e6:.0f} MB)",
            )
        )
    return rows


def _dashboard(r: dict) -> list[tuple[str, str]]:
    return [
        (
            f"fleet page in Chromium, {r['runs']} runs × {r['steps']:,} steps (median)",
            f"{r['fleet_median_s']:.2f} s (target ≤ 2 s)",
        ),
        ("run page in Chromium (median)", f"{r['run_page_median_s']:.2f} s (target ≤ 3 s)"),
    ]


def _fleet(r: dict) -> list[tuple[str, str]]:
    rows = []
    for c in r["cases"]:
        lat = c["latency_s"]
        backlog = c.get("backlog_max", c["lag_max"])
        rows.append(
            (
                f"end to end, {c['runs']} runs, {c['workers']} detector worker(s)",
                f"{c['sustained_values_per_s']:,} of {c['offered_values_per_s']:,} values/s "
                f"offered, {c['lost_values']} lost; warning latency p50 {lat['p50']} s, "
                f"p95 {lat['p95']} s, p99 {lat['p99']} s; max backlog "
                f"{backlog['detectors']:,.0f} / {backlog['sink']:,.0f} messages "
                f"(detectors / sink)",
            )
        )
    rows.append(
        (
            "knee (smallest fleet below 90 % of its offered rate)",
            str(r["knee_runs"] or "not reached"),
        )
    )
    return rows


def _soak(r: dict) -> list[tuple[str, str]]:
    lag = r["lag"]
    renders = r["dashboard"]["renders"]
    rows = [
        (
            f"{r['duration_s']:.0f} s at {r['offered_values_per_s']:,} values/s offered "
            f"({r['offered_values_per_s'] / r['saturation_values_per_s']:.0%} of saturation), "
            f"{r['runs_started']:,} runs ({r['concurrent_runs']} at a time)",
            f"{r['lost_values']:,} values lost of {r['offered_values']:,}; stored "
            f"{r['stored_values_per_s_steady']:,} values/s in the steady state",
        )
    ]
    for service, m in r["memory"].items():
        if m["growth"] is None:
            continue
        verdict = {True: "flat", False: "not flat", None: "for information"}[m["flat"]]
        rows.append(
            (
                f"RSS {service}, after {r['warmup_s']:.0f} s warm-up → end of load",
                f"{m['rss_start_mb']:.0f} → {m['rss_end_mb']:.0f} MB ({m['growth']:+.0%}, "
                f"{m['slope_mb_per_min']:+.1f} MB/min, max {m['rss_max_mb']:.0f} MB"
                f"{_recycled(r) if service == 'broker' else ''}): {verdict}",
            )
        )
    rows.append(
        (
            "consumer lag max / at end of load / drained (detector; sink)",
            f"{lag['detector']['lag_max']:.0f} / {lag['detector']['lag_end_of_load']:.0f} / "
            f"{lag['detector']['lag_drained']:.0f}; {lag['sink']['lag_max']:.0f} / "
            f"{lag['sink']['lag_end_of_load']:.0f} / {lag['sink']['lag_drained']:.0f} "
            "messages",
        )
    )
    rows.append(
        (
            "backlog: written − consumed (detector); − stored (sink): max / end / drained",
            f"{_backlog(lag['detector'])}; {_backlog(lag['sink'])} messages",
        )
    )
    rows.append(
        (
            "dashboard renders over the agent API (fleet; run page), median",
            f"{renders['fleet']['median_s']} s; {renders['run']['median_s']} s "
            f"({len(r['dashboard']['failures'])} failures)",
        )
    )
    return rows


def _backlog(lag: dict) -> str:
    return (
        f"{lag['backlog_max']:,.0f} / {lag['backlog_end_of_load']:,.0f} / "
        f"{lag['backlog_drained']:,.0f}"
    )


def _recycled(r: dict) -> str:
    if not r.get("broker_max_mb"):
        return ""
    return f"; recycled {r['broker_recycles']}× at {r['broker_max_mb']:.0f} MB"


def _unreachable(r: dict) -> list[tuple[str, str]]:
    m = r["modes"]
    return [
        (
            f"training loop, broker unreachable for the whole run vs live ({r['steps']} "
            f"steps, median of {r['repeats']})",
            f"{r['slowdown_unreachable_vs_live']:+.1%} (target ≤ +5 %); "
            f"{m['live']['step_s_median'] * 1000:.0f} vs "
            f"{m['unreachable']['step_s_median'] * 1000:.0f} ms/step",
        ),
        (
            "its records after a broker came up (`foreshock spool flush`)",
            f"{r['spooled']} spooled, {r['delivered_later']} delivered, {r['missing']} "
            f"missing, {r['duplicates']} duplicates; {r['runs_complete']} of "
            f"{len(r['per_run'])} runs complete",
        ),
    ]


def _reliability(r: dict) -> list[tuple[str, str]]:
    rows = []
    for f in r["faults"]:
        lost = f["records_produced"] - f["records_stored"] + len(f["missed_warning_events"])
        recovery = "–" if f["recovery_s"] is None else f"recovered in {f['recovery_s']} s"
        rows.append(
            (
                f"{f['fault']} killed (SIGKILL) and restarted mid-fleet"
                if f["fault"] != "none"
                else "control: no fault",
                f"{recovery}; records {f['records_stored']}/{f['records_produced']}, "
                f"warning events {f['warning_events_stored']}/"
                f"{f['warning_events_expected']}, duplicates "
                f"{f['duplicate_records'] + f['duplicate_warning_events']}, lost {lost}",
            )
        )
    return rows


# The sixth clean batch started training after this commit froze its rules (lab/runs/README.md),
# and each profile's part of it is judged on its own: result name suffix -> --runs arguments.
CLEAN_CHECK_6 = "2026-12-02T00:27:19"
CLEAN_CHECK_6_PROFILES = {
    "gpt-moe": [],
    "mixtral": ["--runs", "lab/runs/mixtral"],
    "capacity": ["--runs", "lab/runs/gpt-moe+capacity-1"],
}

BENCHMARKS: dict[str, tuple[list[str], Rows, str]] = {
    "spectra": (["--quick"], _spectra, "Compressed-core speedup (Δ2 spectra)"),
    "overhead": ([], _overhead, "Monitor overhead per training step"),
    "overhead_gpt2-124m": (
        ["--model", "gpt2-124m", "--quick"],
        _overhead,
        "Monitor overhead per training step, GPT-2 small (124M)",
    ),
    "overhead_mixtral-tiny": (
        ["--model", "mixtral-tiny"],
        _overhead,
        "Monitor overhead per training step, tiny Mixtral",
    ),
    "overhead_sharded": (
        ["--sharded"],
        _overhead_sharded,
        "Monitor overhead per rank under FSDP2 (gloo, CPU) against the single process",
    ),
    "zero_shot": (
        [],
        _zero_shot,
        "Zero-shot profile, each architecture held out of its calibration",
    ),
    "flapping": (
        [],
        _flapping,
        "Warnings that don't flap: the release chosen on calibration runs, judged held out",
    ),
    "profile_size": (
        [],
        _profile_size,
        "A user's profile from N healthy runs, against the zero-shot profile",
    ),
    "sharded_equality": (
        [],
        _sharded_equality,
        "Sharded training: the one global record against the unsharded run",
    ),
    "max_logit": ([], _max_logit, "max_logit on transformers models: cost"),
    "transport": ([], _transport, "Transport: producers → embedded broker → one consumer"),
    "transport_unpaced": (
        ["--rate", "0", "--messages", "100"],
        _transport,
        "Transport, producers unpaced",
    ),
    "detectors": (
        ["--copies", "8"],
        _detectors,
        "Detector workers: metric values per second, Kafka in → warnings out",
    ),
    "detection_table": ([], _detection, "Lead time and false warnings (held-out lab runs)"),
    "detection_table_mixtral": (
        ["--runs", "lab/runs/mixtral"],
        _detection,
        "Lead time and false warnings, transformers Mixtral (held-out lab runs)",
    ),
    "detection_table_capacity": (
        ["--runs", "lab/runs/gpt-moe+capacity-1"],
        _detection,
        "Lead time and false warnings, GPT-MoE with expert capacity 1.0 (held-out lab runs)",
    ),
    **{
        f"clean_check_6_{profile}": (
            [*runs, "--trained-after", CLEAN_CHECK_6],
            _detection,
            f"Sixth clean batch, {profile}: only the runs trained after the rules were frozen",
        )
        for profile, runs in CLEAN_CHECK_6_PROFILES.items()
    },
    "router_collapse": ([], _router_collapse, "What a router collapse costs"),
    "band_frontier": ([], _band_frontier, "Band rule knobs: earlier warnings against false ones"),
    "false_alarms": (
        [],
        _false_alarms,
        "Calibration: false warnings on unseen healthy runs (cross-validated)",
    ),
    "lab_table": ([], _lab_table, "The lab's shipped runs: which family leaves the healthy band"),
    "lab_reproducibility": (
        [],
        _lab_reproducibility,
        "Lab runs: do the shipped recordings retrain bit for bit here?",
    ),
    "storage": ([], _storage, "History: ingest and queries"),
    "dashboard": ([], _dashboard, "Dashboard render time"),
    "fleet": ([], _fleet, "Whole pipeline: throughput, latency, backlog"),
    "fleet_saturation": (
        ["--runs", "1000", "--workers", "1,2", "--rate", "3"],
        _fleet,
        "Whole pipeline past its knee (3 records/s per run)",
    ),
    "soak": ([], _soak, "Soak: memory and lag under a steady fleet at half saturation"),
    "unreachable": ([], _unreachable, "Training with the broker unreachable, records later"),
    "reliability": ([], _reliability, "Faults under a live fleet: recovery, nothing lost"),
}


MODULE = {  # result name -> benchmark module, where they differ
    **{f"clean_check_6_{p}": "detection_table" for p in CLEAN_CHECK_6_PROFILES},
    "transport_unpaced": "transport",
    "fleet_saturation": "fleet",
    "detection_table_mixtral": "detection_table",
    "detection_table_capacity": "detection_table",
    "overhead_gpt2-124m": "overhead",
    "overhead_mixtral-tiny": "overhead",
    "overhead_sharded": "overhead",
}


def run(name: str) -> None:
    args, _, _ = BENCHMARKS[name]
    module = MODULE.get(name, name)
    command = [sys.executable, "-m", f"benchmarks.{module}", *args]
    print(f"running: python -m benchmarks.{module} {' '.join(args)}", flush=True)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    save(name, json.loads(out.strip().splitlines()[-1]), args)


def save(name: str, result: dict[str, Any], args: list[str], when: float | None = None) -> None:
    RESULTS.mkdir(exist_ok=True)
    module = MODULE.get(name, name)
    record = {
        "command": " ".join(["python -m", f"benchmarks.{module}", *args]).strip(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "result": result,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))


def render() -> str:
    """``benchmarks/README.md``: every benchmark's figures."""
    lines = [
        "# Benchmarks: the numbers",
        "",
        "Generated by `python -m benchmarks.readme` from `benchmarks/results/*.json` — do",
        "not edit by hand. Rerun a benchmark and regenerate with",
        "`python -m benchmarks.readme --run NAME`.",
        "",
    ]
    return "\n".join(lines) + "\n" + results_section("##")


def results_section(level: str = "###") -> str:
    """One section per benchmark, headed at ``level``: the body of ``benchmarks/README.md``
    and of the docs' benchmarks page (between :data:`RESULTS_MARKERS`)."""
    lines: list[str] = []
    for name, (_, _, title) in BENCHMARKS.items():
        lines += [f"{level} {title}", "", figure_table(name), ""]
    return "\n".join(lines)


def figure_table(name: str) -> str:
    """One benchmark's figures as a table, with its command and when it was measured."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return f"Not measured yet: `python -m benchmarks.readme --run {name}`."
    record = json.loads(path.read_text())
    lines = ["| figure | value | command |", "|---|---|---|"]
    lines += [
        f"| {figure} | {value} | `{record['command']}` |"
        for figure, value in BENCHMARKS[name][1](record["result"])
    ]
    lines += ["", f"Measured {record['measured_at']} on {record['machine']}."]
    return "\n".join(lines)


# Any docs page may show one benchmark's figures between these two lines (NAME: its result).
FIGURES = re.compile(r"<!-- figures: (?P<name>[\w-]+) -->\n.*?<!-- /figures -->", re.S)


def with_figure_tables(text: str) -> str:
    """``text`` with every ``<!-- figures: NAME -->`` … ``<!-- /figures -->`` regenerated."""
    return FIGURES.sub(
        lambda m: f"<!-- figures: {m['name']} -->\n{figure_table(m['name'])}\n<!-- /figures -->",
        text,
    )


DETECTION_RESULTS = ("detection_table", "detection_table_capacity", "detection_table_mixtral")
DETECTION_MARKERS = ("<!-- detection-table -->", "<!-- /detection-table -->")
RESULTS_MARKERS = ("<!-- benchmark-results -->", "<!-- /benchmark-results -->")
DOCS = HERE.parent / "docs"
DETECTION_PAGE = DOCS / "detectors.md"  # the detection table, between DETECTION_MARKERS
LAB_MARKERS = ("<!-- lab-table -->", "<!-- /lab-table -->")
LAB_PAGE = DOCS / "lab.md"  # lab_summary(), between LAB_MARKERS
LAB_FAMILIES = {  # lab_table's family -> its column
    "d2_entropy": "Δ2 entropy",
    "dw_entropy": "ΔW entropy",
    "router_entropy": "router entropy",
    "load_entropy": "load entropy",
    "epsilon": "ε",
    "loss": "loss",
    "grad_norm": "grad norm",
}
ARROWS = {"below": "↓", "above": "↑", "null": "∅"}
RESULTS_PAGE = DOCS / "benchmarks.md"  # results_section(), between RESULTS_MARKERS


def detection_summary() -> str:
    """The docs' detection table (``docs/detectors.md``): one row per (profile, held-out
    scenario), from the stored detection_table results."""
    header = (
        "| profile | scenario (held out) | warned | cause right / wrong / ambiguous "
        "| lead: mechanism | lead: symptom | own family before symptom "
        "| envelope lead (best mechanism family) |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for name in DETECTION_RESULTS:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())["result"]
        for scenario, s in r["scenarios"].items():
            lines.append(_detection_row(r.get("profile", "gpt-moe"), scenario, s))
    return "\n".join(lines)


def _detection_row(profile: str, scenario: str, s: dict) -> str:
    a, dash = s["attribution"], "–"
    quiet = catalogue.scenario(scenario).quiet
    warned = f"{s['detected']}/{s['runs']}" + (" false" if quiet else "")
    cause = dash if quiet else f"{a['correct']} / {a['wrong']} / {a['ambiguous']}"
    own = dash if quiet else f"{s['own_family_before_symptom']}/{s['diverged'] or s['runs']}"
    envelope = [
        e
        for f, e in (s.get("envelope") or {}).items()
        if f != "symptom" and e.get("family_best_median") is not None
    ]
    best = max(envelope, key=lambda e: e["family_best_median"], default=None)
    env = dash if best is None or quiet else f"{best['family_best_median']}"
    lead = s["mechanism_lead_median"] if s["mechanism_lead_median"] is not None else dash
    sym = s["symptom_lead_median"] if s["symptom_lead_median"] is not None else dash
    return (
        f"| {profile} | {scenario} ({s['runs']}, {s['diverged']} diverged) | {warned} "
        f"| {cause} | {lead} | {sym} | {own} | {env} |"
    )


def lab_summary() -> str:
    """The docs' lab table (``docs/lab.md``): per scenario, the divergence step and each
    family's first exit from the healthy band (median step, direction, runs with an exit,
    median raw lead), from the stored lab_table result."""
    r = json.loads((RESULTS / "lab_table.json").read_text())["result"]
    head = ["scenario", "diverged", "divergence step", *LAB_FAMILIES.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in r["scenarios"].items():
        div = s["divergence"]
        when = f"{statistics.median(div):g} [{min(div)}–{max(div)}]" if div else "–"
        cells = [f"{name} ({s['runs']})", f"{s['diverged']}/{s['runs']}", when]
        cells += [_lab_cell(s["families"][f], s["runs"]) for f in LAB_FAMILIES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _lab_cell(fig: dict, runs: int) -> str:
    if not fig["exits"]:
        return "–"
    arrow = ARROWS[max(set(fig["directions"]), key=fig["directions"].count)]
    lead = f"; lead {statistics.median(fig['leads']):g}" if fig["leads"] else ""
    return f"{statistics.median(fig['exits']):g} {arrow} ({len(fig['exits'])}/{runs}{lead})"


def with_section(text: str, markers: tuple[str, str], body: str) -> str:
    """``text`` with what lies between ``markers`` replaced by ``body``."""
    start, end = markers
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def between(text: str, markers: tuple[str, str]) -> str:
    """What lies between ``markers`` in ``text``, stripped."""
    start, end = markers
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def with_detection_summary(text: str) -> str:
    """``text`` with the text between the detection-table markers regenerated."""
    return with_section(text, DETECTION_MARKERS, detection_summary())


def write_docs() -> None:
    """Regenerate the generated parts of ``benchmarks/README.md`` and the docs pages."""
    (HERE / "README.md").write_text(render())
    DETECTION_PAGE.write_text(with_detection_summary(DETECTION_PAGE.read_text()))
    LAB_PAGE.write_text(with_section(LAB_PAGE.read_text(), LAB_MARKERS, lab_summary()))
    for page in DOCS.glob("*.md"):
        page.write_text(with_figure_tables(page.read_text()))
    RESULTS_PAGE.write_text(
        with_section(RESULTS_PAGE.read_text(), RESULTS_MARKERS, results_section())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", nargs="*", default=[], help="benchmarks to (re)run, or all")
    parser.add_argument(
        "--from-output",
        nargs=2,
        metavar=("NAME", "FILE"),
        help="store the JSON last line of a saved output instead",
    )
    args = parser.parse_args()
    names = list(BENCHMARKS) if args.run == ["all"] else args.run
    for name in names:
        run(name)
    if args.from_output:
        name, file = args.from_output
        text = Path(file).read_text().strip().splitlines()[-1]
        save(name, json.loads(text), BENCHMARKS[name][0], when=Path(file).stat().st_mtime)
    write_docs()
    print(f"wrote {HERE / 'README.md'}, {DETECTION_PAGE}, {LAB_PAGE} and {RESULTS_PAGE}")


if __name__ == "__main__":
    main()
