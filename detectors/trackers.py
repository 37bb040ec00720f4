"""What the trainer's own loggers show of a monitored run: the mechanism series, one scalar per
metric, and the warnings of detectors run in the trainer process.

People watch the loss in W&B, TensorBoard or MLflow; a warning that reaches only a Kafka topic
and foreshock's dashboard is one more place nobody looks. So both callbacks hand each monitoring
record to a :class:`TrackerFeed` and write the :class:`TrackerUpdate` it returns through the
loggers the trainer already has (HF's ``report_to`` callbacks, Lightning's ``trainer.loggers``):
no extra setup, and foreshock's curves sit next to the loss.

**Warnings are produced in-process.** A :class:`~foreshock.detectors.engine.RunDetector` — the
torch-free code of the live detector worker and of ``foreshock detect --replay`` — reads the
records the Monitor writes, in order. Consuming the warnings topic instead would tie the trainer
to a broker and a running detector service, add a consumer and its latency to every rank-0
process, and show nothing offline; reading the records here costs a few hundred scalar updates
per monitoring step. With the same detector config its warnings are the service's (the state is
a function of the records; the ids are deterministic). A service running a tuned live config
(``foreshock tune``) may warn differently: every warning names its ``config_version``.

**Volume.** A model has tens of layers with several series each; a tracker gets one scalar per
mechanism metric: its worst layer, in the direction the detectors watch for failure (the
minimum of the spectral and routing entropies, the maximum of the largest attention logit and
of the dropped fraction, both extremes of router ε). Per-layer and per-head series stay in
foreshock's own records. The keys (``foreshock/`` first, so they group together):

* ``foreshock/<metric>/<min|max>``, e.g. ``foreshock/attn.d2.entropy_mean/min``,
  ``foreshock/max_logit/max``, ``foreshock/router.token_entropy_norm/min``;
* with the detectors on, at every monitoring step: ``foreshock/warnings_open/<family>``, the
  warnings of the family open (0 while calm; also at the step of a remedy's action that
  resolved one, :meth:`TrackerFeed.note`); and at the records where something happened,
  ``foreshock/warning/<family>``, the warnings of the family that opened there, and
  ``foreshock/lead/<family>``, the largest lead (steps before the loss diverged) once a
  divergence gives the family's warnings one;
* each event (opened, cleared, lead known) as text where the tracker takes text: the
  ``foreshock/warning`` text series (TensorBoard; W&B through HF's ``report_to``), and an
  MLflow tag ``foreshock.warning.<step>.<family>.<module>`` per warning. Opened warnings are
  also logged (``foreshock.integrations``, WARNING) to the trainer's console.

Steps in the texts are foreshock's: the 0-based index of the optimizer update (the Trainer
plots update ``s`` at ``s + 1``; Lightning at ``s``).
"""

from __future__ import annotations

import logging
import pickle
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from foreshock.detectors.config import BAND_RULES, DEFAULT_RULES, FAMILIES, MECHANISMS
from foreshock.detectors.engine import RunDetector
from foreshock.transport.records import parse_series_key

if TYPE_CHECKING:
    from foreshock.detectors.config import DetectorConfig
    from foreshock.detectors.profiles import ProfileConfigs
    from foreshock.transport.warning import RunWarning

__all__ = [
    "AGGREGATES",
    "TEXT_KEY",
    "InProcessDetector",
    "TrackerFeed",
    "TrackerUpdate",
    "aggregate",
    "describe",
]

log = logging.getLogger("foreshock.integrations")

PREFIX = "foreshock/"
TEXT_KEY = "foreshock/warning"  # the text series of the warning events


def _aggregates() -> dict[str, tuple[str, ...]]:
    """metric -> how its layers combine: toward the failure the detectors' rules watch for."""
    how = {"down": ("min",), "up": ("max",), "both": ("min", "max")}
    return {
        rule.metric: how[rule.direction]
        for rule in (*DEFAULT_RULES, *BAND_RULES)
        if rule.family in MECHANISMS
    }


AGGREGATES: dict[str, tuple[str, ...]] = _aggregates()


def aggregate(values: Mapping[str, Any]) -> dict[str, float]:
    """One scalar per mechanism metric from a record's ``values``: its worst module.

    >>> aggregate({"max_logit@h.0.attn": 3.0, "max_logit@h.1.attn": 9.0,
    ...            "attn.d2.entropy_mean@h.0.attn": 0.5, "attn.d2.entropy_mean@h.1.attn": None,
    ...            "attn.d2.entropy@h.0.attn#h1": 0.1, "loss": 2.0})
    {'foreshock/max_logit/max': 9.0, 'foreshock/attn.d2.entropy_mean/min': 0.5}
    """
    found: dict[str, list[float]] = {}
    for key, value in values.items():
        if not isinstance(value, int | float) or value != value:
            continue  # null (non-finite) values are flagged in the record, not plotted
        try:
            metric, _, head = parse_series_key(key)
        except ValueError:
            continue
        if head is None and metric in AGGREGATES:
            found.setdefault(metric, []).append(float(value))
    return {
        f"{PREFIX}{metric}/{how}": (min if how == "min" else max)(xs)
        for metric, xs in found.items()
        for how in AGGREGATES[metric]
    }


