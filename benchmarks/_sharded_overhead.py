"""``python -m benchmarks.overhead --sharded``: the Monitor's cost per rank under FSDP2 (gloo, CPU).

Issue 28's measurement, made repeatable: a transformers ``LlamaForCausalLM`` built from its
config (4 layers, hidden 512, 8 heads, MLP 1376, vocab 256: 12.9 M parameters, random weights;
the issue's "4-layer Llama, d = 512"), global batch 4 × 64 tokens, SGD, a Monitor at δ = 1
(default config otherwise), one thread per process (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``). It runs ``benchmarks._sharded_rank`` once as a single process
(the model whole) and once per world size under ``torch.distributed.run`` (2 and 4 ranks,
``fully_shard`` per decoder layer and the root; ``--parallel tp`` for DTensor tensor
parallel), each launch with a timeout, and reads each rank's timings (see that module for
exactly what is timed and how memory is read).

Per rank: the median time in ``Monitor.step()`` over the timed monitoring steps, and its parts —
*spectra* (``attention_chunks``: its own layers' snapshot copies and eigen-solves), *gathers*
(``Peers.materialize``: every layer's W_q, W_k shards gathered to its owner, right after the
plan exchange has lined the ranks up: the transfer), *exchange* (the gather of the partial
records to rank 0; on rank 0 it includes waiting for the slowest owner), *agree*
(``Peers.schedule``, the plans' all-gather; it also absorbs the ranks' different arrival times
from the training step) and *other* (the rest: spec reads, norms, the host copy, combining and
writing the record). The target (issue 28
part 6): per rank ≤ single-process monitor time / ranks + that rank's gathers. Beside each
world size runs a control: that many single processes at once, each the whole model, so that
the single process shares the cores as the ranks do; the *shared target* puts its time in
place of the lone single process's.

This machine may have fewer cores than ranks: 4 ranks on 2 cores share them (each rank's
timings then include waiting for a core), and the table says so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._sharded_rank import GLOBAL_BATCH, LLAMA, SEQ, WARM_UP
from ._table import format_table

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 300  # one launch: 4 ranks importing transformers on 2 cores take ~30 s
STEPS, QUICK_STEPS = 8, 4  # timed monitoring steps per launch
ROUNDS, QUICK_ROUNDS = 3, 1  # launches of every configuration, in turn (load drift hits all)
PARTS = ("spectra", "gather", "exchange", "agree")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commands(mode: str, world: int, out: Path, steps: int) -> list[tuple[list[str], Path]]:
    """(command, its output folder) per process: one ``torch.distributed.run`` of ``world``
    ranks for a sharded mode; for ``single``, ``world`` independent processes at once (with
    ``world`` > 1: the control, a single process sharing the cores as the ranks do)."""
    worker = ["-m", "benchmarks._sharded_rank", mode]
    if mode == "single":
        return [
            ([sys.executable, *worker, str(out / f"{i}"), str(steps)], out / f"{i}")
            for i in range(world)
        ]
    run = [
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={world}",
        f"--master-port={free_port()}",
    ]
    return [([sys.executable, *run, *worker, str(out), str(steps)], out)]


def launch(mode: str, world: int, steps: int) -> list[dict[str, Any]]:
    """Run every process of one configuration; each rank's (or copy's) status. One retry (a
    port race), each try within ``LAUNCH_TIMEOUT_S``."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="foreshock-sharded-") as tmp:
            runs = commands(mode, world, Path(tmp), steps)
            procs = []
            for command, out in runs:  # stderr to a file: a full pipe would block a rank
                out.mkdir(exist_ok=True)
                with open(out / "stderr.txt", "w") as err:
                    procs.append(
                        subprocess.Popen(
                            command,
                            cwd=ROOT,
                            env=environ,
                            stdout=subprocess.DEVNULL,
                            stderr=err,
                            start_new_session=True,  # its own group: a timeout ends every rank
                        )
                    )
            deadline = time.monotonic() + LAUNCH_TIMEOUT_S
            errors = [_finish(p, out, deadline) for p, (_, out) in zip(procs, runs, strict=True)]
            paths = [out / f"rank-{r}.json" for _, out in runs for r in range(world // len(runs))]
            if not any(errors) and all(p.exists() for p in paths):
                statuses = [json.loads(p.read_text()) for p in paths]
                return [s | {"rank": i} for i, s in enumerate(statuses)]  # a copy's index
        print(f"  {mode} × {world} failed (attempt {attempt + 1}):\n{''.join(errors)[-3000:]}")
    raise RuntimeError(f"{mode} × {world} failed twice")


def _finish(proc: subprocess.Popen, out: Path, deadline: float) -> str:
    """Wait for ``proc`` until ``deadline`` (killed after it); its stderr if it failed, else ''."""
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this launch started, ranks included
        proc.wait()
        return f"timed out after {LAUNCH_TIMEOUT_S} s\n{(out / 'stderr.txt').read_text()}"
    return (
        ""
        if proc.returncode == 0
        else f"exit {proc.returncode}\n{(out / 'stderr.txt').read_text()}"
    )


def merge(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each rank's statuses over the rounds as one: per-step lists joined, the memory figures
    the largest seen, the rest from the last round."""
    merged = []
    for statuses in zip(*rounds, strict=True):
        one = dict(statuses[-1])
        for key, value in one.items():
            if isinstance(value, list) and key.endswith(("_s", "_per_step")):
                one[key] = [x for s in statuses for x in s[key]]
        for key in ("heap_peak_delta_bytes", "rss_bytes"):
            one[key] = max(s[key] for s in statuses)
        merged.append(one)
    return merged


def rank_figures(status: dict[str, Any]) -> dict[str, Any]:
    """One rank's medians over the timed steps [ms, bytes]."""
    monitor = status["monitor_s"]
    other = [
        m - sum(status[f"{p}_s"][i] for p in PARTS) for i, m in enumerate(monitor)
    ]  # per step, then the median: the parts' medians need not add up
    return {
        "rank": status["rank"],
        "monitor_ms": 1e3 * statistics.median(monitor),
        "monitor_ms_min": 1e3 * min(monitor),
        **{f"{p}_ms": 1e3 * statistics.median(status[f"{p}_s"]) for p in PARTS},
        "other_ms": 1e3 * statistics.median(other),
        "train_ms": 1e3 * statistics.median(status["train_s"]),
        "bytes_per_step": statistics.median(status["bytes_per_step"]),
        "snapshot_bytes": status["snapshot_bytes"],
        "heap_peak_delta_bytes": status["heap_peak_delta_bytes"],
        "rss_bytes": status["rss_bytes"],
        "owned_layers": len(status["owned_layers"]),
        "errors": status["errors"],
        "params": status["params"],
        "loadavg_end": status["loadavg_end"],
    }


def run_figures(
    mode: str, world: int, ranks: list[dict], single: dict, shared: dict[int, float]
) -> dict[str, Any]:
    """A configuration's ranks, each against its target: single / world + its own gathers;
    and against the same with the single process sharing the cores as the ranks do
    (``shared``: the control's median monitor time [ms] at this many processes)."""
    for r in ranks:
        if mode == "single":  # the control: nothing to meet
            continue
        r["target_ms"] = single["monitor_ms"] / world + r["gather_ms"]
        r["meets_target"] = r["monitor_ms"] <= r["target_ms"]
        r["target_shared_ms"] = shared[world] / world + r["gather_ms"]
        r["meets_target_shared"] = r["monitor_ms"] <= r["target_shared_ms"]
    if mode == "single":
        return {
            "mode": "single-control",
            "world": world,
            "oversubscribed": world > (os.cpu_count() or 1),
            "ranks": ranks,
        }
    return {
        "mode": mode,
        "world": world,
        "oversubscribed": world > (os.cpu_count() or 1),
        "ranks": ranks,
        "monitor_ms_max": max(r["monitor_ms"] for r in ranks),
        "meets_target": all(r["meets_target"] for r in ranks),
        "meets_target_shared": all(r["meets_target_shared"] for r in ranks),
    }


def table(single: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    headers = [
        "config",
        "rank",
        "layers",
        "monitor ms",
        "spectra",
        "gathers",
        "exchange",
        "agree",
        "other",
        "target ms",
        "shared target",
        "MB in/step",
        "snapshots MB",
        "peak +MB",
        "train ms",
    ]
    rows: list[list[object]] = [_row("single", single, "-", "-")]
    for run in runs:
        cores = " (oversubscribed)" if run["oversubscribed"] else ""
        for r in run["ranks"]:
            if run["mode"] == "single-control":
                rows.append(_row(f"single, {run['world']} at once{cores}", r, "-", "-"))
                continue
            target = f"{r['target_ms']:.0f} {'met' if r['meets_target'] else 'NOT met'}"
            ok = "met" if r["meets_target_shared"] else "NOT met"
            shared = f"{r['target_shared_ms']:.0f} {ok}"
            rows.append(_row(f"{run['mode']} × {run['world']}{cores}", r, target, shared))
    return format_table(headers, rows)


def _row(config: str, r: dict[str, Any], target: str, shared: str) -> list[object]:
    return [
        config,
        r["rank"],
        r["owned_layers"],
        f"{r['monitor_ms']:.0f}",
        *(f"{r[f'{p}_ms']:.0f}" for p in PARTS),
        f"{r['other_ms']:.0f}",
        target,
        shared,
        f"{r['bytes_per_step'] / 1e6:.2f}",
        f"{r['snapshot_bytes'] / 1e6:.1f}",
        f"{r['heap_peak_delta_bytes'] / 1e6:.1f}",
        f"{r['train_ms']:.0f}",
    ]


def run_sharded(quick: bool, worlds: list[int], modes: list[str]) -> dict[str, Any]:
    """Every configuration, printed as a table; the result for the closing JSON line."""
    steps, rounds = (QUICK_STEPS, QUICK_ROUNDS) if quick else (STEPS, ROUNDS)
    start, load = time.perf_counter(), os.getloadavg()[0]
    print(
        f"Monitor overhead, sharded: Llama {LLAMA['num_hidden_layers']} layers, d = "
        f"{LLAMA['hidden_size']}, {LLAMA['num_attention_heads']} heads; global batch "
        f"{GLOBAL_BATCH} × {SEQ}; δ = 1; {rounds} round(s) of {steps} timed monitoring steps "
        f"after {WARM_UP} per configuration; 1 thread per rank on {os.cpu_count()} cores; "
        f"load {load:.1f}",
        flush=True,
    )
    configs = [("single", 1)]  # then per world: the control beside the sharded runs
    for world in worlds:
        configs += [("single", world)] * (world > 1) + [(mode, world) for mode in modes]
    statuses: dict[tuple[str, int], list[list[dict[str, Any]]]] = {c: [] for c in configs}
    for r in range(rounds):
        for mode, world in configs:
            statuses[mode, world].append(launch(mode, world, steps))
            ms = max(statistics.median(s["monitor_s"]) for s in statuses[mode, world][-1])
            print(f"  round {r + 1}: {mode} × {world}: monitor {1e3 * ms:.0f} ms", flush=True)
    single = rank_figures(merge(statuses["single", 1])[0])
    shared = {
        world: statistics.median(rank_figures(s)["monitor_ms"] for s in merge(statuses[c]))
        for c in configs[1:]
        if c[0] == "single"
        for world in [c[1]]
    }
    runs = [
        run_figures(
            mode, world, [rank_figures(s) for s in merge(statuses[mode, world])], single, shared
        )
        for mode, world in configs[1:]
    ]
    wall = time.perf_counter() - start
    print()
    print(table(single, runs))
    print()
    print("ms: medians over the timed steps. monitor = spectra + gathers + exchange + agree +")
    print("other (per step; the medians need not add up). spectra: this rank's layers' snapshot")
    print("copies and eigen-solves; gathers: every layer's shards to its owner (the transfer);")
    print("exchange: partial records to rank 0 (rank 0 waits there for the slowest owner);")
    print("agree: the plans' all-gather, which also absorbs arrival skew. target = single /")
    print("ranks +")
    print("this rank's gathers; shared target: the same with the single-process time measured")
    print("while as many copies run at once as there are ranks (the control rows 'single, W at")
    print("once'), so that it shares the cores as the ranks do. MB in/step:")
    print("Peers.bytes_received per step. snapshots: what the monitor keeps between steps.")
    print("peak +MB: most malloc'd bytes during one monitoring step")
    print("above its entry (glibc mallinfo2, sampled every 0.5 ms): its transient working set.")
    if any(r["oversubscribed"] for r in runs):
        print(f"oversubscribed: more ranks than this machine's {os.cpu_count()} cores; ranks")
        print("wait for a core, so their times are upper bounds of the uncontended cost.")
    print(f"wall {wall:.0f}s; load average at the end {os.getloadavg()[0]:.1f}")
    return {
        "benchmark": "overhead",
        "sharded": True,
        "quick": quick,
        "model": {"name": "llama-4x512", **LLAMA, "params": single["params"]},
        "global_batch": GLOBAL_BATCH,
        "tokens_per_sequence": SEQ,
        "every": 1,
        "timed_steps": steps * rounds,
        "rounds": rounds,
        "threads_per_rank": 1,
        "cores": os.cpu_count(),
        "single": single,
        "runs": runs,
        "loadavg_start": load,
        "loadavg_end": os.getloadavg()[0],
        "wall_s": wall,
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for ``overhead --sharded``: the single process's monitor
    time per monitoring step, its snapshots and transient memory; then per sharded run (the
    single-process controls left out) its slowest rank's monitor time against the target and
    the shared target, with the ranks that met each and the time's parts, and the bytes a rank
    receives per monitoring step with its memory."""
    m, s = result["model"], result["single"]
    rows = [
        (
            f"single process: monitor per monitoring step, Llama {m['num_hidden_layers']} "
            f"layers, d = {m['hidden_size']} ({m['num_attention_heads']} heads), δ = 1",
            f"{s['monitor_ms']:.0f} ms (spectra {s['spectra_ms']:.0f} ms); snapshots "
            f"{s['snapshot_bytes'] / 1e6:.1f} MB, transient "
            f"+{s['heap_peak_delta_bytes'] / 1e6:.1f} MB",
        )
    ]
    for run in result["runs"]:
        ranks, world = run["ranks"], run["world"]
        if run["mode"] == "single-control":
            continue
        slow = max(ranks, key=lambda x: x["monitor_ms"])
        met = sum(x["meets_target"] for x in ranks)
        met_shared = sum(x["meets_target_shared"] for x in ranks)
        shared = f", {world} ranks on {result['cores']} cores" if run["oversubscribed"] else ""
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
