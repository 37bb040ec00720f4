"""Every query the dashboard, ``foreshock report`` and ``foreshock tune`` make — the only SQL.

Each function takes a :class:`~foreshock.storage.reader.History` snapshot (one per page render,
so a page's numbers agree with each other) and returns plain Python rows. All parameters are
bound (``?``), never spliced; large series are downsampled here, in the query, so a page never
pulls more than ``max_points`` per line.

A run written **per rank** (``emit_ranks="all"``: every rank its own records, one stream each)
has one series per rank: every query of a run's values reads one rank — ``rank`` when given,
else the run's lowest — never two ranks' values at one step averaged into one line.
:func:`run_ranks` lists them; a warning names its rank (``rank``, null for one process).

A run's **status** (fleet page): ``diverged`` once its loss diverged (the producer's exact step,
else the detectors'); ``warning: <family>`` while a mechanism warning is open; ``finished`` when
it ended; ``healthy`` while it runs quietly. Urgency: open warning, diverged, healthy, finished.
``collisions``: how many stray jobs wrote under the run id (``collision`` warnings:
:mod:`foreshock.transport.attempt_guard`), never a status of its own — the run's is its live
attempt's.
"""

from __future__ import annotations

import json
from typing import Any

from foreshock.transport.attempts import TIME_BITS
from foreshock.transport.records import series_key

from .reader import History

__all__ = [
    "dead_letters",
    "fleet",
    "idle_runs",
    "lead_table",
    "run_actions",
    "run_attempts",
    "run_count",
    "run_ranks",
    "run_records",
    "run_rows",
    "run_series_index",
    "run_starts",
    "run_warnings",
    "series",
    "series_across_runs",
    "series_many",
    "summary",
]


_FLEET = """
WITH w AS (
    SELECT run_id,
        list_sort(list_distinct(list(family || ' @ ' || coalesce(module, '-')
            || coalesce(' (rank ' || rank || ')', ''))
            FILTER (WHERE event <> 'cleared' AND family NOT IN ('symptom', 'collision'))))
            AS active,
        arg_min(family, (step, family))
            FILTER (WHERE event <> 'cleared' AND family NOT IN ('symptom', 'collision'))
            AS active_family,
        min(step) FILTER (WHERE family NOT IN ('symptom', 'collision')) AS first_warning_step,
        arg_min(family, (step, family)) FILTER (WHERE family NOT IN ('symptom', 'collision'))
            AS first_family,
        count(DISTINCT id) FILTER (WHERE family = 'collision') AS collisions,
        max(divergence_step) AS detected_divergence
    FROM warnings_latest GROUP BY run_id)
SELECT r.run_id, r.project, r.scenario, r.fault, r.status AS lifecycle, r.last_step,
       r.last_time, r.last_received, r.records, w.active, w.active_family,
       w.first_warning_step, w.first_family, coalesce(w.collisions, 0) AS collisions,
       CASE WHEN r.divergence_known THEN r.divergence_step ELSE w.detected_divergence END
           AS divergence_step
FROM runs r LEFT JOIN w USING (run_id)
WHERE (?::VARCHAR IS NULL OR r.project = ?)
  AND (?::DOUBLE IS NULL OR coalesce(r.last_received, r.started_at) >= ?)
  AND (?::VARCHAR IS NULL OR r.run_id = ?)
"""


def _status(row: dict[str, Any]) -> str:
    if row["divergence_step"] is not None:
        return "diverged"
    if row["active_family"]:
        return f"warning: {row['active_family']}"
    return "healthy" if row["lifecycle"] == "running" else "finished"


_URGENCY = {"warning": 0, "diverged": 1, "healthy": 2, "finished": 3}


def fleet(
    history: History,
    project: str | None = None,
    status: str | None = None,
    family: str | None = None,
    since: float | None = None,
    run_id: str | None = None,
) -> list[dict[str, Any]]:
    """One row per run, most urgent first; filters on project, status (prefix), fault family
    (a run with a warning or first warning of it), last data after ``since`` (Unix s) and
    one ``run_id``."""
    rows = history.sql(_FLEET, [project, project, since, since, run_id, run_id]).to_pylist()
    for row in rows:
        row["status"] = _status(row)
        row["active"] = row["active"] or []
        div, first = row["divergence_step"], row["first_warning_step"]
        early = div is not None and first is not None and first < div
        row["lead_time"] = div - first if early else None  # a warning after it leads nothing
    if status:
        rows = [r for r in rows if r["status"].startswith(status)]
    if family:
        rows = [r for r in rows if family in (r["active_family"], r["first_family"])]
    rows.sort(key=lambda r: (_URGENCY[r["status"].split(":")[0]], -(r["last_received"] or 0)))
    return rows


