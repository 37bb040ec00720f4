"""What the store holds of each stream, seq by seq: the queries of exactly-once.

The sink reads these back on every partition assignment (what it must not store again:
:mod:`~foreshock.storage.stored_state`), and ``foreshock store check`` fails on what they
find wrong (a seq stored twice, values without their step row, a run's values not the sum of
its records' ``n_values``). The dashboard's queries are in :mod:`~foreshock.storage.queries`;
these read the bookkeeping columns (seq, attempt, n_values) no page shows.
"""

from __future__ import annotations

from typing import Any

from .reader import History

__all__ = [
    "duplicate_records",
    "orphan_values",
    "stored_event_keys",
    "stored_streams",
    "stream_completeness",
    "stream_seqs",
    "value_count_mismatches",
]


def stored_streams(history: History) -> list[dict[str, Any]]:
    """Per (run, rank, attempt) stream: how many seqs are stored and the highest (the sink's
    dedup)."""
    return history.sql(
        "SELECT run_id, rank, attempt, count(*) AS n, max(seq) AS top FROM ("
        " SELECT run_id, rank, attempt, seq FROM steps UNION ALL"
        " SELECT run_id, rank, attempt, seq FROM run_events) GROUP BY ALL"
    ).to_pylist()


def stream_seqs(history: History, run_id: str, rank: int, attempt: int = 0) -> list[int]:
    return (
        history.sql(
            "SELECT seq FROM steps WHERE run_id = ? AND rank = ? AND attempt = ? UNION ALL "
            "SELECT seq FROM run_events WHERE run_id = ? AND rank = ? AND attempt = ?",
            [run_id, rank, attempt] * 2,
        )
        .column("seq")
        .to_pylist()
    )


def stored_event_keys(history: History) -> list[tuple]:
    """Keys of stored warning events and dead letters (what the sink must not store again)."""
    from .acks import STORED_EVENT_KEYS

    warnings = history.sql(STORED_EVENT_KEYS)
    letters = history.sql(
        'SELECT source, partition, "offset" FROM dead_letters WHERE partition IS NOT NULL'
    )
    return [("w", *row.values()) for row in warnings.to_pylist()] + [
        ("d", *row.values()) for row in letters.to_pylist()
    ]


def orphan_values(history: History) -> list[tuple[str, int, int, int]]:
    """(run, rank, attempt, step) whose values are stored but whose ``steps`` row is not: what a
    writer that died between its ``metric_values`` and ``steps`` commits left (the sink that
    takes the stream over writes only the step row; see :mod:`foreshock.storage.store`)."""
    rows = history.sql(
        "SELECT DISTINCT run_id, rank, attempt, step FROM metric_values "
        "ANTI JOIN steps USING (run_id, rank, attempt, step)"
    )
    return [tuple(r.values()) for r in rows.to_pylist()]


def duplicate_records(history: History) -> list[dict[str, Any]]:
    """Streams holding a seq (or a record's values) more than once: never, if exactly-once
    holds — ``foreshock store check`` fails on any."""
    return history.sql(
        "SELECT run_id, rank, attempt, count(*) - count(DISTINCT seq) AS extra FROM ("
        " SELECT run_id, rank, attempt, seq FROM steps UNION ALL"
        " SELECT run_id, rank, attempt, seq FROM run_events) GROUP BY ALL"
        " HAVING count(*) > count(DISTINCT seq) ORDER BY ALL"
    ).to_pylist()


def value_count_mismatches(history: History) -> list[dict[str, Any]]:
    """Runs whose stored values are not the sum of their records' ``n_values`` (a batch's values
    stored twice, or lost)."""
    return history.sql(
        "SELECT run_id, s.expected, coalesce(v.stored, 0) AS stored FROM"
        " (SELECT run_id, sum(n_values) AS expected FROM steps GROUP BY run_id) s"
        " LEFT JOIN (SELECT run_id, count(*) AS stored FROM metric_values GROUP BY run_id) v"
        " USING (run_id) WHERE s.expected <> coalesce(v.stored, 0) ORDER BY run_id"
    ).to_pylist()


def stream_completeness(history: History) -> list[dict[str, Any]]:
    """Per (run, rank, attempt): distinct seqs stored, the highest one, and ``last_seq`` if it
    ended."""
    return history.sql(
        "WITH seqs AS (SELECT run_id, rank, attempt, seq FROM steps UNION ALL "
        "SELECT run_id, rank, attempt, seq FROM run_events), "
        "ends AS (SELECT run_id, rank, attempt, max(last_seq) AS last_seq FROM run_events "
        "WHERE kind = 'end' GROUP BY ALL) "
        "SELECT s.run_id, s.rank, s.attempt, count(DISTINCT s.seq) AS stored, "
        "max(s.seq) AS top, any_value(e.last_seq) AS last_seq FROM seqs s LEFT JOIN ends e "
        "USING (run_id, rank, attempt) GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
