"""A decision of the remedy policy: what to ask the trainer, for which warning, nothing done yet.

Why its own frozen type: under torch.distributed one rank decides and every rank applies the
same decisions (:mod:`.remedy_ranks`), so a decision travels between processes and must say
everything the appliers need, and nothing may change it on the way. It once was a dict of a
dozen string keys, where a misspelt key was a silent None.

>>> from foreshock.remediation.policy import RemedyPolicy
>>> d = decision_for("hold-lr", opened("optimizer", None, recent=[400, 425, 450]), 451,
...                  RemedyPolicy())
>>> (d.kind, d.step, d.scale, d.since, d.rollback_before)
('hold-lr', 451, 0.5, 400, None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from foreshock.remediation.policy import RemedyPolicy
from foreshock.remediation.remedies import REMEDIES
from foreshock.transport.warning import EventKind, Role, RunWarning

__all__ = ["Decision", "cause_of", "decision_for", "first_evidence", "requested_warning"]


@dataclass(frozen=True)
class Decision:
    """What a :class:`~.remedy.Remediator` decided (``decide``/``decide_request``)."""

    kind: str  # the remedy (:data:`~foreshock.remediation.remedies.REMEDIES`) or "none"
    warning_id: str
    family: str
    module: str | None
    step: int  # the step boundary it applies at
    target: str | None  # precise-attention: the layer to switch (None: every one)
    scale: float  # hold-lr's lr_scale, scale-router-lr's router_lr_scale, else 1
    since: int | None  # hold-lr: the step whose learning rate it scales (None: now)
    hold_rising: int | None  # also hold a rate risen since this step (``hold_rising_lr``)
    rollback_before: int | None  # restore a snapshot older than this step first
    dry_run: bool
    source: str = "policy"  # "policy": the automatic path; "approved": a person's request
    request_id: str | None = None  # the approved request it answers
    approver: Mapping[str, str] | None = None  # the allowlist's key id and name
    error: str | None = None  # why it cannot be applied (then nothing is asked)
    refused: str | None = None  # a request refused by the gate (:mod:`.request_gate`)


def decision_for(kind: str, warning: RunWarning, step: int, policy: RemedyPolicy) -> Decision:
    """The policy's decision to answer ``warning`` with ``kind`` at ``step``."""
    remedy = REMEDIES.get(kind)
    evidence = first_evidence(warning)
    scale = getattr(policy, remedy.scale) if remedy is not None and remedy.scale else 1.0
    rising = policy.hold_rising_lr and remedy is not None and remedy.holds_risen_lr
    from_evidence = remedy is not None and remedy.from_evidence and policy.hold_from == "evidence"
    return Decision(
        kind=kind,
        warning_id=warning.id,
        family=warning.family,
        module=warning.module,
        step=int(step),
        target=warning.module if policy.attention_scope == "module" else None,
        scale=float(scale),
        since=evidence if from_evidence else None,
        hold_rising=evidence if rising else None,
        rollback_before=evidence if policy.rolls_back(cause_or_family(warning)) else None,
        dry_run=bool(policy.dry_run),
    )


def cause_of(warning: RunWarning) -> str | None:
    """The cause an opened warning names (:mod:`.remedy`'s docstring), else None."""
    if warning.event != EventKind.OPENED:
        return None
    if warning.role == Role.OPTIMIZER or warning.family == "optimizer":
        return "optimizer"
    return warning.family if warning.role == Role.CAUSE else None


def cause_or_family(warning: RunWarning) -> str:
    """The cause a decision answers: the warning's (``cause_of``), else its family (a person's
    request names the family)."""
    return cause_of(warning) or warning.family


def first_evidence(warning: RunWarning) -> int:
    """The step of the warning's first record of evidence (its recent window), else its own."""
    recent = (warning.evidence or {}).get("recent") or []
    steps = [int(r[0]) for r in recent if isinstance(r, list | tuple) and r]
    return min(steps, default=warning.step)


def requested_warning(request: Mapping[str, Any], family: str, step: int) -> RunWarning:
    """The warning a request names, as far as the request says (id, family, module, step)."""
    return RunWarning(
        str(request.get("warning_id") or ""), str(request.get("run_id") or ""), family,
        request.get("module"), "", "up", int(request.get("step") or step), Role.CAUSE, 0.0,
        0.0, None, "", dict(request.get("evidence") or {}),
    )  # fmt: skip


def opened(family: str, module: str | None, recent: Sequence[int] = ()) -> RunWarning:
    """A warning as the detectors open it, its evidence at ``recent`` steps (for examples)."""
    evidence = {"recent": [[s, 1.0, 1.0] for s in recent]} if recent else {}
    step = max(recent, default=450)
    return RunWarning(
        f"w-{family}", "r", family, module, "s", "up", step, Role.CAUSE, 1.0, 1.0, None, "v",
        evidence,
    )  # fmt: skip
