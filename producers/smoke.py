"""A short healthy training run with the monitors attached, summarised in a table.

Why: the quickest proof on a new machine that the monitors read a live model — discovery,
snapshots, spectra, router hooks and the sink all run end to end. No faults are injected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.table import format_table

from .monitor import Monitor, MonitorConfig
from .records import parse_series_key
from .sinks import JsonlSink, read_jsonl

__all__ = ["SmokeConfig", "SmokeResult", "run_smoke", "summary_table"]


@dataclass(frozen=True)
class SmokeConfig:
    steps: int = 200
    every: int = 10
    seed: int = 0
    batch_size: int = 16
    lr: float = 1e-3
    out: str = "runs/smoke.jsonl"
    model: GPTConfig = field(default_factory=GPTConfig)


@dataclass
class SmokeResult:
    path: Path
    records: list[dict[str, Any]]
    train_seconds: float
    monitor_seconds: float
    discovery: str
    errors: int


def run_smoke(config: SmokeConfig) -> SmokeResult:
    """Train the small GPT-MoE for ``config.steps`` steps with a Monitor writing JSON Lines."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    batches = ByteBatches(stdlib_bytes(), config.model.block_size, config.batch_size, config.seed)
    path = Path(config.out)
    path.unlink(missing_ok=True)
    monitor = Monitor(model, JsonlSink(path), config=MonitorConfig(every=config.every))
    for i, block in enumerate(model.h):
        name = f"h.{i}.attn"
        block.attn.logit_observer = lambda s, n=name: monitor.observe_max_logit(n, s)
    monitor_seconds = 0.0
    start = time.perf_counter()
    for step in range(config.steps):
        x, y = batches.next()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        tick = time.perf_counter()
        monitor.step(step, loss=loss)
        monitor_seconds += time.perf_counter() - tick
        optimizer.zero_grad(set_to_none=True)
    train_seconds = time.perf_counter() - start
    monitor.close()
    return SmokeResult(
        path, read_jsonl(path), train_seconds, monitor_seconds,
        monitor.discovery.summary(), monitor.errors,
    )  # fmt: skip


def summary_table(records: list[dict[str, Any]]) -> str:
    """One row per layer-level series (per-head detail left to the file): first/last/min/max."""
    series: dict[str, list[float]] = {}
    for record in records:
        for key, value in record.get("values", {}).items():
            if value is not None and parse_series_key(key).head is None:
                series.setdefault(key, []).append(value)
    rows = [[key, v[0], v[-1], min(v), max(v), len(v)] for key, v in sorted(series.items())]
    return format_table(["series", "first", "last", "min", "max", "n"], rows)
