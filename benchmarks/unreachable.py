"""A trainer whose monitor cannot reach the broker for the whole run trains at normal speed,
and its records arrive later — every one, exactly once.

The real lab trainer (``foreshock.lab.run.run_lab``: the default 2-layer GPT-MoE, a healthy
run of ``--steps`` steps, the Monitor every 25 steps with its max-logit observers, as
``foreshock lab run --kafka`` sets it up) in three ways, interleaved in a rotating order and
repeated ``--repeats`` times (the median wins over this shared machine's noise):

* live — Monitor → ``KafkaSink`` → a live embedded broker (Tansu);
* unreachable — Monitor → ``KafkaSink`` → a closed port on 127.0.0.1: no broker at all for the
  whole run; every record goes to the sink's local spool;
* memory — Monitor → an in-memory sink (no transport at all), for reference.

Figures: the training loop's wall time (``run_lab``'s, from the first step to the last) and
its time per step; closing the sink (outside the loop); the slowdown of *unreachable* vs
*live* (target ≤ 5 %) and vs *memory*. Then a broker is started on the unreachable port,
``foreshock spool flush`` re-sends the spools, and a consumer reads the topic back: for every
unreachable run, seq 0..last_seq must be there exactly once — records spooled, delivered
later, duplicates, missing (expect 0).

    python -m benchmarks.unreachable            # 300 steps, 3 repeats (~6 min)
    python -m benchmarks.unreachable --quick    # 100 steps, 1 repeat (~1 min)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from foreshock.app.harness import scoped, service_env
from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, median, single_thread

MODES = ("live", "unreachable", "memory")
TARGET = 0.05


def train_once(mode: str, run_id: str, steps: int, settings: KafkaSettings) -> dict[str, Any]:
    """One lab run with the monitor writing through ``mode``'s sink."""
    from foreshock.delivery.kafka_sink import KafkaSink
    from foreshock.lab.run import RunConfig, run_lab
    from foreshock.producers.sinks import ListSink

    sink: Any = ListSink() if mode == "memory" else KafkaSink(settings)
    closing: dict[str, float] = {}
    close = sink.close

    def timed_close(*args: Any, **kwargs: Any) -> None:  # run_lab closes it through the monitor
        tick = time.perf_counter()
        close(*args, **kwargs)
        closing["s"] = time.perf_counter() - tick

    sink.close = timed_close
    tick = time.perf_counter()
    result = run_lab(RunConfig(steps=steps, name=run_id), None, progress=False, sink=sink)
    total = time.perf_counter() - tick
    out = {
        "mode": mode,
        "run_id": run_id,
        "steps": len(result.losses),
        "train_s": result.wall_seconds,
        "step_s": result.wall_seconds / len(result.losses),
        "total_s": total,
        "close_s": closing.get("s", 0.0),
    }
    if isinstance(sink, KafkaSink):
        out |= {
            "delivered": sink.delivered,
            "spooled": sink.spooled,
            "rejected": sink.rejected,
            "pending_bytes": sink.pending(),
        }
    else:
        out |= {"records": len(sink.records)}
    return out


