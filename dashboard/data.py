"""What the pages read: cached calls into :mod:`foreshock.storage.queries` and the detector
registry. No SQL here either; nothing is opened at import time.

The store comes from ``FORESHOCK_STORE`` (``foreshock dashboard --store`` sets it): a folder
or a URI. The dashboard refreshes *by version*: every ``TTL`` seconds it reads the tables'
newest versions (one small log read each); answers are cached under those versions, so an
auto-refresh of an idle fleet costs no query at all, a page's numbers all come from one pinned
snapshot, and many viewers share them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import streamlit as st

from foreshock.catalogue import SERIES, series
from foreshock.storage import queries
from foreshock.storage.location import DEFAULT_STORE
from foreshock.storage.reader import open_history
from foreshock.storage.store import store_exists as _exists
from foreshock.storage.store import table_versions

__all__ = [
    "MONITORS",
    "TTL",
    "compare",
    "fleet",
    "live_config",
    "profiles",
    "projects",
    "run_ids",
    "run_page",
    "run_ranks",
    "store_exists",
    "store_path",
    "tune_reports",
]

TTL = 2.0  # seconds between reads of the store's versions
KEEP = 600.0  # seconds an answer for one version stays cached
# The monitors a person can chart, in menu order; labels and families come from the catalogue.
CHARTED = (
    "attn.d2.entropy_mean",
    "attn.dwq.entropy",
    "attn.dwk.entropy",
    "max_logit",
    "router.token_entropy_norm",
    "router.load_entropy",
    "router.epsilon",
    "grad_norm",
)
MONITORS: dict[str, tuple[str, str]] = {  # label -> (metric, family)
    series(m).label: (m, series(m).family) for m in CHARTED
}
PER_HEAD = {s.metric: s.per_head for s in SERIES if s.per_head}  # module metric -> per-head


def store_path() -> str:
    return os.environ.get("FORESHOCK_STORE", DEFAULT_STORE)


def store_exists() -> bool:
    return _exists(store_path())


@st.cache_data(ttl=TTL, show_spinner=False)
def damage() -> list[str]:
    """The store's damaged commits, as sentences: the pages read such a table at its last
    readable version (``storage.store.readable_table``) and say so."""
    from foreshock.storage.repair import damaged_commits

    return [d.sentence() for d in damaged_commits(store_path())]


@st.cache_data(ttl=TTL, show_spinner=False)
def _versions(store: str) -> tuple[tuple[str, int], ...]:
    return tuple(table_versions(store).items())


def _pinned(store: str, versions: tuple[tuple[str, int], ...]):
    return open_history(store, dict(versions))


def fleet(
    project: str | None = None,
    status: str | None = None,
    family: str | None = None,
    window_s: float | None = None,
) -> list[dict[str, Any]]:
    """The fleet table's rows, most urgent first (see :func:`queries.fleet`)."""
    store = store_path()
    return _fleet(store, _versions(store), project, status, family, window_s)


def run_ids() -> list[str]:
    return [r["run_id"] for r in fleet()]


def projects() -> list[str]:
    rows = fleet()
    return sorted({r["project"] for r in rows if r["project"]})


def run_ranks(run_id: str) -> list[int]:
    """The ranks that wrote the run (several in per-rank mode: each its own series)."""
    store = store_path()
    return _run_ranks(store, _versions(store), run_id)


def run_page(
    run_id: str,
    metrics: tuple[str, ...],
    heads: bool = False,
    max_points: int = 1000,
    rank: int | None = None,
) -> dict[str, Any]:
    """Everything the run page draws, from one snapshot; the series of one rank (``rank``,
    else the run's lowest)."""
    store = store_path()
    return _run_page(store, _versions(store), run_id, metrics, heads, max_points, rank)


def compare(run_ids: tuple[str, ...], metric: str) -> dict[str, Any]:
    store = store_path()
    return _compare(store, _versions(store), run_ids, metric)


@st.cache_data(ttl=TTL, show_spinner=False)
def _fleet(
    store: str,
    versions: tuple,
    project: str | None,
    status: str | None,
    family: str | None,
    window_s: float | None,
) -> list[dict[str, Any]]:
    since = None if window_s is None else time.time() - window_s  # moves: cached for TTL only
    with _pinned(store, versions) as history:
        return queries.fleet(history, project, status, family, since)


@st.cache_data(ttl=KEEP, show_spinner=False, max_entries=256)
def _run_ranks(store: str, versions: tuple, run_id: str) -> list[int]:
    with _pinned(store, versions) as history:
        return queries.run_ranks(history, run_id)


