"""One run's detectors: standardize each series, accumulate, warn, attribute, time the lead.

The same code runs live (the Kafka worker) and offline (``foreshock detect --replay``) on a
run's wire messages in seq order, returning events; per rank where the run was written per
rank (:mod:`foreshock.detectors.streams`).

* Each configured series (e.g. ``attn.d2.entropy_mean@h.0.attn``: :mod:`.series`) is read
  against the run's own warm-up and fed, per direction, to a one-sided CUSUM of its residual
  from its own trend (``cusum`` rules: a change in rate) or to a sustained-level test of its
  log ratio to the warm-up level (``level`` rules: a slide too far).
* A family fires for a module when one of its series' statistics has stayed above that
  metric's calibrated threshold h for ``confirm`` records in a row; one warning stays open
  per (run, family, module) until its statistics stayed below h for ``release`` records in a
  row (hysteresis), the run ended (every rank sent its ``end``: nothing else would close it)
  or the trainer acted on it (an applied ``action`` record naming it:
  :mod:`~foreshock.detectors.action_records`); then a ``cleared`` event whose
  ``evidence.resolved_by`` says which: ``"statistic"``, ``"run ended"`` or ``"action"``.
* Attribution is earned, not assumed (:mod:`~foreshock.detectors.attribution`): the first
  mechanism family to fire is the ``cause`` when the other is calm at that record (each of
  its sustained statistics below ``calm_ratio`` × h), ``optimizer`` when every weight grew
  first (:mod:`~foreshock.detectors.inflation`); the other family's later warnings are
  ``secondary``; both crossing on one record make every mechanism warning ``ambiguous`` (a
  record is read whole first: the order of its values never decides). Symptoms: ``symptom``.
* The loss divergence (:mod:`foreshock.detectors.divergence`, or the run's own
  ``end.divergence_step``) gives each warning its lead time, an ``updated`` event once known.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from foreshock.transport.attempt_guard import AttemptGuard
from foreshock.transport.records import MetricsRecord
from foreshock.transport.warning import EventKind, RunWarning

from .action_records import resolution
from .attribution import cause_of, role
from .bands import INFLATION_METRIC
from .collisions import Collisions
from .config import MECHANISMS, OPTIMIZER_TEST, DetectorConfig
from .divergence import LossDivergence
from .inflation import WeightInflation
from .kinds import Detector
from .profiles import ProfileConfigs, choose_profile
from .rewind import Rewind, restore
from .schedule_clock import ScheduleClock, departure, settle_floor
from .series import Fired, Series, build_series
from .warning_facts import CHECK, alert_id, lead_of

__all__ = ["RunDetector"]

log = logging.getLogger(__name__)


class RunDetector:
    """Feed a run's messages in seq order with ``update``; read ``alerts`` and ``peaks``.

    **A resumed run is the same run; a stray job is not.** Attempts are ordered
    (:mod:`foreshock.transport.attempts`); a newer one takes over only as a resume or after
    the live one fell silent (:mod:`foreshock.transport.attempt_guard`); another newer one is
    a stray, skipped, with one ``collision`` warning (:mod:`.collisions`). On a takeover
    (``_follow``) every warning the old attempt left open is resolved (``resolved_by:
    superseded``); if the record goes back to a step already seen, the state is rebuilt as it
    was just before that step (:mod:`~foreshock.detectors.rewind`, exact within the last
    ``MAX_REPLAY`` records; further back it starts from nothing and logs it), and the warnings
    still open there are opened again under the new attempt's ids: what an uninterrupted run
    would hold. A message of an *older* attempt (a crashed job's spool flushed late) is
    counted (``ignored``) and left to the store.

    **One detector follows one rank** (:mod:`~foreshock.detectors.streams`): built with
    ``rank``, its warnings name it (in their ids too) once its records are per-rank records
    of a multi-process run, or the rank is not 0.
    """

    MAX_REPLAY = 5_000
    SNAPSHOT_EVERY = 250
    _HISTORY = ("alerts", "_open", "_calm", "cause", "peaks", "divergence_step", "last_step")

    def __init__(
        self, run_id: str, config: DetectorConfig | ProfileConfigs, rank: int | None = None
    ) -> None:
        self.run_id, self._configs, self.rank = run_id, config, rank
        self._named = rank is not None and rank != 0  # the warnings name the rank
        self.profile = choose_profile(config, None)  # until the run's start record says
        self.config = self.profile.config
        self._rewind = Rewind(self.MAX_REPLAY, self.SNAPSHOT_EVERY)
        self._attempt: int | None = None
        self._id_attempt: int | None = None  # in new warnings' ids once the run resumed
        self._replaying = False
        self.resumes: list[tuple[int, int]] = []  # (attempt, step it resumed at)
        self.ignored = 0  # records of a superseded attempt (a crashed job's late spool)
        self._guard = AttemptGuard()  # which attempt is followed (not rewound by a resume)
        self.collisions = Collisions(run_id, rank)  # stray attempts: skipped, warned once
        self._ranks: set[int] = set()  # ranks that wrote and have not ended
        before = set(vars(self))
        self._reset()
        self._state = tuple(sorted(set(vars(self)) - before))  # what a snapshot holds

    def _reset(self) -> None:
        """Every piece of state a run's records build (not its config or kept records)."""
        self._series: dict[str, Series] = {}
        self._ignored: set[str] = set()  # series keys no rule reads
        self.unruled: dict[str, str] = {}  # module-level metric no rule reads -> why
        self._open: dict[tuple[str, str | None], RunWarning] = {}
        self._calm: dict[tuple[str, str | None], int] = {}  # records every statistic was below h
        self.alerts: list[RunWarning] = []
        self.cause: str | None = None
        self.peaks: dict[str, float] = {}  # metric -> largest statistic (for calibration)
        self.divergence = LossDivergence()
        self.divergence_step: int | None = None
        self.last_step = -1
        self._inflation: WeightInflation | None = None  # the optimizer test, once armed
        self._clock = ScheduleClock()  # no series is read before the schedule's peak

    @property
    def open_alerts(self) -> list[RunWarning]:
        """The warnings open now (each closes only through the detector that opened it)."""
        return list(self._open.values())

    def superseded(self, message: dict[str, Any]) -> bool:
        """Is ``message`` one never followed: an older attempt's or a stray's?"""
        return self._guard.peek(message) in ("older", "stray")

    def update(self, message: dict[str, Any]) -> list[RunWarning]:
        kind = message.get("kind", "metrics")
        events: list[RunWarning] = []
        if kind == "action":  # it names its warning: whichever attempt or rank took it
            return self._on_action(message)
        verdict = "live" if self._replaying else self._guard.classify(message)
        if verdict == "older":
            self.ignored += 1
            return events
        if verdict == "stray":
            return self.collisions.stray(message, self._attempt, self.last_step)
        if kind != "end":
            self._ranks.add(int(message.get("rank") or 0))
        if kind == "metrics":
            events += self._on_metrics(message)
        elif kind == "start" and not self._series:
            self.profile = choose_profile(self._configs, message)
            self.config = self.profile.config
            self._inflation = None
        elif kind == "end":
            if message.get("divergence_step") is not None:
                events += self._diverged(int(message["divergence_step"]), exact=True)
            elif "divergence_step" in message:  # null: the producer's every-step rule says none
                events += self._not_diverged()
            self._ranks.discard(int(message.get("rank") or 0))
            if not self._ranks:
                ended = str(message.get("status") or "ended")
                events += self._clear(self.last_step, ended=ended)
                events += self.collisions.close(self.last_step, {"resolved_by": "run ended"})
        return events

    def _on_metrics(self, message: dict[str, Any]) -> list[RunWarning]:
        """A monitoring record (read as a ``MetricsRecord``; the run id is this detector's)."""
        record = MetricsRecord.from_message({"run_id": self.run_id, **message})
        if self.rank is not None and record.per_rank:
            self._named = True
        step, attempt = record.step, record.attempt or 0
        events: list[RunWarning] = []
        if attempt != self._attempt and self._attempt is not None and not self._replaying:
            events += self._follow(attempt, step)
        self._attempt = attempt
        self._rewind.keep(message, self._snapshot)
        self.last_step = max(self.last_step, step)
        values = record.values
        events += self._metrics(step, values)
        if "loss" in values:  # null is a non-finite loss (a divergence); absent is no news
            self.divergence.update(step, values["loss"])
        if self.divergence.divergence_step is not None:
            events += self._diverged(self.divergence.divergence_step)
        return events

    def _on_action(self, message: dict[str, Any]) -> list[RunWarning]:
        """An applied action resolves the open warning it names (kept with the records: a
        rebuild after a resume resolves it again). A rollback to step r rebuilds the series
        as they were before r, keeping what happened: the next records go on from the
        restored weights, not across the jump back (a weight trend fitted across it once
        read the regrowth as inflation: a false optimizer warning)."""
        why = resolution(message)
        if why is None:
            return []
        wanted = message.get("warning_id")
        key = next((k for k, alert in self._open.items() if alert.id == wanted), None)
        events: list[RunWarning] = []
        if key is not None:
            self._rewind.note(message)
            events = self._resolve(*key, int(message["step"]), why)
        if message.get("rolled_back_to") is not None and not self._replaying:
            kept = {name: getattr(self, name) for name in self._HISTORY}
            self._resume(int(message["rolled_back_to"]))
            vars(self).update(kept)
        return events

    def _follow(self, attempt: int, step: int) -> list[RunWarning]:
        """A newer attempt takes over at ``step`` (see the class docstring): resolve what the
        old one left open, rebuild the state below ``step`` if it goes back, and open again,
        as this attempt's, what is still open there."""
        why = {"resolved_by": "superseded", "superseded_by": attempt, "resumed_at": step}
        events = self._resolve_open(step, why)
        events += self.collisions.close(step, {"resolved_by": "took over"}, attempt)
        if step <= self.last_step:
            self._resume(step)
        self._id_attempt = attempt
        self.resumes.append((attempt, step))
        for key, alert in list(self._open.items()):
            again = replace(alert, id=self._alert_id(alert.family, alert.module, alert.step))
            again.cleared_step = None
            self._open[key] = again
            self.alerts[self.alerts.index(alert)] = again
            events.append(RunWarning(**asdict(again)))
        return events

    def _snapshot(self) -> dict[str, Any]:  # the state that a resume rebuilds from
        return {name: getattr(self, name) for name in self._state}

    def _resume(self, step: int) -> None:
        """Rebuild the state just before ``step`` from a snapshot and the kept records after
        it; their warnings, sent when the records first came, are not sent again."""
        snapshot, replay, exact = self._rewind.back_to(step)
        self._reset()
        vars(self).update(restore(snapshot))
        if not exact:
            log.warning(
                "foreshock detect: run %s resumed at step %d, before the %d records kept to "
                "rebuild from: its detectors start from nothing there",
                self.run_id,
                step,
                self.MAX_REPLAY,
            )
        self._replaying = True
        for message in replay:
            self.update(message)
        self._replaying = False

    def _alert_id(self, family: str, module: str | None, step: int) -> str:
        rank = self.rank if self._named else None
        return alert_id(
            self.run_id, family, module, step, self.config.version, rank, self._id_attempt
        )

    def _metrics(self, step: int, values: Mapping[str, Any]) -> list[RunWarning]:
        """Update every series first, then open warnings: attribution sees the whole record.
        Nothing is read while the learning rate still warms up, and the warm-up windows count
        steps since its peak (``schedule_clock``)."""
        self._check_recipe(step, values.get("lr"))
        since_peak = self._clock.update(step, values.get("lr"))
        if since_peak is None:
            return self._clear(step)
        fired = self._track_inflation(step, since_peak, values.get(INFLATION_METRIC))
        for key, value in values.items():
            if key in self._ignored:
                continue
            series = self._series.get(key) or self._new_series(key)
            if series is None:
                self._ignored.add(key)
                continue
            z = series.standardizer.update(since_peak, value)
            if z is None:
                continue
            series.recent.append((step, value, round(z, 3)))
            for direction, cusum in series.cusums.items():
                cusum.update(z)
                self.peaks[series.metric] = max(self.peaks.get(series.metric, 0.0), cusum.peak)
                if cusum.drift_detected:
                    fired.append((series, direction, cusum))
        events = []  # in series-key order: a record's warnings never depend on its key order
        for series, direction, cusum in sorted(fired, key=lambda f: (f[0].key, f[1])):
            if (series.family, series.module) not in self._open:
                events.append(self._open_alert(series, direction, cusum, step))
        return events + self._clear(step)

    def _check_recipe(self, step: int, lr: Any) -> None:
        """A run whose learning rates are not its profile's recipe (``schedule_clock``) is
        judged from here on by the profile's fallback, rebuilt from this record, and says so."""
        why = departure(self.profile.recipes, step, lr)
        if why is None or not isinstance(self._configs, ProfileConfigs):
            return
        fallback = self._configs.fallback_choice
        self.profile = fallback(f"{self.profile.name} fits the model, but {why}")
        self.config, self._inflation = self.profile.config, None
        self._series, self._ignored, self.unruled = {}, set(), {}
        log.info("foreshock detect: run %s: %s", self.run_id, self.profile.reason)

    def _track_inflation(self, step: int, since_peak: int, value: Any) -> list[Fired]:
        """The weight-inflation test (:mod:`~foreshock.detectors.inflation`), armed on the
        first record where the profile has ``inflation_h``; its optimizer series, where the
        profile's rules hold it, joins the run's series. Returns what fired (``_metrics``)."""
        if self.config.inflation_h is None:
            return []
        if self._inflation is None:
            self._inflation = WeightInflation(self.config, self.config.inflation_h)
            if self._inflation.optimizer is not None:
                self._series[OPTIMIZER_TEST] = self._inflation.optimizer
        return self._inflation.track(step, value, self.peaks, since_peak)

    def _new_series(self, key: str) -> Series | None:
        series = build_series(key, self.config, self.unruled)
        if series is not None:
            self._series[key] = series
            if self._clock.peak_step:  # built once the schedule peaked: a warm-up came first
                settle_floor(series.standardizer)
        return series

    def _open_alert(self, series: Series, direction: str, cusum: Detector, step: int) -> RunWarning:
        """Open a warning; the run's first mechanism warning names its cause
        (:mod:`~foreshock.detectors.attribution`: the whole record is read by now)."""
        family = series.family
        if family in MECHANISMS and self.cause is None:
            inflated = self._inflation is not None and self._inflation.inflated
            self.cause = cause_of(family, self._series.values(), inflated, self.config.calm_ratio)
        cause = self.cause if family in MECHANISMS else None
        rank = self.rank if self._named else None
        alert = RunWarning(
            id=self._alert_id(family, series.module, step), run_id=self.run_id, family=family,
            module=series.module, series=series.key, direction=direction, step=step,
            role=role(family, self.cause), statistic=round(cusum.statistic, 3),
            threshold=cusum.h, false_alarm_rate=self.config.false_alarm.get(family),
            config_version=self.config.version,
            evidence={
                "detector": series.kind,
                "profile": self.profile.name,
                "profile_reason": self.profile.reason,  # e.g. a recipe outside its profile's
                "warmup_mean": series.standardizer.mean,
                "warmup_scale": series.standardizer.scale,
                "recent": [list(r) for r in series.recent],
                "cause": cause,
                "check": CHECK.get(family if cause is None else cause),
            },
            divergence_step=self.divergence_step,
            lead_time=lead_of(self.divergence_step, step),
            rank=rank,
        )  # fmt: skip
        self._open[(family, series.module)] = alert
        self.alerts.append(alert)
        return RunWarning(**asdict(alert))  # the event is a snapshot; the alert itself lives on

    def _clear(self, step: int, ended: str | None = None) -> list[RunWarning]:
        """Resolve the open warnings whose statistics are all back below h — or, once the run
        ``ended`` (its end status), every open warning."""
        if ended is not None:
            return self._resolve_open(step, {"resolved_by": "run ended", "run_status": ended})
        events = []
        for family, module in list(self._open):
            alarmed = any(
                c.in_alarm
                for s in self._series.values()
                if s.family == family and s.module == module
                for c in s.cusums.values()
            )
            calm = 0 if alarmed else self._calm.get((family, module), 0) + 1
            self._calm[(family, module)] = calm
            if calm >= self.config.release:
                events += self._resolve(family, module, step, {"resolved_by": "statistic"})
        return events

    def _resolve_open(self, step: int, why: dict[str, Any]) -> list[RunWarning]:
        return [
            e
            for family, module in list(self._open)
            for e in self._resolve(family, module, step, why)
        ]

    def _resolve(
        self, family: str, module: str | None, step: int, why: dict[str, Any]
    ) -> list[RunWarning]:
        """Close one open warning: a ``cleared`` event whose evidence says why."""
        alert = self._open.pop((family, module))
        self._calm.pop((family, module), None)
        alert.cleared_step = step
        event = RunWarning(**{**asdict(alert), "event": EventKind.CLEARED})
        event.evidence = {**event.evidence, **why}
        return [event]

    def _diverged(self, step: int, exact: bool = False) -> list[RunWarning]:
        """Set the divergence step; the producer's exact (every-step) one overrides ours."""
        if self.divergence_step is not None and (not exact or step == self.divergence_step):
            return []
        self.divergence_step = step
        events = []
        for alert in self.alerts:
            alert.divergence_step, alert.lead_time = step, lead_of(step, alert.step)
            events.append(RunWarning(**{**asdict(alert), "event": EventKind.UPDATED}))
        return events

    def _not_diverged(self) -> list[RunWarning]:
        """The producer saw every step's loss and says the run never diverged: an estimate
        from the sparse one-batch losses of monitoring records is withdrawn (``updated``)."""
        if self.divergence_step is None:
            return []
        self.divergence_step = None
        events = []
        for alert in self.alerts:
            alert.divergence_step, alert.lead_time = None, None
            events.append(RunWarning(**{**asdict(alert), "event": EventKind.UPDATED}))
        return events