def summary(history: History, run_id: str) -> dict[str, Any] | None:
    """The run's row of :func:`fleet` plus its start message's labels."""
    rows = fleet(history, run_id=run_id)
    if not rows:
        return None
    start = history.sql("SELECT start_body FROM runs WHERE run_id = ?", [run_id]).to_pylist()
    body = start[0]["start_body"] if start else None
    return {**rows[0], "labels": json.loads(body).get("labels", {}) if body else {}}


def run_ranks(history: History, run_id: str) -> list[int]:
    """The ranks that wrote records to the run: ``[0]`` for one process, several per rank."""
    return (
        history.sql("SELECT DISTINCT rank FROM steps WHERE run_id = ? ORDER BY rank", [run_id])
        .column("rank")
        .to_pylist()
    )


# the rank a run's value queries read: the one asked for, else the run's lowest (parameters:
# rank, run_id)
_RANK = "rank = coalesce(?::BIGINT, (SELECT min(rank) FROM steps WHERE run_id = ?), 0)"


def run_series_index(
    history: History, run_id: str, rank: int | None = None
) -> list[dict[str, Any]]:
    """Which (metric, module, head) series a run (one rank of it) has, with their points."""
    return history.sql(_SERIES_INDEX, [run_id, rank, run_id]).to_pylist()


_SERIES_INDEX = (
    "SELECT metric, module, head, count(*) AS points FROM metric_values WHERE run_id = ? "
    f"AND {_RANK} GROUP BY ALL ORDER BY metric, module NULLS FIRST, head NULLS FIRST"
)


# A resumed run has a step once per attempt that reached it: a line shows the latest attempt's
# (what training continued from); one rank's (see the module docstring). Bucket widths are
# computed in DOUBLE: a step near 2**63 must not overflow BIGINT.
_SERIES = f"""
WITH s AS (
    SELECT metric, step, module, head, value FROM metric_values
    WHERE run_id = ? AND metric IN (SELECT unnest(?::VARCHAR[])) AND {_RANK}
      AND (?::VARCHAR IS NULL OR module = ?)
      AND ((?::BOOLEAN AND head IS NULL) OR (NOT ?::BOOLEAN AND head IS NOT NULL))
    QUALIFY attempt = max(attempt) OVER (PARTITION BY metric, module, head, step)),
b AS (SELECT greatest(1, least(ceil((max(step)::DOUBLE - min(step)::DOUBLE + 1) / ?::DOUBLE),
      2^62))::BIGINT AS width FROM s)
SELECT metric, module, head, min(step) AS step, avg(value) AS value, min(value) AS low,
       max(value) AS high, count(*) AS points
FROM s, b GROUP BY metric, module, head, step // width ORDER BY metric, module, head, step
"""


def series(
    history: History,
    run_id: str,
    metric: str,
    module: str | None = None,
    heads: bool = False,
    max_points: int = 1000,
    rank: int | None = None,
) -> list[dict[str, Any]]:
    """A run's ``metric`` per module (or per head with ``heads``), at most ``max_points``
    buckets per line: each bucket's first step, mean, min and max; one rank's (``rank``, else
    the run's lowest)."""
    return series_many(history, run_id, [metric], module, heads, max_points, rank)[metric]


