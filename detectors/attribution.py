"""Which cause a run's warnings name, and the role each warning plays in it.

Why apart from the engine: attribution is earned, not assumed, and the rule is short enough to
read whole here. The lab shows the mechanism families are *not* orthogonal (a learning-rate
ramp moves the attention entropies too, some 500 steps after the router), so what names the
cause is which family moves first. Once per run, at its first mechanism warning of family F:

* ``optimizer`` when the weights were already inflated
  (:mod:`~foreshock.detectors.inflation`): every weight grew before any mechanism moved;
* F when every other mechanism family is calm at that record: its pressure

      p(G) = max over G's detectors of S / h   (dimensionless; S the sustained statistic)

  below ``calm_ratio`` (1.0: has not crossed what healthy runs never cross);
* else ``ambiguous``: both crossed on the same record and nothing tells them apart.

Each mechanism warning's role then follows from that cause (:func:`role`): ``cause`` for F's,
``secondary`` for a family that followed it, or the cause itself when it is ``optimizer`` or
``ambiguous``; a symptom family's warnings are ``symptom``, whatever the cause.

>>> role("router", "router"), role("attention-numerics", "router"), role("loss", None)
(<Role.CAUSE: 'cause'>, <Role.SECONDARY: 'secondary'>, <Role.SYMPTOM: 'symptom'>)
>>> role("router", "ambiguous")
<Role.AMBIGUOUS: 'ambiguous'>
"""

from __future__ import annotations

import math
from collections.abc import Collection

from foreshock.transport.warning import Role

from .config import MECHANISMS
from .series import Series

__all__ = ["cause_of", "pressure", "role"]


def cause_of(family: str, series: Collection[Series], inflated: bool, calm_ratio: float) -> str:
    """The cause a first mechanism warning of ``family`` names, given the run's ``series``
    as they stand on its record and whether the weights are ``inflated``."""
    if inflated:
        return "optimizer"
    others = [f for f in MECHANISMS if f != family]
    calm = all(pressure(f, series) < calm_ratio for f in others)
    return family if calm else "ambiguous"


def pressure(family: str, series: Collection[Series]) -> float:
    """How close ``family`` is to firing: its largest sustained statistic / threshold (0 when
    it has no detector with a finite threshold)."""
    ratios = [
        c.sustained / c.h
        for s in series
        if s.family == family
        for c in s.cusums.values()
        if math.isfinite(c.h)
    ]
    return max(ratios, default=0.0)


def role(family: str, cause: str | None) -> Role:
    """The role of a warning of ``family`` in a run whose warnings name ``cause`` (set by the
    run's first mechanism warning, so never None for a mechanism family's)."""
    if family not in MECHANISMS:
        return Role.SYMPTOM
    if cause in (Role.AMBIGUOUS, Role.OPTIMIZER):
        return Role(cause)
    return Role.CAUSE if cause == family else Role.SECONDARY
