"""Read a store while the sink writes it: a private in-memory DuckDB over one manifest.

:func:`open_history` reads the published manifest once and defines, in a fresh in-memory DuckDB
connection, one view per table over exactly the files it lists (an empty typed table where
there are none), plus the derived views every query uses:

* ``runs`` — one row per run: labels from its ``start``, status and divergence from its
  ``end`` (``running`` while there is none; ``divergence_known`` when the producer watched
  the loss itself — then its verdict, even "no divergence", beats the detectors' online
  estimate), progress (last step, last data, records) from ``steps``;
* ``warnings_latest`` — each warning id's newest state (opened → updated → cleared).

The snapshot never changes under a query; call :func:`open_history` again (cheap: one small
file) to see newer batches. No reader ever takes a lock, so any number of them run beside
the sink.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from .schema import TABLES, empty
from .segments import read_manifest

__all__ = ["History", "open_history"]

_RUNS = """
CREATE VIEW runs AS
WITH starts AS (
    SELECT run_id, arg_min(project, seq) AS project, arg_min(scenario, seq) AS scenario,
           arg_min(fault, seq) AS fault, arg_min(onset, seq) AS onset,
           min(time) AS started_at, arg_min(body, seq) AS start_body
    FROM run_events WHERE kind = 'start' GROUP BY run_id),
ends AS (
    SELECT run_id, arg_max(status, seq) AS end_status, max(time) AS ended_at,
           arg_max(divergence_step, seq) AS end_divergence, max(last_seq) AS last_seq,
           bool_or(json_exists(body, '$.divergence_step')) AS divergence_known
    FROM run_events WHERE kind = 'end' GROUP BY run_id),
progress AS (
    SELECT run_id, max(step) AS last_step, max(time) AS last_time,
           max(received_at) AS last_received, count(*) AS records
    FROM steps GROUP BY run_id),
ids AS (SELECT run_id FROM starts UNION SELECT run_id FROM ends UNION SELECT run_id FROM progress)
SELECT ids.run_id, s.project, s.scenario, s.fault, s.onset, s.started_at, e.ended_at,
       coalesce(e.end_status, 'running') AS status, e.end_divergence AS divergence_step,
       coalesce(e.divergence_known, false) AS divergence_known, e.last_seq, p.last_step,
       p.last_time, p.last_received, coalesce(p.records, 0) AS records,
       s.start_body
FROM ids LEFT JOIN starts s USING (run_id) LEFT JOIN ends e USING (run_id)
         LEFT JOIN progress p USING (run_id)
"""

_WARNINGS_LATEST = """
CREATE VIEW warnings_latest AS
SELECT * EXCLUDE (rk) FROM (
    SELECT *, row_number() OVER (PARTITION BY id ORDER BY
        CASE event WHEN 'cleared' THEN 2 WHEN 'updated' THEN 1 ELSE 0 END DESC,
        received_at DESC) AS rk
    FROM warnings) WHERE rk = 1
"""


class History:
    """A read-only snapshot of a store: ``sql(query, params)`` returns an Arrow table."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.manifest = read_manifest(self.root)
        self.generation = self.manifest["generation"]
        self.connection = duckdb.connect(":memory:")
        self._relations = []  # a view over an Arrow table needs the table kept alive
        for table in TABLES:
            files = [str(self.root / e["file"]) for e in self.manifest["tables"].get(table, [])]
            if files:  # a relation, not SQL text: no path is ever spliced into a statement
                relation = self.connection.read_parquet(files, union_by_name=True)
            else:
                relation = self.connection.from_arrow(empty(table))
            relation.create_view(table)
            self._relations.append(relation)
        self.connection.execute(_RUNS)
        self.connection.execute(_WARNINGS_LATEST)

    def sql(self, query: str, params: list | dict | None = None):
        """Run a parameterised query; the result as an Arrow table."""
        relation = self.connection.sql(query, params=params or None)
        return relation.to_arrow_table() if relation is not None else None

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_history(root: str | Path) -> History:
    return History(root)