def describe(event: RunWarning) -> str:
    """One line a person reads in a tracker: what, where, when, how sure, what to check."""
    where = f" at {event.module}" if event.module else ""
    head = f"foreshock {event.family} warning{where} (step {event.step}, {event.role})"
    if event.event == "cleared":
        return f"{head} cleared at step {event.cleared_step}"
    lead = "lead unknown"
    if event.lead_time is not None:
        lead = f"lead {event.lead_time} steps: the loss diverged at step {event.divergence_step}"
    if event.event == "updated":
        return f"{head}: {lead}"
    check = event.evidence.get("check")
    return (
        f"{head}: {event.series} {event.direction}, statistic {event.statistic:g} > "
        f"{event.threshold:g}; {lead}" + (f". Check {check}" if check else "")
    )


def tag_key(event: RunWarning) -> str:
    """An MLflow tag key per warning (letters, digits, ``_-. /`` only; 250 characters)."""
    key = f"foreshock.warning.{event.step}.{event.family}.{event.module or 'run'}"
    return re.sub(r"[^0-9A-Za-z_\-. /]", "_", key)[:250]


@dataclass
class TrackerUpdate:
    """What the trackers get for one monitoring record (``step``: the record's)."""

    step: int
    scalars: dict[str, float]
    events: list[RunWarning] = field(default_factory=list)

    def text(self) -> str | None:
        """The events of this record as one text (Markdown paragraphs), None without any."""
        return "\n\n".join(describe(e) for e in self.events) or None

    def tags(self) -> dict[str, str]:
        """One tag per warning, its latest event (opened, then lead known, then cleared)."""
        return {tag_key(e): describe(e)[:5000] for e in self.events}


class InProcessDetector(RunDetector):
    """The service's detector, keeping no records: in one training process every record is of
    one attempt, so there is no resume to replay (a restarted process starts a new feed); the
    service keeps the last 5,000 of them, which for a model of many layers is gigabytes.

    What it keeps instead, where the remedies may roll back (``keep_states``): its state at
    each of the last ``n`` marks (``mark``: a pickle of tens of kB), which the remedies set
    when the weight ring takes a snapshot before step r — a rollback only ever goes to a ring
    step. So a rollback to r restores the state before the first record at or after r, what
    the service rebuilds from its records, rather than starting from nothing; and the cost is
    one pickle per snapshot, not one per record."""

    MAX_REPLAY = 0

    def keep_states(self, n: int) -> None:
        self._states: deque[tuple[int, bytes]] = deque(maxlen=n)

    def mark(self, step: int) -> None:
        """Keep the state now, before training step ``step`` (no record of it or later read
        yet): where a rollback to ``step`` returns the detectors. A no-op unless kept."""
        kept = getattr(self, "_states", None)
        if kept is not None:
            kept.append((step, pickle.dumps(self._snapshot())))

    def _resume(self, step: int) -> None:
        """Back to just before ``step`` (a rollback: the only way back in one process)."""
        kept = getattr(self, "_states", None) or deque()
        later = [(s, blob) for s, blob in kept if s >= step]
        if not later:  # nothing kept that far back: from nothing, logged
            return super()._resume(step)
        chosen, blob = min(later)
        self._reset()
        vars(self).update(pickle.loads(blob))
        # the mark restored stays: the weights' snapshot of that step does too
        self._states = deque(((s, b) for s, b in kept if s <= chosen), kept.maxlen)


