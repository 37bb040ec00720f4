"""Read a store while sinks write it: a private in-memory DuckDB over pinned table versions.

:class:`History` pins one version of every Delta table — in
:data:`~foreshock.storage.store.READ_ORDER`, the reverse of the writers' order, so every
record's ``steps`` row comes with all its values and a run's ``end`` with all its records —
and defines, in a fresh in-memory DuckDB connection, one view per table over exactly that
version's Parquet files (an empty typed table where a table has none yet), plus the derived
views every query uses:

* ``runs`` — one row per run: labels from its ``start``, status and divergence from its
  ``end`` (``running`` while there is none; ``divergence_known`` when the producer watched
  the loss itself — then its verdict, even "no divergence", beats the detectors' online
  estimate), progress (last step, last data, records) from ``steps``;
* ``warnings_latest`` — each warning id's newest detector event (opened → updated →
  cleared); people's acknowledgements and silences are folded in by :mod:`.acks`.

A local table is read with DuckDB's own ``read_parquet`` over the version's file list (faster
than through Arrow: ``benchmarks.storage``); a remote one the same way over local copies of its
files (:mod:`.file_cache`: Delta data files never change), or, where the cache is off or too
small, through delta-rs's Arrow dataset, which carries the storage options DuckDB would need an
extension for. (Filters the scan could apply itself — metrics as an ``IN`` list of constants,
the rank found first — were tried: no remote page got faster and local pages got slower, DuckDB's
semi-join beating its pushed-down string filter.) The snapshot never
changes under a query; ``History.versions`` names it (``foreshock tune`` records it and can
re-open it: ``open_history(store, versions=…)``). No reader takes a lock or blocks a writer.
"""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import pyarrow as pa

from .file_cache import FileCache, default_cache
from .location import StoreLocation, load_location
from .schema import TABLES, empty
from .store import READ_ORDER, _check_version, readable_table

__all__ = ["History", "QueryError", "open_history"]

