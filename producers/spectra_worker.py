"""The attention spectra of a monitoring step, solved off the training thread.

Why: at δ = 10 the eigen-solves of ΔW_q, ΔW_k, Δ2 and Δ3 are most of what the Monitor costs a
step (``python -m benchmarks.overhead``). They need nothing of the step but the weights, so the
training thread copies those (the stacked heads and the previous snapshot: what the solves
read, :func:`~.measure.attention_inputs`) and goes on; one worker thread solves them and the
record is written at the first ``Monitor.step`` after the solve is done — one step later, with
the values the step would have had on the training thread (the same operations on the same
copies).

Bounded: at most ``queue`` monitoring steps wait for the worker. When they do, the next
monitoring step's spectra are not solved (its record carries the flag ``spectra_skipped`` and
every other value); the training step never waits. Records leave in step order: one without
spectra waits behind the records before it. ``drain`` waits for all of them (before the run's
``end`` record, and at close).

Only a Monitor measuring alone uses it: in a process group the spectra come from an exchange
every rank enters at the same point of the step (:mod:`.collective`), so they stay there, and a
sharded job keeps its exact global result.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .measure import solve_attention
from .reading import to_host

__all__ = ["SKIPPED_FLAG", "SpectraWorker"]

SKIPPED_FLAG = "spectra_skipped"  # a monitoring step whose spectra the full queue skipped


@dataclass
class _Waiting:
    step: int
    values: dict[str, float]
    flags: set[str]
    solve: Future | None  # None: nothing to wait for (spectra skipped, or none to solve)


@dataclass
class SpectraWorker:
    """One worker thread and the monitoring steps waiting for it (see the module docstring)."""

    queue: int = 2
    solved: int = 0  # monitoring steps whose spectra the worker solved
    skipped: int = 0  # monitoring steps whose spectra a full queue skipped
    solve_s: list[float] = field(default_factory=list)  # the worker's time per solve [s]
    _waiting: deque[_Waiting] = field(default_factory=deque)
    _pool: ThreadPoolExecutor | None = None

    def submit(
        self, step: int, values: dict[str, float], flags: set[str], jobs: list[Any], config: Any
    ) -> None:
        """Queue a monitoring step's record: ``values`` and ``flags`` measured on the training
        thread, ``jobs`` (from ``attention_inputs``) to solve; skipped when the queue is full."""
        pending = sum(w.solve is not None and not w.solve.done() for w in self._waiting)
        solve = None
        if jobs and pending >= self.queue:
            flags = {*flags, SKIPPED_FLAG}
            self.skipped += 1
        elif jobs:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="foreshock-spectra")
            solve = self._pool.submit(self._solve, jobs, config)
        self._waiting.append(_Waiting(step, values, flags, solve))

    @property
    def waiting(self) -> int:
        """Monitoring steps whose records are not written yet."""
        return len(self._waiting)

    def ready(self, wait: bool = False) -> list[tuple[int, dict[str, float], set[str]]]:
        """The records whose spectra are in (every one with ``wait``), in step order:
        (step, values with the spectra first, flags). A failed solve is a flag."""
        out = []
        while self._waiting and (wait or _done(self._waiting[0].solve)):
            item = self._waiting.popleft()
            spectra: dict[str, float] = {}
            flags = item.flags
            if item.solve is not None:
                try:
                    spectra = item.solve.result()
                    self.solved += 1
                except Exception:  # an eigen-solver failed: the record keeps the rest
                    flags = {*flags, "monitor_error@attention"}
            out.append((item.step, {**spectra, **item.values}, flags))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _solve(self, jobs: list[Any], config: Any) -> dict[str, float]:
        start = time.perf_counter()
        chunks = solve_attention(jobs, config)
        keys = [key for chunk_keys, _ in chunks for key in chunk_keys]
        values = to_host([v for _, v in chunks])
        self.solve_s.append(time.perf_counter() - start)
        return dict(zip(keys, values, strict=True))


def _done(solve: Future | None) -> bool:
    return solve is None or solve.done()
