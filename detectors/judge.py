"""One judge of a replayed run: warned before divergence, lead, attribution, false warnings.

``foreshock tune``, the detection benchmark (``benchmarks.detection_table``) and the tests ask
the same questions of a run's warnings; they ask them here, against the catalogue's facts
(:mod:`foreshock.catalogue`: which families detect a scenario, which causes its first warning
may rightly name), so that no run is right for one and wrong for another. The answers:

* **the first mechanism warning** — the earliest (by step) attention-numerics or router
  warning before the divergence step (any, when the run never diverged), and the cause it
  names: the engine's ``evidence["cause"]`` (a family, ``optimizer`` or ``ambiguous``);
* **attribution** — ``none`` (no such warning), ``ambiguous``, ``correct`` when the cause is
  one of the scenario's ``right_causes``, else ``wrong``. Not the warning's role: a
  learning-rate ramp (``lr-high``) is an optimizer fault, and a first warning whose role is
  ``optimizer`` names it rightly though its role is not ``cause``. On a quiet scenario
  (healthy, a control) any cause is wrong: there is no fault to name. A scenario the
  catalogue does not know is ``unjudged``;
* **detected** — a warning of one of the fault's own families before divergence; on a quiet
  scenario, any mechanism warning before divergence (a false alarm); on a scenario the
  catalogue does not know, any mechanism warning before divergence (:data:`UNKNOWN`);
* **lead** — divergence step − the step of a family's first warning before it (None when
  the run did not diverge or the family did not warn first);
* **false warnings** — on a quiet run, every warning of each mechanism family, before the
  divergence or after.

Torch-free: it reads any objects with ``family``, ``step``, ``role`` and ``evidence``
(:class:`~foreshock.transport.warning.RunWarning`).

>>> from types import SimpleNamespace as W
>>> ramp = [W(family="router", step=600, role="optimizer", evidence={"cause": "optimizer"}),
...         W(family="symptom", step=800, role="symptom", evidence={})]
>>> v = judge("lr-high", 1250, ramp)
>>> v.detected, v.attribution, v.lead(), v.lead("symptom"), v.own_before_symptom
(True, 'correct', 650, 450, True)
>>> judge("gbs-small", None, ramp).attribution   # only the router is its right cause
'wrong'
>>> judge("healthy", None, ramp).false_warnings
{'attention-numerics': 0, 'router': 1, 'optimizer': 0}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from foreshock.catalogue import FAMILIES, MECHANISMS, scenario

__all__ = ["UNKNOWN", "Verdict", "judge", "own_families"]

UNKNOWN = "unknown"  # the family a fault of unknown family is judged under: any mechanism


class Warned(Protocol):
    """What the judge reads of a warning (read-only: a ``RunWarning``, whose ``role`` is a
    ``Role`` and ``evidence`` a dict, is one)."""

    @property
    def family(self) -> str: ...

    @property
    def step(self) -> int: ...

    @property
    def role(self) -> str: ...

    @property
    def evidence(self) -> Mapping[str, Any]: ...


def own_families(name: str) -> tuple[str, ...] | None:
    """The families whose warning detects scenario ``name``: () for a quiet one (healthy, a
    control), None for a scenario the catalogue does not know (a fault of unknown family).

    >>> own_families("fa-lowprec"), own_families("healthy"), own_families("bespoke")
    (('attention-numerics',), (), None)
    """
    try:
        return scenario(name).own
    except KeyError:
        return None


def cause_of(warning: Warned) -> str:
    """The cause a mechanism warning names: the engine's attribution in its evidence; for a
    warning without one, its role where that names a cause, else its family."""
    cause = (warning.evidence or {}).get("cause")
    if cause:
        return cause
    return warning.role if warning.role in ("ambiguous", "optimizer") else warning.family


@dataclass(frozen=True)
class Verdict:
    """The judge's answers for one run (see the module docstring)."""

    scenario: str
    divergence_step: int | None
    own: tuple[str, ...] | None  # own_families(scenario)
    right_causes: tuple[str, ...] | None  # None: a scenario the catalogue does not know
    firsts: dict[str, Warned | None]  # per family (and UNKNOWN): first warning before divergence
    counts: dict[str, int] = field(default_factory=dict)  # every warning, per family

    @property
    def faulty(self) -> bool:
        """A fault to warn about: not healthy or a control (an unknown scenario is a fault)."""
        return self.own is None or bool(self.own)

    @property
    def first(self) -> Warned | None:
        """The first mechanism warning before divergence (any family)."""
        return self.firsts[UNKNOWN]

    @property
    def cause(self) -> str | None:
        return None if self.first is None else cause_of(self.first)

    @property
    def attribution(self) -> str:
        """``none``, ``ambiguous``, ``correct``, ``wrong`` or (unknown scenario) ``unjudged``."""
        if self.first is None:
            return "none"
        if self.cause == "ambiguous":
            return "ambiguous"
        if self.right_causes is None:
            return "unjudged"
        return "correct" if self.cause in self.right_causes else "wrong"

    @property
    def attribution_ok(self) -> bool | None:
        """True when correct, False when wrong or ambiguous, None when there is nothing to
        judge (no mechanism warning before divergence, or an unknown scenario)."""
        verdict = self.attribution
        return None if verdict in ("none", "unjudged") else verdict == "correct"

    @property
    def families(self) -> tuple[str, ...]:
        """The families a fault is judged on: its own, or :data:`UNKNOWN`."""
        return (UNKNOWN,) if self.own is None else self.own

    def detected_by(self, family: str) -> bool:
        """Did ``family`` (or :data:`UNKNOWN`: any mechanism) warn before divergence?"""
        return self.firsts.get(family) is not None

    @property
    def detected(self) -> bool:
        """Warned before divergence: by an own family; on a quiet run, by any mechanism."""
        return any(self.detected_by(f) for f in self.own or (UNKNOWN,))

    def lead(self, family: str = UNKNOWN) -> int | None:
        """Divergence step − ``family``'s first warning before it (default: the first
        mechanism warning's); None without a divergence or such a warning."""
        first = self.firsts.get(family)
        if self.divergence_step is None or first is None:
            return None
        return self.divergence_step - first.step

    @property
    def family_leads(self) -> dict[str, int | None]:
        return {family: self.lead(family) for family in FAMILIES}

    @property
    def own_first(self) -> Warned | None:
        """The first warning of one of the fault's own families before divergence."""
        hits = [w for f in self.own or () if (w := self.firsts.get(f)) is not None]
        return min(hits, key=lambda a: a.step, default=None)

    @property
    def own_before_symptom(self) -> bool:
        """An own-family warning before divergence, earlier than any symptom warning."""
        own, symptom = self.own_first, self.firsts["symptom"]
        return own is not None and (symptom is None or own.step < symptom.step)

    @property
    def false_warnings(self) -> dict[str, int]:
        """Per mechanism family, its warnings on a quiet run (all zero on a fault)."""
        return {f: 0 if self.faulty else self.counts.get(f, 0) for f in MECHANISMS}


def judge(name: str, divergence_step: int | None, warnings: Iterable[Warned]) -> Verdict:
    """Judge a run of scenario ``name`` that diverged at ``divergence_step`` (None: did not)
    from its ``warnings`` (``RunReport.alerts``; symptom warnings included)."""
    warnings = list(warnings)
    before = [a for a in warnings if divergence_step is None or a.step < divergence_step]
    firsts: dict[str, Warned | None] = {
        family: _earliest(a for a in before if a.family == family) for family in FAMILIES
    }
    firsts[UNKNOWN] = _earliest(a for a in before if a.family in MECHANISMS)
    counts: dict[str, int] = {}
    for warning in warnings:
        counts[warning.family] = counts.get(warning.family, 0) + 1
    own = own_families(name)
    right = None if own is None else scenario(name).right_causes
    return Verdict(name, divergence_step, own, right, firsts, counts)


def _earliest(warnings: Iterable[Warned]) -> Warned | None:
    """The warning of the least step; of those at one step, the first given (the order the
    detectors raised them)."""
    return min(warnings, key=lambda a: a.step, default=None)
