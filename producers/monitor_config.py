"""What a Monitor measures and how: one frozen config, logged whole in ``Monitor.describe()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["MonitorConfig"]


@dataclass(frozen=True)
class MonitorConfig:
    """Everything that changes what a monitor measures; logged whole in ``Monitor.describe()``.

    every:        δ, steps between weight snapshots (and monitoring steps)
    alpha:        spectral-entropy exponent, p_i ∝ σ_i^α (2 = the paper's trade-off)
    core_method:  "eigh" (Gram + eigvalsh of the compressed core, fast) or "svd" (svdvals)
    per_head:     emit each head's Δ2/Δ3 entropy, not only the layer mean/min
    weight_spectra: ΔW_q/ΔW_k spectra (a d×(H·d_h) Gram eigenproblem per layer, the costliest
                  part for wide models)
    emit_ranks:   who writes under torch.distributed. Every rank measures on monitoring steps
                  (each holds a share of a sharded model and of the data); "zero": global
                  rank 0 writes one global record (data statistics over all ranks); "all":
                  every rank writes its own record (its own data statistics, labelled with its
                  rank) — to catch one bad GPU
    join_timeout_s: how long a Monitor waits, once, for every rank to build its own; a rank
                  left alone measures only what it can read alone (never a collective)
    spectra_worker: compute the attention spectra, routing entropies and router geometry on
                  a worker thread from copies taken at the step (:mod:`.spectra_worker`; a
                  Monitor measuring alone only; the default): the record is written at a
                  later ``step()`` call (``flush()`` writes what waits), the training thread
                  never waits (the training thread's share of a step: ``python -m
                  benchmarks.overhead``, target ≤ 1 % at δ = 10). Off (the lab's: one thread per
                  training process, records at their step), they are computed in the step and
                  its record is written by it
    spectra_queue: monitoring steps that may wait for the worker; one more skips its spectra
                  (flagged ``spectra_skipped``), never the training step
    batch_elements: layers of one shape are batched into one QR/eigen call while their
                  [ΔW_q, W_q] factors hold at most this many elements (at least one layer per
                  call): many small layers share a call, a wide layer gets its own. The
                  transient working set is ~10× that in float32 (2**24 → ~640 MB at most)
    """

    every: int = 10
    alpha: float = 2.0
    core_method: Literal["eigh", "svd"] = "eigh"
    per_head: bool = True
    weight_spectra: bool = True
    emit_ranks: Literal["zero", "all"] = "zero"
    batch_elements: int = 2**24
    join_timeout_s: float = 60.0
    spectra_worker: bool = True
    spectra_queue: int = 2

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")
        if self.spectra_queue < 1:
            raise ValueError(f"spectra_queue must be >= 1, got {self.spectra_queue}")
        if self.batch_elements < 1:
            raise ValueError(f"batch_elements must be >= 1, got {self.batch_elements}")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if self.core_method not in ("eigh", "svd"):
            raise ValueError(f"core_method must be 'eigh' or 'svd', got {self.core_method!r}")
        if self.emit_ranks not in ("zero", "all"):
            raise ValueError(f"emit_ranks must be 'zero' or 'all', got {self.emit_ranks!r}")