class TrackerFeed:
    """A run's records in, :class:`TrackerUpdate` out; never raises into the training loop.

    warnings: ``True`` runs the detectors in-process with the shipped calibrated profiles
              (each run gets the one its labels name, as in the service); a ``DetectorConfig``
              or ``ProfileConfigs`` runs them with that; ``False`` sends the series only.
    """

    def __init__(self, warnings: bool | DetectorConfig | ProfileConfigs = True) -> None:
        self.warnings = warnings
        self.detector: InProcessDetector | None = None
        self.open: dict[str, int] = {}  # family -> its open warnings

    def start(
        self,
        run_id: str | None,
        labels: Mapping[str, Any],
        signature: Mapping[str, Any] | None = None,
    ) -> None:
        """Build the detector for the run: its profile chosen from ``labels`` and the model's
        architecture ``signature`` (``Monitor.signature()``) exactly as the detector worker
        chooses it from the run's ``start`` record (one chooser:
        :meth:`~foreshock.detectors.profiles.ProfileConfigs.choose`), and logged."""
        if self.warnings is False or self.warnings is None or run_id is None:
            return
        try:
            from foreshock.detectors.profiles import shipped_profiles

            config = shipped_profiles() if self.warnings is True else self.warnings
            self.detector = InProcessDetector(run_id, config)
            monitor = {"signature": dict(signature)} if signature else {}
            start = {"kind": "start", "run_id": run_id, "labels": dict(labels), "monitor": monitor}
            self.detector.update(start)
            profile = self.detector.profile
            log.info(
                "foreshock: run %s judged by profile %s (%s)", run_id, profile.name, profile.reason
            )
            self.open = dict.fromkeys(FAMILIES, 0)
        except Exception:
            self.detector = None
            log.warning(
                "foreshock: in-process warnings disabled, the detectors could not be built",
                exc_info=True,
            )

    def keep_states(self, marks: int) -> None:
        """Keep the detectors' state at each of the last ``marks`` marks, for a rollback
        (:class:`InProcessDetector`)."""
        if self.detector is not None:
            self.detector.keep_states(marks)

    def mark(self, step: int) -> None:
        """The weights were kept before training step ``step``: keep the detectors' state
        with them. Never raises (a failure is logged; a rollback then starts them afresh)."""
        if self.detector is not None:
            try:
                self.detector.mark(step)
            except Exception:
                log.warning("foreshock: the detectors' state could not be kept", exc_info=True)

    @property
    def uncalibrated(self) -> bool:
        """Whether the run is judged by the fallback profile (zero-shot): no profile was
        calibrated on its model."""
        if self.detector is None:
            return False
        fallback = getattr(self.detector._configs, "fallback", None)
        return self.detector.profile.name == fallback

    def profile_fields(self) -> dict[str, Any]:
        """For the run's ``end`` record: the profile the in-process detectors judged it by,
        and why ({} with the detectors off)."""
        if self.detector is None:
            return {}
        profile = self.detector.profile
        return {"profile": {"name": profile.name, "reason": profile.reason}}

    def update(self, record: Mapping[str, Any]) -> TrackerUpdate | None:
        """The scalars and warning events of a metrics record; None if it is not one."""
        try:
            step, values = int(record["step"]), record.get("values") or {}
            update = TrackerUpdate(step, aggregate(values))
        except Exception:
            log.debug("foreshock: not a metrics record for the trackers", exc_info=True)
            return None
        if self.detector is not None:
            try:
                update.events = self.detector.update({**record, "kind": "metrics"})
            except Exception:
                self.detector = None
                log.warning(
                    "foreshock: in-process warnings stopped, the detectors failed", exc_info=True
                )
                return update
            self._count(update)
        return update

    def note(self, record: Mapping[str, Any]) -> TrackerUpdate | None:
        """A record of the run that is not a monitoring one — an ``action`` record the trainer
        wrote — read by the detectors as the service reads it: an applied action resolves
        the open warning it names (``resolved_by: action``), so the open count drops now
        rather than when the statistic falls back, if ever. The cleared event and the open
        counts as an update at the record's step; None where it changed nothing. Never
        raises (a failure is logged; the detectors keep running)."""
        if self.detector is None:
            return None
        try:
            update = TrackerUpdate(int(record["step"]), {})
            update.events = self.detector.update(dict(record))
        except Exception:
            log.warning("foreshock: the detectors could not read a record", exc_info=True)
            return None
        if not update.events:
            return None
        self._count(update)
        return update

    def _count(self, update: TrackerUpdate) -> None:
        opened: dict[str, int] = {}
        leads: dict[str, int] = {}
        for event in update.events:
            family = event.family
            if event.event == "opened":
                self.open[family] = self.open.get(family, 0) + 1
                opened[family] = opened.get(family, 0) + 1
                log.warning("%s", describe(event))
            else:
                if event.event == "cleared":
                    self.open[family] = max(0, self.open.get(family, 0) - 1)
                log.info("%s", describe(event))
            if event.lead_time is not None:
                leads[family] = max(leads.get(family, 0), event.lead_time)
        scalars = update.scalars
        scalars.update({f"{PREFIX}warnings_open/{f}": float(n) for f, n in self.open.items()})
        scalars.update({f"{PREFIX}warning/{f}": float(n) for f, n in opened.items()})
        scalars.update({f"{PREFIX}lead/{f}": float(n) for f, n in leads.items()})
