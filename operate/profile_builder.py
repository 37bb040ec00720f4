"""Profiles that build themselves: once a model has enough healthy runs in the store, a
profile of it is calibrated, judged, and published (or held for a person to approve).

Why: the zero-shot profile judges a model no profile knows, and holds across architectures
by being loose; a profile of the model itself leads further (``docs/detectors.md``). Its
runs accumulate in the store anyway, so nobody should have to notice when there are enough.

**When.** A model (:mod:`.profile_groups`: runs grouped by architecture signature) gets a
candidate when no shipped or published profile fits its signature, no candidate of it waits
for approval, and it has ``HEALTHY_RUNS_NEEDED`` = ``make_profile.MIN_HEALTHY_RUNS`` (10,
measured by ``benchmarks.profile_size``) healthy runs — more than the last rejected
candidate was made of, if one was rejected.

**How it is made and judged.** The candidate is ``make_profile`` on all the healthy runs
(bands, thresholds with leave-one-out margins, the optimizer test; their recipes recorded).
It is judged with :func:`~foreshock.detectors.judge.judge`:

* measured false-warning rate, per mechanism family f: the share of healthy runs that raise
  a warning of f when judged by a profile calibrated on the *other* healthy runs
  (leave-one-out, so no run judges the thresholds it set) — beside the stated rate
  ``false_alarm[f]`` = |rules of f|·k/(n+1), the conformal bound (:mod:`.calibrate`);
* each fault run of the model in the store (diverged, or a mechanism warning a person
  acknowledged): warned before divergence or not, lead [steps], and whether the first
  mechanism warning named the right cause (its ``scenario`` label's, where it has one).

**Where it goes.** Under the policy ``auto`` the candidate is published into the store's
profiles (:func:`~foreshock.detectors.profiles.save_profile`), by ``auto``; under ``approve``
(the default: a new profile changes what warns) it waits in ``candidates/`` until
``foreshock profiles approve NAME`` (by that person) or ``reject``; ``off`` builds nothing.
Every step appends a line to the profiles' ``lineage.jsonl`` (time, profile, version, action,
by, the calibration runs, the judged figures): where a profile came from, for the dashboard;
so does every live run a worker switched to a published profile (action ``switched``).

    <store>/detector-configs/profile-builder/policy.json      {"policy", "by", "time"}
    <store>/detector-configs/profile-builder/candidates/<name>.json
    <store>/detector-configs/profiles/lineage.jsonl          append-only

A detector worker started with ``--store`` runs :func:`build` a while after runs end
(:mod:`.worker`) and loads what it published for the runs that start after it.
"""

from __future__ import annotations

import getpass
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from foreshock.catalogue import MECHANISMS
from foreshock.detectors.judge import judge
from foreshock.detectors.make_profile import MIN_HEALTHY_RUNS, make_profile, recipes_of
from foreshock.detectors.profiles import (
    ProfileConfigs,
    load_profiles,
    merged,
    save_profile,
    shipped_profiles,
)
from foreshock.detectors.registry import REGISTRY, profiles_folder
from foreshock.detectors.replay import replay_run
from foreshock.detectors.signatures import same_model

from .profile_groups import SignatureGroup, by_signature, fleet_runs, load_replayable

__all__ = [
    "DEFAULT_POLICY",
    "HEALTHY_RUNS_NEEDED",
    "POLICIES",
    "BuildReport",
    "Candidate",
    "approve",
    "build",
    "build_profiles",
    "candidates",
    "in_force",
    "lineage",
    "policy",
    "profile_name",
    "profile_of_group",
    "record_switch",
    "reject",
    "set_policy",
]

HEALTHY_RUNS_NEEDED = MIN_HEALTHY_RUNS
POLICIES = ("auto", "approve", "off")
DEFAULT_POLICY = "approve"
BUILDER, CANDIDATES, POLICY_FILE, LINEAGE = (
    "profile-builder",
    "candidates",
    "policy.json",
    ("lineage.jsonl"),
)
PENDING, PUBLISHED, REJECTED = "pending", "published", "rejected"
log = logging.getLogger(__name__)


class BuilderError(ValueError):
    """A request the builder refuses (unknown candidate, bad policy...), with why."""


@dataclass
class Candidate:
    """A profile built from the store's runs, with where it came from and how it judged."""

    name: str
    config: Any  # DetectorConfig
    signatures: list[dict[str, Any]]
    recipes: list[dict[str, Any]]
    runs: list[str]  # the healthy runs it was calibrated on
    judged: dict[str, Any]
    built_at: float
    status: str = PENDING
    decided_by: str | None = None
    decided_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        config = {**self.config.to_dict(), "version": self.config.version}
        return {**vars(self), "config": config}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        from foreshock.detectors.config import DetectorConfig

        config = {k: v for k, v in data["config"].items() if k != "version"}
        return cls(**{**data, "config": DetectorConfig.from_dict(config)})


