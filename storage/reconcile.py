"""Is every run's stream complete in the store? The producers' seqs are the ledger.

Each producer numbers its messages 0, 1, 2, … per (run, rank, attempt) and its ``end`` message
carries ``last_seq``, so the store can prove a stream complete without asking anyone: it holds every
seq in 0..last_seq. A stream is

* ``complete`` — ended, all of 0..last_seq stored;
* ``incomplete`` — ended with seqs missing: lost between producer and store (with the
  embedded broker: it restarted while holding messages of a producer that had already closed;
  see docs/reliability.md). The missing ranges say what to re-send, e.g. from a kept spool with
  ``foreshock spool flush``;
* ``open`` — no end yet (running, or its producer died): ``missing`` counts the gaps so far.

``foreshock store check`` prints this and exits 1 when a stream is incomplete.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import stream_queries
from .reader import History

__all__ = ["StreamCheck", "check_streams", "missing_ranges"]


@dataclass
class StreamCheck:
    run_id: str
    rank: int
    attempt: int  # a resumed run's incarnation (storage.schema)
    status: str  # complete | incomplete | open
    stored: int  # distinct seqs held
    expected: int  # last_seq + 1 when ended, else highest seq + 1
    missing: list[tuple[int, int]]  # inclusive seq ranges not stored (at most 20 listed)

    def to_dict(self) -> dict:
        return asdict(self)


def missing_ranges(seqs: list[int], upto: int, limit: int = 20) -> list[tuple[int, int]]:
    """Inclusive ranges of 0..upto-1 absent from ``seqs``, the first ``limit`` of them. Walks
    the stored seqs, never the range: a stream whose one message says seq 10¹² is checked in
    the time its stored seqs take (it used to walk ``range(upto)``: days).

    >>> missing_ranges([0, 1, 4, 5, 9], 11)
    [(2, 3), (6, 8), (10, 10)]
    >>> missing_ranges([0, 10**12], 10**12 + 1)
    [(1, 999999999999)]
    """
    out, expected = [], 0
    for seq in sorted({s for s in seqs if 0 <= s < upto}):
        if seq > expected:
            out.append((expected, seq - 1))
            if len(out) >= limit:
                return out
        expected = seq + 1
    if expected < upto:
        out.append((expected, upto - 1))
    return out


def check_streams(history: History) -> list[StreamCheck]:
    """Every stream in the store, with its status (see the module docstring)."""
    out = []
    for row in stream_queries.stream_completeness(history):
        ended = row["last_seq"] is not None
        expected = (row["last_seq"] if ended else row["top"]) + 1
        missing = []
        if row["stored"] < expected:
            seqs = stream_queries.stream_seqs(history, row["run_id"], row["rank"], row["attempt"])
            missing = missing_ranges(seqs, expected)
        status = "complete" if ended and not missing else "incomplete" if ended else "open"
        out.append(
            StreamCheck(
                row["run_id"], row["rank"], row["attempt"], status, row["stored"], expected, missing
            )
        )
    return out