def flush(settings: KafkaSettings, timeout: float) -> tuple[float, str]:
    """``foreshock spool flush`` for ``settings``' spool folder; (seconds, its output)."""
    env = {**os.environ, **service_env(settings)}
    tick = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "foreshock.app.cli", "spool", "flush", "--timeout", str(timeout)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    seconds = time.perf_counter() - tick
    if done.returncode != 0:
        raise RuntimeError(f"spool flush failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, done.stdout.strip()


def read_back(settings: KafkaSettings, expected: int, idle: float = 5.0) -> list[dict]:
    """Every message of the metrics topic, from the beginning of each partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"unreachable-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [
            TopicPartition(settings.metrics_topic, p, OFFSET_BEGINNING)
            for p in range(settings.partitions)
        ]
    )
    messages: list[dict] = []
    last = time.monotonic()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                if len(messages) >= expected and time.monotonic() - last > 1.0:
                    break  # all there; a little longer for duplicates
                if time.monotonic() - last > idle:
                    break
                continue
            messages.append(json.loads(message.value()))
            last = time.monotonic()
    finally:
        consumer.close()
    return messages


def audit(runs: list[dict[str, Any]], messages: list[dict]) -> dict[str, Any]:
    """Per unreachable run: seq 0..last_seq each exactly once?"""
    out = {
        "runs": len(runs),
        "spooled": 0,
        "delivered_later": 0,
        "duplicates": 0,
        "missing": 0,
        "runs_complete": 0,
        "per_run": [],
    }
    for run in runs:
        mine = [m for m in messages if m["run_id"] == run["run_id"]]
        seqs = [m["seq"] for m in mine]
        ends = [m["last_seq"] for m in mine if m.get("kind") == "end"]
        last_seq = ends[0] if ends else run["spooled"] - 1
        missing = len(set(range(last_seq + 1)) - set(seqs))
        duplicates = len(seqs) - len(set(seqs))
        metrics = sum(1 for m in mine if m.get("kind") == "metrics")
        complete = bool(ends) and missing == 0 and duplicates == 0
        out["per_run"].append(
            {
                "run_id": run["run_id"],
                "spooled": run["spooled"],
                "delivered": len(set(seqs)),
                "last_seq": last_seq,
                "metrics_records": metrics,
                "missing": missing,
                "duplicates": duplicates,
                "complete": complete,
            }
        )
        out["spooled"] += run["spooled"]
        out["delivered_later"] += len(set(seqs))
        out["duplicates"] += duplicates
        out["missing"] += missing
        out["runs_complete"] += complete
    return out


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the training loop's slowdown with the
    broker unreachable against live (target ≤ +5 %) with its ms per step, and what became of
    its records once a broker came up (spooled, delivered, missing, duplicates, runs
    complete)."""
    m = result["modes"]
    return [
        (
            f"training loop, broker unreachable for the whole run vs live ({result['steps']} "
            f"steps, median of {result['repeats']})",
            f"{result['slowdown_unreachable_vs_live']:+.1%} (target ≤ +5 %); "
            f"{m['live']['step_s_median'] * 1000:.0f} vs "
            f"{m['unreachable']['step_s_median'] * 1000:.0f} ms/step",
        ),
        (
            "its records after a broker came up (`foreshock spool flush`)",
            f"{result['spooled']} spooled, {result['delivered_later']} delivered, "
            f"{result['missing']} missing, {result['duplicates']} duplicates; "
            f"{result['runs_complete']} of {len(result['per_run'])} runs complete",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 steps, 1 repeat")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode")
    parser.add_argument("--flush-timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 100, 1
    single_thread()
    logging.getLogger("foreshock.rdkafka").setLevel(logging.CRITICAL)  # refused connections
    logging.getLogger("foreshock.delivery.kafka_sink").setLevel(logging.ERROR)  # "kept in …"
    root = Path(tempfile.mkdtemp(prefix="foreshock-unreachable-"))
    token = uuid.uuid4().hex[:6]
    closed_port = free_port()  # nothing listens here until the flush
    live_broker = EmbeddedBroker(log_path=root / "live-broker.log")
    later_broker = EmbeddedBroker(port=closed_port, log_path=root / "later-broker.log")
    results: list[dict[str, Any]] = []
    try:
        live_broker.start()
        live = scoped(
            KafkaSettings(bootstrap_servers=live_broker.bootstrap, partitions=3),
            f"unreach-{token}",
            spool_dir=str(root / "spool-live"),
        )
        away = replace(
            live, bootstrap_servers=f"127.0.0.1:{closed_port}", spool_dir=str(root / "spool-away")
        )
        train_once("memory", f"warmup-{token}", 30, live)  # imports, allocator, caches: untimed
        for rep in range(args.repeats):
            order = MODES[rep % 3 :] + MODES[: rep % 3]  # rotate: drift hits each mode alike
            for mode in order:
                settings = away if mode == "unreachable" else live
                result = train_once(mode, f"{mode}-{rep}-{token}", args.steps, settings)
                results.append({**result, "repeat": rep})
                print(
                    f"repeat {rep} {mode:11s}: {result['train_s']:6.2f} s training, "
                    f"{result['step_s'] * 1000:6.1f} ms/step, close {result['close_s']:.2f} s",
                    flush=True,
                )
        later_broker.start()
        flush_s, flush_out = flush(away, args.flush_timeout)
        away_runs = [r for r in results if r["mode"] == "unreachable"]
        expected = sum(r["spooled"] for r in away_runs)
        later = replace(away, bootstrap_servers=later_broker.bootstrap)
        delivered = audit(away_runs, read_back(later, expected))
    finally:
        live_broker.stop()
        later_broker.stop()
        shutil.rmtree(root, ignore_errors=True)

    per_mode = {}
    for mode in MODES:
        mine = [r for r in results if r["mode"] == mode]
        per_mode[mode] = {
            "train_s_median": round(median([r["train_s"] for r in mine]), 3),
            "step_s_median": round(median([r["step_s"] for r in mine]), 5),
            "close_s_median": round(median([r["close_s"] for r in mine]), 3),
            "train_s": [round(r["train_s"], 3) for r in mine],
        }
    live_s = per_mode["live"]["train_s_median"]
    away_s = per_mode["unreachable"]["train_s_median"]
    memory_s = per_mode["memory"]["train_s_median"]
    paired = [
        b["train_s"] / a["train_s"] - 1
        for a, b in zip(
            [r for r in results if r["mode"] == "live"],
            [r for r in results if r["mode"] == "unreachable"],
            strict=True,
        )
    ]
    slowdown = away_s / live_s - 1
    rows = [
        [
            mode,
            len(per_mode[mode]["train_s"]),
            f"{per_mode[mode]['train_s_median']:.2f}",
            f"{per_mode[mode]['step_s_median'] * 1000:.1f}",
            f"{per_mode[mode]['close_s_median']:.2f}",
            " ".join(f"{x:.2f}" for x in per_mode[mode]["train_s"]),
            "–" if mode == "live" else f"{per_mode[mode]['train_s_median'] / live_s - 1:+.1%}",
        ]
        for mode in MODES
    ]
    print(
        format_table(
            [
                "sink",
                "runs",
                "training s (median)",
                "ms/step",
                "close s",
                "training s (each)",
                "vs live",
            ],
            rows,
        )
    )
    print()
    rows = [
        ["records spooled while unreachable", delivered["spooled"]],
        ["delivered later (unique seq)", delivered["delivered_later"]],
        ["duplicates", delivered["duplicates"]],
        ["missing", delivered["missing"]],
        [
            "runs complete (seq 0..last_seq once each)",
            f"{delivered['runs_complete']} of {delivered['runs']}",
        ],
        ["spool flush", f"{flush_s:.1f} s: {flush_out}"],
    ]
    print(format_table(["after a broker came up on the unreachable port", "value"], rows))
    emit_json(
        {
            "steps": args.steps,
            "repeats": args.repeats,
            "every": 25,
            "modes": per_mode,
            "slowdown_unreachable_vs_live": round(slowdown, 4),
            "slowdown_paired_median": round(median(paired), 4),
            "slowdown_unreachable_vs_memory": round(away_s / memory_s - 1, 4),
            "slowdown_live_vs_memory": round(live_s / memory_s - 1, 4),
            "target": TARGET,
            "within_target": slowdown <= TARGET,
            "live_delivered": sum(r["delivered"] for r in results if r["mode"] == "live"),
            "live_spooled": sum(r["spooled"] for r in results if r["mode"] == "live"),
            "unreachable_delivered_during_run": sum(
                r["delivered"] for r in results if r["mode"] == "unreachable"
            ),
            "spooled": delivered["spooled"],
            "delivered_later": delivered["delivered_later"],
            "duplicates": delivered["duplicates"],
            "missing": delivered["missing"],
            "runs_complete": delivered["runs_complete"],
            "flush_s": round(flush_s, 2),
            "per_run": delivered["per_run"],
        }
    )


if __name__ == "__main__":
    main()