@dataclass
class BuildReport:
    """What one :func:`build` did, per model, and which stored runs had ended."""

    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (model, what happened)
    ended: set[str] = field(default_factory=set)
    published: list[str] = field(default_factory=list)


def policy(root: Any) -> str:
    """The store's policy: ``auto``, ``approve`` (default) or ``off``."""
    text = _builder(root).read_text(POLICY_FILE)
    return json.loads(text)["policy"] if text else DEFAULT_POLICY


def set_policy(root: Any, value: str, by: str | None = None) -> None:
    if value not in POLICIES:
        raise BuilderError(f"policy {value!r}: expected one of {', '.join(POLICIES)}")
    entry = {"policy": value, "by": by or getpass.getuser(), "time": time.time()}
    _builder(root).write_text(POLICY_FILE, json.dumps(entry))


def profile_name(signature: dict[str, Any]) -> str:
    """A readable name for a profile of ``signature``, never a shipped profile's.

    >>> profile_name({"model_type": "llama", "layers": 2, "hidden": 128, "dispatch": None})
    'llama-l2-d128'
    """
    s = signature
    name = f"{s.get('model_type') or 'model'}-l{s.get('layers')}-d{s.get('hidden')}"
    if s.get("dispatch") not in (None, "dropless"):
        name += f"-{s['dispatch']}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    return name if name not in shipped_profiles().configs else f"{name}-own"


def in_force(root: Any) -> ProfileConfigs:
    """The shipped profiles and those published into the store (a later one of a name wins)."""
    return merged(shipped_profiles(), load_profiles(profiles_folder(root)))


def profile_of_group(profiles: ProfileConfigs, group: SignatureGroup) -> str | None:
    """The profile whose signatures include the group's model (the last published first)."""
    for name in reversed(list(profiles.signatures)):
        if name in profiles.configs and any(
            same_model(group.signature, s) for s in profiles.signatures[name]
        ):
            return name
    return None


def build(root: Any, chosen: str | None = None, now: float | None = None) -> BuildReport:
    """Build a candidate for every model that needs one (see the module docstring); publish
    it under ``auto``. ``chosen``: the policy for this call (default: the store's)."""
    report = BuildReport()
    runs = fleet_runs(root)
    report.ended = {r.run_id for r in runs if r.ended}
    rule = chosen or policy(root)
    if rule == "off":
        return report
    with _builder(root).lock():
        profiles, waiting = in_force(root), candidates(root)
        for group in by_signature(runs):
            why = _why_not(group, profiles, waiting)
            if why:
                report.outcomes.append((group.label, why))
                continue
            candidate = _make(root, group, now)
            if rule == "auto":
                _publish(root, candidate, "auto")
                report.published.append(candidate.name)
                report.outcomes.append((group.label, f"published {candidate.name}"))
            else:
                _save(root, candidate)
                _log(root, candidate, "built", "auto", f"awaiting approval ({rule})")
                report.outcomes.append((group.label, f"candidate {candidate.name} awaits approval"))
    return report


def build_profiles(root: Any) -> set[str]:
    """:func:`build` under the store's policy, logged; the ids of the runs stored as ended
    (the detector worker's hook: :class:`~foreshock.detectors.worker.WorkerConfig`)."""
    report = build(root)
    for model, what in report.outcomes:
        if not what.startswith("has profile"):
            log.info("foreshock profiles: %s: %s", model, what)
    return report.ended


def _why_not(group: SignatureGroup, profiles: ProfileConfigs, waiting: list[Candidate]) -> str:
    """Why the group gets no candidate now ("" when it does)."""
    found = profile_of_group(profiles, group)
    if found is not None:
        return f"has profile {found}"
    mine = [c for c in waiting if any(same_model(group.signature, s) for s in c.signatures)]
    if any(c.status == PENDING for c in mine):
        return "a candidate awaits approval"
    n = len(group.healthy)
    rejected = max((len(c.runs) for c in mine if c.status == REJECTED), default=0)
    if n < HEALTHY_RUNS_NEEDED:
        return f"{n} of {HEALTHY_RUNS_NEEDED} healthy runs"
    if n <= rejected:
        return f"a candidate of {rejected} healthy runs was rejected; waiting for more"
    return ""


def _make(root: Any, group: SignatureGroup, now: float | None) -> Candidate:
    """Calibrate on the group's healthy runs and judge (the module docstring)."""
    ids = [r.run_id for r in group.healthy]
    faults = group.faults
    loaded = load_replayable(root, ids + [r.run_id for r in faults])
    healthy = [loaded[i] for i in ids]
    config, signatures = make_profile(healthy, replay_run)
    name = profile_name(group.signature)
    judged = {
        "healthy_runs": len(healthy),
        "stated_false_warning_rate": {
            f: r for f, r in config.false_alarm.items() if f in MECHANISMS
        },
        "measured_false_warning_rate": _left_out_rates(healthy, name),
        "faults": [
            _judge_fault(loaded[r.run_id], r.scenario, name, config, signatures) for r in faults
        ],
    }
    return Candidate(name, config, signatures, recipes_of(healthy), ids, judged, now or time.time())


