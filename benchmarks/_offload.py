"""``python -m benchmarks.overhead --offload-spectra``: the eigen-solves off the training thread.

A measurement of a change not made (``producers`` is untouched): once the factors are
snapshotted, a monitoring step's attention spectra need not run on the training thread. For the
length of the benchmark, ``producers.monitor.attention_chunks`` is replaced by
:class:`OffloadedSpectra`: on the training thread it copies each layer's W_q, W_k (the
snapshot a real change would also take there) and hands the spectra to one worker thread; the
training thread waits only if the previous monitoring step's solve is still running when the
next one starts. The record of that step then lacks the attention series (a real change would
write them with a later record), so this measures cost only: the training thread's share
(``direct``) and the end-to-end step time with the worker competing for the cores.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

import foreshock.producers.monitor as monitor_module


def frozen(spec: Any) -> Any:
    """``spec`` with each tensor field copied: what the worker reads while training goes on."""
    copies = {
        f.name: value.detach().clone()
        for f in dataclasses.fields(spec)
        if isinstance(value := getattr(spec, f.name), torch.Tensor)
    }
    return dataclasses.replace(spec, **copies)


class OffloadedSpectra:
    """Stands in for ``attention_chunks``: copy on the caller's thread, solve on a worker."""

    def __init__(self) -> None:
        self._inner = monitor_module.attention_chunks
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foreshock-spectra")
        self._pending: Future | None = None
        self.copy_s: list[float] = []  # training thread: the copies [s]
        self.wait_s = 0.0  # training thread: waiting for an unfinished solve [s]
        self.solve_s: list[float] = []  # worker thread: one monitoring step's spectra [s]

    def __call__(self, specs: list[Any], snapshots: dict, config: Any) -> list:
        self._drain()
        start = time.perf_counter()
        copies = [frozen(s) for s in specs]
        self.copy_s.append(time.perf_counter() - start)
        self._pending = self._pool.submit(self._solve, copies, snapshots, config)
        return []  # the values would join a later record

    def _solve(self, specs: list[Any], snapshots: dict, config: Any) -> None:
        start = time.perf_counter()
        for _, values in self._inner(specs, snapshots, config):
            values.tolist()  # to the host, as the Monitor's one transfer would
        self.solve_s.append(time.perf_counter() - start)

    def _drain(self) -> None:
        if self._pending is not None:
            start = time.perf_counter()
            self._pending.result()
            self.wait_s += time.perf_counter() - start
            self._pending = None

    def install(self) -> None:
        monitor_module.attention_chunks = self

    def close(self) -> dict[str, Any]:
        """Finish, put ``attention_chunks`` back; the figures [s] for the closing JSON."""
        self._drain()
        self._pool.shutdown()
        monitor_module.attention_chunks = self._inner
        return {
            "offload_copy_s_median": statistics.median(self.copy_s) if self.copy_s else None,
            "offload_solve_s_median": statistics.median(self.solve_s) if self.solve_s else None,
            "offload_wait_s_total": self.wait_s,
            "offload_solves": len(self.solve_s),
        }