def series_many(
    history: History,
    run_id: str,
    metrics: list[str],
    module: str | None = None,
    heads: bool = False,
    max_points: int = 1000,
    rank: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`series` of several metrics in one pass over the run's rows (one bucket width
    for all: the run's step range / ``max_points``)."""
    params = [run_id, metrics, rank, run_id, module, module, not heads, not heads]
    rows = history.sql(_SERIES, [*params, max_points]).to_pylist()
    out: dict[str, list[dict[str, Any]]] = {m: [] for m in metrics}
    for row in rows:
        out[row.pop("metric")].append(row)
    return out


_ACROSS = """
WITH s AS (
    SELECT run_id, step, value FROM metric_values
    WHERE run_id IN (SELECT unnest(?::VARCHAR[])) AND metric = ? AND head IS NULL
      AND (?::VARCHAR IS NULL OR module = ?)
      AND rank = (SELECT min(t.rank) FROM steps t WHERE t.run_id = metric_values.run_id)
    QUALIFY attempt = max(attempt) OVER (PARTITION BY run_id, module, step)),
b AS (SELECT greatest(1, least(ceil((max(step)::DOUBLE - min(step)::DOUBLE + 1) / ?::DOUBLE),
      2^62))::BIGINT AS width FROM s)
SELECT run_id, min(step) AS step, avg(value) AS value
FROM s, b GROUP BY run_id, step // width ORDER BY run_id, step
"""


def series_across_runs(
    history: History,
    run_ids: list[str],
    metric: str,
    module: str | None = None,
    max_points: int = 500,
) -> list[dict[str, Any]]:
    """The same monitor over several runs (module-averaged where ``module`` is None; each
    run's lowest rank)."""
    return history.sql(_ACROSS, [run_ids, metric, module, module, max_points]).to_pylist()


def run_warnings(history: History, run_id: str) -> list[dict[str, Any]]:
    """The run's warnings, newest state of each, in step order; evidence parsed."""
    rows = history.sql(
        "SELECT * FROM warnings_latest WHERE run_id = ? ORDER BY step, family, module", [run_id]
    ).to_pylist()
    for row in rows:
        row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
    return rows


def run_actions(history: History, run_id: str) -> list[dict[str, Any]]:
    """What the run's trainer did about its warnings: its ``action`` records as they came
    (what, at which step, for which warning, from the policy or a person's request, how it
    went), in the order it took them; one per (rank, attempt, seq), a redelivery stored twice
    shown once."""
    rows = history.sql(
        "SELECT any_value(body) AS body FROM run_events WHERE run_id = ? AND kind = 'action' "
        "GROUP BY rank, attempt, seq ORDER BY attempt, rank, seq",
        [run_id],
    ).to_pylist()
    return [json.loads(row["body"]) for row in rows]


_LEADS = """
SELECT r.run_id, r.scenario, r.fault,
       CASE WHEN r.divergence_known THEN r.divergence_step ELSE max(w.divergence_step) END
           AS divergence_step,
       min(w.step) FILTER (WHERE w.family = 'attention-numerics') AS attention_step,
       min(w.step) FILTER (WHERE w.family = 'router') AS router_step,
       min(w.step) FILTER (WHERE w.family = 'symptom') AS symptom_step,
       arg_min(w.family || ':' || w.role, (w.step, w.family))
           FILTER (WHERE w.family NOT IN ('symptom', 'collision')) AS first_mechanism
FROM runs r LEFT JOIN warnings_latest w USING (run_id)
GROUP BY r.run_id, r.scenario, r.fault, r.divergence_step, r.divergence_known
ORDER BY r.scenario, r.run_id
"""


def lead_table(history: History) -> list[dict[str, Any]]:
    """Per run: first warning step of each family, divergence step, and the leads
    (divergence − first warning; only warnings before divergence count as leads). Two families
    first warning at one monitoring step tie; ``first_mechanism`` then names them in
    alphabetical order (attention-numerics first), not in whatever order the table was scanned.

    The divergence step is the producer's when it watched the loss (the lab does, every step),
    else the detectors' online estimate."""
    rows = history.sql(_LEADS).to_pylist()
    for row in rows:
        div = row["divergence_step"]
        steps = [row["attention_step"], row["router_step"]]
        first = min((s for s in steps if s is not None and (div is None or s < div)), default=None)
        row["mechanism_step"] = first
        row["mechanism_lead"] = div - first if div is not None and first is not None else None
        sym = row["symptom_step"]
        row["symptom_lead"] = (
            div - sym if div is not None and sym is not None and sym < div else None
        )
    return rows


def run_starts(history: History) -> list[dict[str, Any]]:
    """Each run's first ``start`` (parsed: its labels and architecture signature), whether it
    ended and its divergence step as :func:`fleet` reads it (the producer's, else the
    detectors'): what the profile builder groups and judges runs by."""
    rows = history.sql(
        "SELECT run_id, start_body, ended_at FROM runs "
        "WHERE start_body IS NOT NULL ORDER BY started_at, run_id"
    ).to_pylist()
    divergence = {r["run_id"]: r["divergence_step"] for r in fleet(history)}
    return [
        {
            "run_id": row["run_id"],
            "start": json.loads(row["start_body"]),
            "ended": row["ended_at"] is not None,
            "divergence_step": divergence.get(row["run_id"]),
        }
        for row in rows
    ]


def run_records(history: History, run_id: str) -> tuple[dict | None, list[dict], dict | None]:
    """A stored run as its wire messages again (its first start, metrics records in (rank,
    attempt, step) order — a resumed run's attempts one after the other, as they happened;
    each rank its own stream — and its last end): what the detectors replay in ``foreshock
    tune``."""
    events = history.sql(
        "SELECT kind, body FROM run_events WHERE run_id = ? ORDER BY attempt, seq", [run_id]
    ).to_pylist()
    start = next((json.loads(e["body"]) for e in events if e["kind"] == "start"), None)
    end = next((json.loads(e["body"]) for e in reversed(events) if e["kind"] == "end"), None)
    columns = history.sql(
        "SELECT rank, attempt, step, metric, module, head, value FROM metric_values "
        "WHERE run_id = ? ORDER BY rank, attempt, step",
        [run_id],
    ).to_pydict()
    records: dict[tuple[int, int, int], dict[str, Any]] = {}
    for rank, attempt, step, metric, module, head, value in zip(*columns.values(), strict=True):
        record = records.setdefault(
            (rank, attempt, step),
            {
                "kind": "metrics",
                "run_id": run_id,
                "rank": rank,
                "attempt": attempt,
                "step": step,
                "values": {},
            },
        )
        record["values"][series_key(metric, module, head)] = value
    return start, list(records.values()), end


# two attempts of one restart count (foreshock.transport.attempts: its high bits)
_SAME_RESTART = f"b.attempt >> {TIME_BITS} = a.attempt >> {TIME_BITS}"


def run_attempts(history: History, run_id: str | None = None) -> list[dict[str, Any]]:
    """Each attempt of each (run, rank) — a resumed run has several — with its first and last
    step and producer time, whether it ended, and ``overlaps``: another attempt of the same
    (run, rank) was sending at the same time (two jobs under one run id: a collision, never a
    resume). Ordered as the attempts are (:mod:`foreshock.transport.attempts`: restart count,
    then start time — never the records' clocks), so ``number`` counts restarts from 1; only
    attempts of one restart count can overlap."""
    return history.sql(
        "WITH a AS (SELECT run_id, rank, attempt, min(step) AS first_step, "
        " max(step) AS last_step, min(time) AS first_time, max(time) AS last_time, "
        " count(*) AS records FROM steps WHERE ?::VARCHAR IS NULL OR run_id = ? GROUP BY ALL), "
        "e AS (SELECT DISTINCT run_id, rank, attempt FROM run_events WHERE kind = 'end') "
        "SELECT a.*, e.attempt IS NOT NULL AS ended, "
        " row_number() OVER (PARTITION BY a.run_id, a.rank ORDER BY a.attempt) AS number, "
        " EXISTS (SELECT 1 FROM a b WHERE b.run_id = a.run_id AND b.rank = a.rank "
        "  AND b.attempt <> a.attempt AND " + _SAME_RESTART + " "
        "  AND b.first_time < a.last_time AND a.first_time < b.last_time) AS overlaps "
        "FROM a LEFT JOIN e USING (run_id, rank, attempt) ORDER BY run_id, rank, attempt",
        [run_id, run_id],
    ).to_pylist()


def idle_runs(history: History, cutoff: float) -> list[str]:
    """Runs whose newest data (step, lifecycle message or warning) arrived before ``cutoff``."""
    return sorted(
        history.sql(
            "SELECT run_id FROM (SELECT run_id, received_at AS t FROM steps UNION ALL "
            "SELECT run_id, received_at FROM run_events UNION ALL "
            "SELECT run_id, received_at FROM warnings) GROUP BY run_id HAVING max(t) < ?",
            [cutoff],
        )
        .column("run_id")
        .to_pylist()
    )


def run_rows(history: History, table: str, run_id: str):
    """Every row of one run in ``table`` (Arrow), for export."""
    if table not in ("run_events", "steps", "metric_values", "warnings"):
        raise ValueError(f"no per-run table {table!r}")
    return history.sql(f"SELECT * FROM {table} WHERE run_id = ?", [run_id])


def run_count(history: History) -> int:
    return history.sql("SELECT count(*) AS n FROM runs").to_pylist()[0]["n"]


def dead_letters(history: History, limit: int = 100) -> list[dict[str, Any]]:
    return history.sql(
        'SELECT received_at, source, partition, "offset", reason, octet_length(raw) AS bytes '
        "FROM dead_letters ORDER BY received_at DESC LIMIT ?",
        [limit],
    ).to_pylist()