def _left_out_rates(healthy: list[Any], name: str) -> dict[str, float]:
    """Per mechanism family, the share of healthy runs that warn when judged by a profile
    calibrated on the others."""
    warned = dict.fromkeys(MECHANISMS, 0)
    for i, run in enumerate(healthy):
        others = healthy[:i] + healthy[i + 1 :]
        config, signatures = make_profile(others, replay_run, allow_few=True)
        report = replay_run(run, ProfileConfigs({name: config}, {name: signatures}))
        verdict = judge("healthy", report.divergence_step, report.alerts)
        for family, count in verdict.false_warnings.items():
            warned[family] += count > 0
    return {f: round(w / len(healthy), 4) for f, w in warned.items()}


def _judge_fault(run: Any, scenario: str | None, name: str, config: Any, signatures: Any) -> dict:
    """A fault run judged by the candidate (its ``scenario`` label; none: any mechanism)."""
    report = replay_run(run, ProfileConfigs({name: config}, {name: signatures}))
    verdict = judge(scenario or "unknown", report.divergence_step, report.alerts)
    return {
        "run_id": run.run_id,
        "scenario": scenario,
        "detected": verdict.detected,
        "lead": verdict.lead(),
        "cause": verdict.cause,
        "attribution": verdict.attribution,
    }


def candidates(root: Any) -> list[Candidate]:
    """Every candidate kept (pending, published or rejected), oldest first."""
    files = _builder(root).child(CANDIDATES)
    found = [
        Candidate.from_dict(json.loads(files.read_text(n) or "{}"))
        for n in files.names()
        if n.endswith(".json")
    ]
    return sorted(found, key=lambda c: c.built_at)


def approve(root: Any, name: str, by: str | None = None) -> Candidate:
    """Publish the pending candidate ``name``, approved by ``by`` (default: this user)."""
    with _builder(root).lock():
        candidate = _pending(root, name)
        _publish(root, candidate, by or getpass.getuser())
    return candidate


def reject(root: Any, name: str, by: str | None = None, note: str = "") -> Candidate:
    """Set the pending candidate ``name`` aside; the model is built again once it has more
    healthy runs than this candidate was made of."""
    with _builder(root).lock():
        candidate = _pending(root, name)
        _decide(candidate, REJECTED, by or getpass.getuser())
        _save(root, candidate)
        _log(root, candidate, REJECTED, candidate.decided_by or "", note)
    return candidate


def record_switch(root: Any, event: dict[str, Any]) -> None:
    """A live run moved to a published profile (:mod:`.profile_switch`), in the lineage."""
    entry = {"time": time.time(), "by": "detector worker", **event, "profile": event["to_profile"]}
    profiles_folder(root).append_line(LINEAGE, json.dumps(entry))


def lineage(root: Any) -> list[dict[str, Any]]:
    """Every line of the profiles' lineage, oldest first."""
    text = profiles_folder(root).read_text(LINEAGE) or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _pending(root: Any, name: str) -> Candidate:
    found = {c.name: c for c in candidates(root)}
    if name not in found or found[name].status != PENDING:
        pending = [c.name for c in found.values() if c.status == PENDING]
        state = f" (it is {found[name].status})" if name in found else ""
        raise BuilderError(
            f"no pending candidate {name!r}{state}; pending: {', '.join(pending) or 'none'}"
        )
    return found[name]


def _publish(root: Any, candidate: Candidate, by: str) -> None:
    folder = profiles_folder(root)
    save_profile(folder, candidate.name, candidate.config, candidate.signatures, candidate.recipes)
    _decide(candidate, PUBLISHED, by)
    _save(root, candidate)
    _log(root, candidate, PUBLISHED, by, "")


def _decide(candidate: Candidate, status: str, by: str) -> None:
    candidate.status, candidate.decided_by, candidate.decided_at = status, by, time.time()


def _save(root: Any, candidate: Candidate) -> None:
    files = _builder(root).child(CANDIDATES)
    files.write_text(f"{candidate.name}.json", json.dumps(candidate.to_dict(), indent=1))


def _log(root: Any, candidate: Candidate, action: str, by: str, note: str) -> None:
    entry = {
        "time": time.time(),
        "profile": candidate.name,
        "version": candidate.config.version,
        "action": action,
        "by": by,
        "note": note,
        "runs": candidate.runs,
        "judged": candidate.judged,
    }
    profiles_folder(root).append_line(LINEAGE, json.dumps(entry))


def _builder(root: Any) -> Any:
    from foreshock.storage.store_files import StoreFiles

    return StoreFiles(root, REGISTRY).child(BUILDER)
