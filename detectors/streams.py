"""One run's detectors, one per rank: per-rank mode must not blind them.

With ``MonitorConfig(emit_ranks="all")`` — how one bad GPU is caught — every rank measures
and writes its own records under the run id, through its own producer, so each rank is its
own stream and its own ``attempt`` (:mod:`foreshock.transport.wire`). A single
:class:`~foreshock.detectors.engine.RunDetector` follows one attempt per run: the second
rank's records looked like a second job under the run id and were ignored (a faulty rank 1
beside a healthy rank 0 gave no warning at all), and had they been merged, two ranks' values
at one step would have fed one standardizer. So the detectors of a run are keyed by rank:
each rank's stream gets its own detectors, its own resumes (a new attempt of *that* rank)
and its own end; a rank's warnings name it (``RunWarning.rank``, also in their ids) once the
stream's records are per-rank records of a run of more than one process (``world_size`` > 1
and ``emit_ranks`` not ``"zero"``: a global record speaks for the whole job) or the rank is
not 0 — a single-process run's warnings stay as they were.

The worker (:mod:`foreshock.detectors.worker`), the offline replay and ``foreshock tune``
all go through this one router, so live and offline agree. A run written by rank 0 alone
(the default, ``emit_ranks="zero"``) has one detector and warns exactly as before.
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.warning import RunWarning

from .config import DetectorConfig
from .engine import RunDetector
from .profiles import ProfileChoice, ProfileConfigs, choose_profile
from .reach import rule_reach

__all__ = ["RunStreams"]


class RunStreams:
    """Feed a run's messages (each rank's in seq order) with ``update``; one detector per rank.

    ``ranks``: {rank: its RunDetector}; ``ended``: every rank that wrote has sent its ``end``.
    A rank whose stream has no labelled ``start`` of its own (a producer synthesised it) gets
    the run's first labelled one, so it is judged with the profile of the run's model.

    >>> from foreshock.detectors.config import DetectorConfig
    >>> run = RunStreams("r", DetectorConfig())
    >>> for rank in (0, 1):
    ...     _ = run.update({"kind": "metrics", "rank": rank, "attempt": 10 + rank, "step": 0,
    ...                     "world_size": 2, "values": {"loss": 2.0}})
    >>> sorted(run.ranks), [d.ignored for d in run.ranks.values()]
    ([0, 1], [0, 0])
    """

    def __init__(self, run_id: str, config: DetectorConfig | ProfileConfigs, keep: int = 0) -> None:
        self.run_id, self._config = run_id, config
        self.ranks: dict[int, RunDetector] = {}
        self._start: dict[str, Any] | None = None  # the run's first start with labels
        self._live: set[int] = set()  # ranks that wrote and have not ended
        # up to ``keep`` messages kept while the fallback judges the run, for a switch to a
        # profile published later (:mod:`.profile_switch`)
        self._keep = keep
        self.kept: list[dict[str, Any]] = []

    def update(self, message: dict[str, Any]) -> list[RunWarning]:
        events = self._update(message)
        if self._keep:
            self._remember(message)
        return events

    def _remember(self, message: dict[str, Any]) -> None:
        fallback = getattr(self._config, "fallback", None)
        judged_by = self.ranks[min(self.ranks)].profile.name if self.ranks else None
        if len(self.kept) >= self._keep or judged_by != fallback:
            self._keep, self.kept = 0, []  # past the bound, or judged by a profile of its own
        else:
            self.kept.append(message)

    @property
    def keeping(self) -> bool:
        """Whether the run keeps its messages for a switch (:mod:`.profile_switch`)."""
        return bool(self._keep)

    @property
    def start(self) -> dict[str, Any] | None:
        """The run's first start record with labels or a signature (None: none yet)."""
        return self._start

    @property
    def alerts_open(self) -> bool:
        """Whether a rank's detector holds an open warning."""
        return any(d.open_alerts for d in self.ranks.values())

    def _update(self, message: dict[str, Any]) -> list[RunWarning]:
        rank, kind = int(message.get("rank") or 0), message.get("kind", "metrics")
        if kind == "action":  # it names its warning, whichever rank's detector holds it
            return [e for _, d in sorted(self.ranks.items()) for e in d.update(message)]
        if kind == "start":
            self._labels(message, rank)
            if not message.get("labels") and self._start is not None:
                message = {**message, "labels": self._start["labels"]}
        detector = self.ranks.get(rank)
        if detector is None:
            detector = self.ranks[rank] = RunDetector(self.run_id, self._config, rank=rank)
            if kind != "start" and self._start is not None:  # another rank's: not its attempt
                detector.update({**self._start, "rank": rank, "attempt": None})
        if detector.superseded(message):  # a late message of an older attempt: not its end
            pass
        elif kind == "end":
            self._live.discard(rank)
        else:
            self._live.add(rank)
        return detector.update(message)

    def _labels(self, start: dict[str, Any], rank: int) -> None:
        """The run's first start with labels or an architecture signature also describes the
        ranks that started without (a detector takes them until its first series exists)."""
        described = start.get("labels") or (start.get("monitor") or {}).get("signature")
        if self._start is not None or not described:
            return
        self._start = start
        for other, detector in self.ranks.items():
            if other != rank and other in self._live:
                detector.update({**start, "rank": other})

    def finish(self, end: dict[str, Any]) -> list[RunWarning]:
        """End a recorded run whose file or store kept one ``end`` (its last): it ends its own
        rank's stream, and every other rank's without its divergence step (that was another
        rank's loss) — the recording is over."""
        own = int(end.get("rank") or 0)
        events = []
        for rank in sorted({own, *self.ranks}):
            body = end if rank == own else {k: v for k, v in end.items() if k != "divergence_step"}
            events += self.update({**body, "kind": "end", "rank": rank})
        return events

    @property
    def ended(self) -> bool:
        return not self._live

    @property
    def alerts(self) -> list[RunWarning]:
        """Every rank's warnings, by rank."""
        return [a for _, d in sorted(self.ranks.items()) for a in d.alerts]

    @property
    def peaks(self) -> dict[str, float]:
        """Each metric's largest statistic over the ranks (for calibration)."""
        out: dict[str, float] = {}
        for detector in self.ranks.values():
            for metric, peak in detector.peaks.items():
                out[metric] = max(out.get(metric, peak), peak)
        return out

    @property
    def divergence_step(self) -> int | None:
        """The first step any rank's loss diverged at (None: none has)."""
        steps = [d.divergence_step for d in self.ranks.values() if d.divergence_step is not None]
        return min(steps, default=None)

    @property
    def profile(self) -> ProfileChoice:
        """The profile the run is judged by (its lowest rank's: every rank reads one start)."""
        if not self.ranks:
            return choose_profile(self._config, self._start)
        return self.ranks[min(self.ranks)].profile

    @property
    def unruled(self) -> dict[str, str]:
        """Module-level metrics the run sent that no rule of its profile reads, and why."""
        out: dict[str, str] = {}
        for _, detector in sorted(self.ranks.items()):
            out = {**detector.unruled, **out}
        return dict(sorted(out.items()))

    @property
    def reach(self) -> dict[str, str]:
        """What each rule takes to fire on this run, in its units (:mod:`.reach`; the lowest
        rank's: every rank is judged by one profile)."""
        if not self.ranks:
            return {}
        detector = self.ranks[min(self.ranks)]
        config = detector.config
        return rule_reach(detector._series, config.thresholds, config.k)

    @property
    def ignored(self) -> int:
        """Records of superseded attempts, over the ranks (two jobs under one run id)."""
        return sum(d.ignored for d in self.ranks.values())
