"""A monitoring step's heavy arithmetic, done off the training thread.

Why: at δ = 10 the eigen-solves of ΔW_q, ΔW_k, Δ2 and Δ3 are most of what the Monitor costs a
step (``python -m benchmarks.overhead``), and the rest of a record — routing entropies from the
hooks' accumulated counts, router-row geometry — is many small operations. None of it needs the
step but its inputs, so the training thread copies those (the stacked heads and the previous
snapshot, :func:`~.measure.attention_inputs`; the router rows; the accumulators' states, plain
numbers already) and goes on; one worker thread turns them into values, and the record is
written at the first ``Monitor.step`` after that is done — one step later, with the values the
step would have had on the training thread (the same operations on the same copies). What
must be read at the step itself (the norms of the weights and gradients, the loss, the largest
logits, the learning rates) is read there.

Bounded: at most ``queue`` monitoring steps wait for the worker. When they do, the next
monitoring step's spectra are not solved (its record carries the flag ``spectra_skipped``; its
other values are computed on the training thread); the training step never waits. Records
leave in step order: one that did not need the worker waits behind the records before it.
``drain`` waits for all of them (before the run's ``end`` record, and at close).

Only a Monitor measuring alone uses it: in a process group the spectra come from an exchange
every rank enters at the same point of the step (:mod:`.collective`), so they stay there, and a
sharded job keeps its exact global result.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["SKIPPED_FLAG", "SpectraWorker", "Work"]

SKIPPED_FLAG = "spectra_skipped"  # a monitoring step whose spectra the full queue skipped

# A record's deferred values: called with whether to solve the spectra, it returns
# (values, flags); it reads only copies made at the step.
Work = Callable[[bool], tuple[dict[str, float], set[str]]]


@dataclass
class _Waiting:
    step: int
    values: dict[str, float]
    flags: set[str]
    solve: Future | None  # None: nothing to wait for (done on the training thread)


@dataclass
class SpectraWorker:
    """One worker thread and the monitoring steps waiting for it (see the module docstring)."""

    queue: int = 2
    solved: int = 0  # monitoring steps whose spectra the worker solved
    skipped: int = 0  # monitoring steps whose spectra a full queue skipped
    solve_s: list[float] = field(default_factory=list)  # the worker's time per record [s]
    _waiting: deque[_Waiting] = field(default_factory=deque)
    _pool: ThreadPoolExecutor | None = None

    def submit(
        self, step: int, values: dict[str, float], flags: set[str], work: Work, spectra: bool
    ) -> None:
        """Queue a monitoring step's record: ``values`` and ``flags`` read on the training
        thread, ``work`` for the rest (``spectra``: whether it has spectra to solve); with the
        queue full, the rest is done now without the spectra, and flagged."""
        pending = sum(w.solve is not None and not w.solve.done() for w in self._waiting)
        if spectra and pending >= self.queue:
            rest, more = work(False)
            self.skipped += 1
            item = _Waiting(step, {**rest, **values}, {*flags, *more, SKIPPED_FLAG}, None)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="foreshock-spectra")
            item = _Waiting(step, values, flags, self._pool.submit(self._timed, work, spectra))
        self._waiting.append(item)

    @property
    def waiting(self) -> int:
        """Monitoring steps whose records are not written yet."""
        return len(self._waiting)

    def ready(self, wait: bool = False) -> list[tuple[int, dict[str, float], set[str]]]:
        """The records whose values are in (every one with ``wait``), in step order:
        (step, values with the worker's first, flags). A failed piece of work is a flag."""
        out = []
        while self._waiting and (wait or _done(self._waiting[0].solve)):
            item = self._waiting.popleft()
            done: dict[str, float] = {}
            flags = item.flags
            if item.solve is not None:
                try:
                    done, more = item.solve.result()
                    flags = {*flags, *more}
                    self.solved += 1
                except Exception:  # the work guards its parts; this is a last resort
                    flags = {*flags, "monitor_error@attention"}
            out.append((item.step, {**done, **item.values}, flags))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _timed(self, work: Work, spectra: bool) -> tuple[dict[str, float], set[str]]:
        start = time.perf_counter()
        try:
            return work(spectra)
        finally:
            self.solve_s.append(time.perf_counter() - start)


def _done(solve: Future | None) -> bool:
    return solve is None or solve.done()
