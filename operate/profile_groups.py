"""A store's finished runs, grouped by model, each judged healthy or not: what a profile of
that model could be calibrated from.

Why here and not in the labels: a fleet's runs carry no ``scenario`` label. What the store
knows is whether a run ended, whether its loss diverged (the producer's step, else the
detectors'), and whether a person confirmed one of its mechanism warnings (acknowledged it:
:mod:`foreshock.storage.acks`). So a run is **healthy** when

    it ended  ∧  it did not diverge  ∧  no person acknowledged a mechanism warning of it.

A warning nobody acknowledged does not make a run unhealthy: under the zero-shot profile a
healthy run may warn falsely, and leaving such runs out would calibrate the new profile on
the quietest runs only (its thresholds too low). A silenced warning is a person's "noise".

Runs are grouped by architecture signature (:func:`~foreshock.detectors.signatures.same_model`:
every field equal); a run that sent none belongs to no group. Recipes are not split here: a
profile records the recipes of the runs it was calibrated on (``make_profile.recipes_of``), and
a later run of another recipe is judged by the fallback's rules (:mod:`.profiles`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from foreshock.catalogue import MECHANISMS
from foreshock.detectors.signatures import describe, same_model, signature_of

__all__ = ["FleetRun", "SignatureGroup", "by_signature", "fleet_runs", "load_replayable"]


@dataclass(frozen=True)
class FleetRun:
    """One stored run as the profile builder sees it."""

    run_id: str
    start: dict[str, Any]
    ended: bool
    divergence_step: int | None
    confirmed: tuple[str, ...] = ()  # ids of its mechanism warnings a person acknowledged

    @property
    def signature(self) -> dict[str, Any] | None:
        return signature_of(self.start)

    @property
    def scenario(self) -> str | None:
        """Its ``scenario`` label, where it has one (the lab's runs do; a fleet's may not)."""
        found = (self.start.get("labels") or {}).get("scenario")
        return found if isinstance(found, str) else None

    @property
    def healthy(self) -> bool:
        return self.ended and self.divergence_step is None and not self.confirmed

    @property
    def faulty(self) -> bool:
        """Ended and known bad: diverged, or a person confirmed a mechanism warning."""
        return self.ended and not self.healthy

    @property
    def verdict(self) -> str:
        """Why the run counts as it does, in words."""
        if not self.ended:
            return "running"
        if self.divergence_step is not None:
            return f"diverged at step {self.divergence_step}"
        if self.confirmed:
            return f"a person confirmed warning {self.confirmed[0]}"
        return "healthy"


@dataclass
class SignatureGroup:
    """The runs of one model (one architecture signature)."""

    signature: dict[str, Any]
    runs: list[FleetRun] = field(default_factory=list)

    @property
    def label(self) -> str:
        return describe(self.signature)

    @property
    def healthy(self) -> list[FleetRun]:
        return [r for r in self.runs if r.healthy]

    @property
    def faults(self) -> list[FleetRun]:
        return [r for r in self.runs if r.faulty]

    @property
    def running(self) -> list[FleetRun]:
        return [r for r in self.runs if not r.ended]


def fleet_runs(root: Any) -> list[FleetRun]:
    """Every run the store holds a start of, oldest first, with what makes it healthy."""
    from foreshock.storage import acks, queries
    from foreshock.storage.reader import open_history

    try:
        with open_history(root) as history:
            starts = queries.run_starts(history)
            states = acks.warning_states(history)
    except (ValueError, FileNotFoundError):  # no tables yet: an empty store
        return []
    confirmed: dict[str, list[str]] = {}
    for warning in states:
        if warning["family"] in MECHANISMS and warning["acknowledged_by"]:
            confirmed.setdefault(warning["run_id"], []).append(warning["id"])
    return [
        FleetRun(
            row["run_id"],
            row["start"],
            row["ended"],
            row["divergence_step"],
            tuple(confirmed.get(row["run_id"], ())),
        )
        for row in starts
    ]


def by_signature(runs: list[FleetRun]) -> list[SignatureGroup]:
    """The runs grouped by model, in the order each model was first seen; runs with no
    signature are left out (no profile can be made for them)."""
    groups: list[SignatureGroup] = []
    for run in runs:
        signature = run.signature
        if signature is None:
            continue
        group = next((g for g in groups if same_model(g.signature, signature)), None)
        if group is None:
            group = SignatureGroup(signature)
            groups.append(group)
        group.runs.append(run)
    return groups


@dataclass(frozen=True)
class Replayable:
    """A stored run as the wire messages the detectors replay (``replay.replay_run``)."""

    run_id: str
    start: dict[str, Any]
    records: list[dict[str, Any]]
    end: dict[str, Any] | None
    actions: list[dict[str, Any]]


def load_replayable(root: Any, run_ids: list[str]) -> dict[str, Replayable]:
    """The runs' messages, read from one snapshot of the store."""
    from foreshock.storage import queries
    from foreshock.storage.reader import open_history

    out = {}
    with open_history(root) as history:
        for run_id in run_ids:
            start, records, end = queries.run_records(history, run_id)
            actions = queries.run_actions(history, run_id)
            out[run_id] = Replayable(
                run_id, {**(start or {}), "run_id": run_id}, records, end, actions
            )
    return out