@st.cache_data(ttl=KEEP, show_spinner=False, max_entries=256)
def _run_page(
    store: str,
    versions: tuple,
    run_id: str,
    metrics: tuple[str, ...],
    heads: bool,
    max_points: int,
    rank: int | None = None,
) -> dict[str, Any]:
    with _pinned(store, versions) as history:
        summary = queries.summary(history, run_id)
        if summary is None:
            return {"summary": None}
        names = {m: PER_HEAD.get(m, m) if heads else m for m in metrics}
        per_module = [n for n in names.values() if n not in PER_HEAD.values()]
        per_head = [n for n in names.values() if n in PER_HEAD.values()]
        lines = queries.series_many(history, run_id, per_module, max_points=max_points, rank=rank)
        if per_head:
            lines |= queries.series_many(
                history, run_id, per_head, heads=True, max_points=max_points, rank=rank
            )
        series = {m: lines[n] for m, n in names.items()}
        losses = queries.series_many(history, run_id, ["loss"], max_points=max_points, rank=rank)
        loss = losses["loss"]
        return {
            "summary": summary,
            "warnings": queries.run_warnings(history, run_id),
            "actions": queries.run_actions(history, run_id),
            "loss": loss,
            "attempts": queries.run_attempts(history, run_id),
            "series": series,
        }


def rule_reach(run_id: str) -> tuple[str | None, dict[str, str]]:
    """The profile that judges ``run_id`` and what each of its rules takes to fire on it, in
    the run's units (:mod:`foreshock.detectors.reach`): its stored records replayed through
    the shipped profiles, as ``foreshock detect --replay`` of it would."""
    store = store_path()
    return _rule_reach(store, _versions(store), run_id)


@st.cache_data(ttl=KEEP, show_spinner=False, max_entries=64)
def _rule_reach(store: str, versions: tuple, run_id: str) -> tuple[str | None, dict[str, str]]:
    from foreshock.detectors.streams import RunStreams
    from foreshock.operate.detect_commands import default_config

    with _pinned(store, versions) as history:
        start, records, _ = queries.run_records(history, run_id)
    streams = RunStreams(run_id, default_config())
    for message in [{**(start or {}), "kind": "start"}, *records]:
        streams.update(message)
    return (streams.profile.name if streams.ranks else None), streams.reach


@st.cache_data(ttl=KEEP, show_spinner=False, max_entries=64)
def _compare(
    store: str,
    versions: tuple,
    run_ids: tuple[str, ...],
    metric: str,
) -> dict[str, Any]:
    with _pinned(store, versions) as history:
        lines = queries.series_across_runs(history, list(run_ids), metric)
        leads = [r for r in queries.lead_table(history) if r["run_id"] in run_ids]
    return {"lines": lines, "leads": leads}


def live_config() -> tuple[str | None, list[dict[str, Any]]]:
    """(live detector config version, registry history) — small files, not cached."""
    from foreshock.detectors import registry

    root = store_path()
    try:
        return registry.live_version(root), registry.history(root)
    except (OSError, ValueError):
        return None, []


def tune_reports() -> dict[str, dict[str, Any]]:
    """version -> the tune report that chose it, newest first."""
    folder = Path(store_path()) / "detector-configs"
    paths = sorted(folder.glob("*.tune.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return {p.name.removesuffix(".tune.json"): json.loads(p.read_text()) for p in paths}


def profiles() -> dict[str, Any]:
    """The Profiles page: per model, its runs, the profile in force and its lineage, stated
    and measured false-warning rates, the rules that can fire; candidates and the policy."""
    store = store_path()
    return _profiles(store, _versions(store))


@st.cache_data(ttl=KEEP, show_spinner=False, max_entries=8)
def _profiles(store: str, versions: tuple) -> dict[str, Any]:
    from foreshock.operate import profile_builder as pb
    from foreshock.operate.profile_groups import by_signature, fleet_runs

    in_force, lineage = pb.in_force(store), pb.lineage(store)
    models = []
    for group in by_signature(fleet_runs(store)):
        name = pb.profile_of_group(in_force, group)
        config = in_force.configs[name] if name else in_force.fallback_choice("").config
        published = [e for e in lineage if e["profile"] == name and e["action"] == "published"]
        models.append(
            {
                "model": group.label,
                "runs": [(r.run_id, r.verdict) for r in group.runs],
                "healthy": len(group.healthy),
                "faults": len(group.faults),
                "profile": name or in_force.fallback,
                "shipped": name is not None and not published,
                "lineage": published[-1] if published else None,
                "switched": [
                    e["run_id"]
                    for e in lineage
                    if e["profile"] == name and e["action"] == "switched"
                ],
                "stated": config.false_alarm,
                "rules": [
                    (r.metric, r.family, r.kind, config.thresholds.get(r.metric))
                    for r in config.rules
                ],
            }
        )
    pending = [c.name for c in pb.candidates(store) if c.status == pb.PENDING]
    return {"models": models, "pending": pending, "policy": pb.policy(store)}