_SQL_TYPES = {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR"}
log = logging.getLogger(__name__)
QueryError = duckdb.Error  # what a query on a snapshot raises (pages catch it, name no engine)

# A run is what its latest attempt (of each rank) says (foreshock.transport.attempts orders
# them: never the records' clocks): its status, end and progress; what it started as is its
# first attempt's.
# A graceful end of an abandoned attempt is not the run's, and seqs restart at 0 per attempt,
# so nothing compares them across attempts.
_RUNS = """
CREATE VIEW runs AS
WITH latest AS (
    SELECT run_id, rank, max(attempt) AS attempt
    FROM (SELECT run_id, rank, attempt FROM run_events
          UNION ALL SELECT run_id, rank, attempt FROM steps)
    GROUP BY run_id, rank),
starts AS (
    SELECT run_id, arg_min(project, (attempt, seq)) AS project,
           arg_min(scenario, (attempt, seq)) AS scenario, arg_min(fault, (attempt, seq)) AS fault,
           arg_min(onset, (attempt, seq)) AS onset, arg_min(time, (attempt, seq)) AS started_at,
           arg_min(body, (attempt, seq)) AS start_body
    FROM run_events WHERE kind = 'start' GROUP BY run_id),
ends AS (
    SELECT run_id, arg_max(status, seq) AS end_status, max(time) AS ended_at,
           arg_max(divergence_step, seq) AS end_divergence, max(last_seq) AS last_seq,
           bool_or(json_exists(body, '$.divergence_step')) AS divergence_known
    FROM run_events JOIN latest USING (run_id, rank, attempt) WHERE kind = 'end'
    GROUP BY run_id),
progress AS (
    SELECT run_id, max(step) AS last_step, max(time) AS last_time,
           max(received_at) AS last_received, count(*) AS records
    FROM steps JOIN latest USING (run_id, rank, attempt) GROUP BY run_id),
ids AS (SELECT DISTINCT run_id FROM latest)
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
    FROM warnings WHERE event IN ('opened', 'updated', 'cleared')) WHERE rk = 1
"""


class History:
    """A read-only snapshot of a store: ``sql(query, params)`` returns an Arrow table."""

    def __init__(
        self,
        store: str | Path | StoreLocation | None = None,
        versions: dict[str, int] | None = None,
        cache: FileCache | bool | None = True,
    ) -> None:
        self.location = load_location(str(store) if isinstance(store, Path) else store)
        # a remote store's files are read from local copies (True: the environment's cache)
        self.cache = default_cache() if cache is True else cache or None
        self.connection = duckdb.connect(":memory:")
        self.versions: dict[str, int] = {}
        self.files: dict[str, int] = {}
        self.damaged: dict[str, str] = {}  # table -> read at an older version, and why
        self._relations = []  # a view over an Arrow object needs the object kept alive
        for name in READ_ORDER:
            relation = self._pin(name, (versions or {}).get(name))
            relation.create_view(name)
            self._relations.append(relation)
        self.connection.execute(_RUNS)
        self.connection.execute(_WARNINGS_LATEST)

    def _pin(self, name: str, version: int | None):
        table = None
        if version != -1:
            table, note = readable_table(self.location, name, version)
            if note is not None:
                self.damaged[name] = note
        if table is None:
            if version is not None and version != -1:
                raise ValueError(f"store {self.location.uri} has no table {name}")
            self.versions[name], self.files[name] = -1, 0
            return self.connection.from_arrow(empty(name))
        _check_version(name, table)
        self.versions[name] = table.version()
        uris = table.file_uris()
        self.files[name] = len(uris)
        if not uris:
            return self.connection.from_arrow(empty(name))
        plain = not (table.protocol().reader_features or [])  # files alone say it all
        if plain and self.remote:
            uris = self._cached(name, table) or []
        if plain and uris:
            # a relation, not SQL text: no path is ever spliced into a statement
            return self._complete(name, self.connection.read_parquet(uris, union_by_name=True))
        dataset = table.to_pyarrow_dataset()
        self._relations.append(dataset)
        return self._complete(name, self.connection.from_arrow(dataset))

    @property
    def remote(self) -> bool:
        """Read as a remote store (``benchmarks.storage`` reads a local one so, to compare)."""
        return not self.location.is_local

    def _cached(self, name: str, table) -> list[str] | None:
        """Local copies of a remote table's files (:mod:`.file_cache`); None: read it remotely
        (no cache, or it does not fit, or a download failed: logged)."""
        if self.cache is None:
            return None
        try:
            uri = self.location.table_uri(name)
            return self.cache.local_paths(table, uri, self.location.options)
        except OSError as exc:
            log.info("foreshock history: %s read remotely (%s)", name, exc)
            return None

    def _complete(self, name: str, relation):
        """``relation`` with the columns its files predate (added later, nullable: see
        :mod:`.schema`) as nulls, so every query reads old and new stores alike."""
        missing = [f for f in TABLES[name] if f.name not in relation.columns]
        if not missing:
            return relation
        # names and types from TABLES, never from the data
        nulls = [f"CAST(NULL AS {_SQL_TYPES[f.type]}) AS {f.name}" for f in missing]
        return relation.project(", ".join(["*", *nulls]))

    @property
    def version(self) -> str:
        """The snapshot's name: each table's version, in :data:`TABLES` order."""
        return ".".join(str(self.versions[t]) for t in TABLES)

    def user_sql(self, query: str):
        """A person's own query (``store export --query``), read-only: one ``SELECT`` and
        nothing else (no ``COPY … TO``, no ``ATTACH``, no second statement), and from here on
        no file outside the store (and its local cache) can be read, nor the setting undone.
        ValueError, saying why, for anything else."""
        try:
            statements = duckdb.extract_statements(query)
        except duckdb.Error as exc:
            raise ValueError(f"not a query: {exc}") from None
        kinds = [s.type.name for s in statements]
        if kinds != ["SELECT"]:
            raise ValueError(f"--query is read-only: one SELECT statement, got {kinds or 'none'}")
        folders = [] if not self.location.is_local else [self.location.table_uri("")]
        folders += [] if self.cache is None else [str(self.cache.folder)]
        self.connection.execute("SET allowed_directories = ?", [folders])
        self.connection.execute("SET enable_external_access = false")
        self.connection.execute("SET lock_configuration = true")
        return self.sql(query)

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


def open_history(
    store: str | Path | StoreLocation | None = None,
    versions: dict[str, int] | None = None,
    cache: FileCache | bool | None = True,
) -> History:
    return History(store, versions, cache)
