"""Act on a warning before the loss moves: a policy that maps a warning's cause to an action.

Why act on the *cause*: trainers today react to the loss (roll back ~100 steps, skip batches,
resubmit with a lower learning rate), after the damage, with no idea of what caused it. In the
lab, rolling back with the fault left on only delays the divergence, while removing the cause
at foreshock's first warning saves the run with nothing re-done (issue 32's probe: 7 of 7
low-precision attention runs, 0 steps re-done). So the policy reads what the warning names —
its cause (the family of a warning whose role is ``cause``; ``optimizer`` for a warning whose
role is ``optimizer`` — every weight grew first — or of the optimizer test's own family; no
action for a secondary, ambiguous or symptom warning) and its module, and asks the trainer for
the matching remedy:

==================== ======================= ===============================================
cause                action                  what the trainer does
==================== ======================= ===============================================
attention-numerics   ``precise-attention``   the attention backward in full precision: every
                                             layer (``attention_scope = "all"``: the kernel
                                             that rounds is shared, and in the lab curing
                                             the named layer alone left the other to warn
                                             later) or the named one ("module")
optimizer            ``hold-lr``             the learning rate held at ``lr_scale`` × its
                                             value when the warning's evidence began
                                             (``hold_from``), from then on (a one-off cut
                                             while the schedule keeps ramping did not save
                                             the lab's runs; holding it did; a ramp caught
                                             late has already multiplied the rate at the
                                             warning)
router               ``scale-router-lr``     the routers' learning rate held at
                                             ``router_lr_scale`` × its value at the warning
                                             (a collapse fed by a rising router learning
                                             rate goes on collapsing under a one-off cut)
any                  ``stop``                stop, keeping the last checkpoint
==================== ======================= ===============================================

A rate that rose while the mechanism broke is a cause of its own: with ``hold_rising_lr`` (on
by default) ``precise-attention`` and ``scale-router-lr`` also hold the learning rate where the
warning's evidence began, if it has since risen past :data:`RATE_RISE` × that value — an LR
ramp caught through the router it feeds (a Qwen2-MoE through the HF Trainer) diverged 5 steps
after the router's remedy alone.

Off by default (a trainer passes a policy to act). Bounded: at most ``max_actions`` per run,
``backoff_steps`` between two, only on rules trusted enough (``max_false_alarm_rate``: the
rule's stated per-run false-alarm rate at most this), never an exception into the training
loop — a remedy that fails is an :class:`Action` with its error, and training goes on.
``dry_run`` decides and reports without asking the trainer for anything. A rollback before
the action (``rollback``: ``true`` for every cause, a list of causes, by default the router's)
restores the newest snapshot older than the warning's first evidence (:mod:`.snapshots`). A
collapsing router needs it: its rows have already aligned by the warning, and in the lab
holding its learning rate from there left the routing below the healthy runs' on one of three
capacity-limited GPT-MoE seeds (33–35), where rolling back first brought all three back
(``python -m benchmarks.remediation``). A two-sided series acts only in the direction that
names its fault (:data:`FAULT_DIRECTION`: router ε falling, not rising).

>>> from foreshock.remediation.decision import opened
>>> class Trainer:
...     def precise_attention(self, module): print("precise", module)
>>> remediator = Remediator(RemedyPolicy(), Trainer())
>>> [a.kind for a in remediator.act(450, [opened("attention-numerics", "h.1.attn")])]
precise None
['precise-attention']
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from foreshock.remediation.decision import (
    Decision,
    cause_of,
    decision_for,
    requested_warning,
)
from foreshock.remediation.policy import (
    CAUSES,
    DEFAULT_ACTIONS,
    RATE_RISE,
    REMEDIES,
    RemedyPolicy,
    policy_summary,
)
from foreshock.remediation.remedies import Remedy
from foreshock.remediation.request_gate import refusal
from foreshock.transport.records import RUN_SCHEMA
from foreshock.transport.warning import RunWarning

__all__ = [
    "CAUSES",
    "DEFAULT_ACTIONS",
    "REMEDIES",
    "Action",
    "Decision",
    "Remediator",
    "RemedyPolicy",
    "action_record",
    "cause_of",
    "policy_summary",
]

log = logging.getLogger("foreshock.remedy")

# The direction in which a two-sided series names its family's fault. Router ε = max_e
# ‖w_e − w̄‖ / ‖w̄‖ (dimensionless) falls as the router's rows align — the collapse the router
# remedy answers (a small ε forces cos(w_i, w_j) ≥ 1 − 2ε²: ../shared/SCIENCE.md); it rises as
# the rows spread, which it does under a learning-rate ramp (an optimizer fault) and on some
# healthy runs, where holding the router's learning rate answers nothing. The detectors warn
# both ways (a rise is still news); the policy acts on its own only on a fall.
FAULT_DIRECTION = {"router.epsilon": "down"}


@dataclass
class Action:
    """One decision of the policy: what, for which warning, at which step, and how it went."""

    kind: str
    warning_id: str
    family: str
    module: str | None
    step: int  # the step at which the action was applied (the next step boundary)
    applied: bool
    dry_run: bool = False
    rolled_back_to: int | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    source: str = "policy"  # "policy": the automatic path; "approved": a person's request
    request_id: str | None = None  # the approved request it answers (``warnings act``)
    approver: dict[str, str] | None = None  # who approved it: the allowlist's key id and name

    def to_message(self) -> dict[str, Any]:
        return asdict(self)


def action_record(run_id: str, rank: int, action: Action) -> dict[str, Any]:
    """The wire record a trainer writes for an action it took (or failed to take): kind
    ``action``, its step, ``action`` (what), the warning it answers, and how it went. The
    detectors read it as the warning's resolution (``resolved_by: action``); a request from
    ``foreshock warnings act`` is acknowledged by the record carrying its ``request_id``."""
    body = action.to_message()
    body["action"] = body.pop("kind")
    return {
        "schema": RUN_SCHEMA,
        "kind": "action",
        "run_id": run_id,
        "rank": rank,
        "time": time.time(),
        **body,
    }


class Remediator:
    """``act(step, warnings)`` at a step boundary: the actions the policy takes for the
    warnings that opened; never raises. ``remedies`` is the trainer's side: any of
    ``precise_attention(module)``, ``hold_lr(scale, since)`` (``since``: the step whose
    learning rate it scales, None for now), ``scale_router_lr(scale)``, ``stop()``,
    ``rollback(step)``; a method it lacks is an action it cannot take (reported as such).

    Deciding and applying are apart (``decide``/``decide_request``, then ``apply``): under
    torch.distributed one rank decides and every rank applies the same decisions
    (:mod:`.remedy_ranks`), so a decision is a small frozen value that travels
    (:class:`~.remedy_decision.Decision`).
    ``act`` and ``approve`` are both at once, for a single process."""

    def __init__(self, policy: RemedyPolicy, remedies: Any) -> None:
        self.policy, self.remedies = policy, remedies
        self.actions: list[Action] = []

    def act(self, step: int, warnings: Iterable[RunWarning]) -> list[Action]:
        return [self.apply(decision) for decision in self.decide(step, warnings)]

    def approve(self, step: int, request: Mapping[str, Any]) -> Action | None:
        """Apply a person's request (``foreshock warnings act``) at this step boundary; never
        raises. ``request``: ``request_id``, ``warning_id``, ``family``, ``module``, and
        optionally ``action`` (else the policy's for the family), ``rollback`` and
        ``lr_scale`` (else the policy's). Bounded like the policy's own actions, and refused
        with a record where it may not act (:mod:`.request_gate`)."""
        decision = self.decide_request(step, request)
        return None if decision is None else self.apply(decision)

    def decide(
        self, step: int, warnings: Iterable[RunWarning], pending: Sequence[Decision] = ()
    ) -> list[Decision]:
        """What ``act`` would do for ``warnings``, nothing done yet: the bounds count the
        actions taken and the ``pending`` decisions of this boundary."""
        decided: list[Decision] = []
        for warning in warnings:
            kind = self._kind_for(warning)
            if kind is not None and self._allowed(step, [*pending, *decided]):
                decided.append(decision_for(kind, warning, step, self.policy))
        return decided

    def decide_request(
        self, step: int, request: Mapping[str, Any], pending: Sequence[Decision] = ()
    ) -> Decision | None:
        """What ``approve`` would do for ``request``: an action, or a refusal to record
        (:mod:`.request_gate`: bounded like the policy's own, one remedy per warning)."""
        request_id = str(request.get("request_id") or "")
        family = str(request.get("family") or "")
        kind = request.get("action") or self.policy.actions.get(family)
        warning = requested_warning(request, family, step)
        taken = [(a.request_id, a.warning_id, a.applied) for a in self.actions]
        taken += [(d.request_id, d.warning_id, d.error is None) for d in pending]
        allowed = self._allowed(step, list(pending))
        why = refusal(request, taken, allowed, self.policy.lr_scale)
        if why is not None:
            decision = decision_for(str(kind or "none"), warning, step, self.policy)
            decision = replace(decision, error=f"refused: {why}", refused=why)
        elif kind not in REMEDIES:
            decision = decision_for(str(kind), warning, step, self.policy)
            error = f"no action for {family!r}: give one of {list(REMEDIES)}"
            decision = replace(decision, error=error)
        else:
            overrides = {
                k: request[k] for k in ("rollback", "lr_scale") if request.get(k) is not None
            }
            decision = decision_for(str(kind), warning, step, replace(self.policy, **overrides))
        return replace(
            decision, source="approved", request_id=request_id or None,
            approver=request.get("approver"),  # the allowlist's key id and name
        )  # fmt: skip

    def apply(self, decision: Decision) -> Action:
        """Do what ``decision`` says (kept in ``actions``); never raises: a remedy that fails
        is the action's error, and training goes on."""
        d = decision
        action = Action(
            d.kind, d.warning_id, d.family, d.module, d.step, False,
            source=d.source, request_id=d.request_id,
            approver=dict(d.approver) if d.approver else None,
        )  # fmt: skip
        self.actions.append(action)
        if d.refused:
            action.detail["refused"] = d.refused
        if d.since is not None:  # the step whose learning rate a hold scales
            action.detail["since"] = d.since
        if d.error is not None:
            action.error = d.error
            return action
        if d.dry_run:
            action.dry_run = True
            log.warning("foreshock remedy (dry run): would %s for %s", d.kind, d.warning_id)
            return action
        if d.rollback_before is not None:
            self._roll_back(action, d.rollback_before)
        try:
            result = self._do(d)
            if result is not None:  # what the trainer did (the held lr, the layers switched)
                action.detail["result"] = result
            action.applied = True
            log.warning("foreshock remedy: %s at step %d for %s", d.kind, d.step, d.warning_id)
        except Exception as exc:  # a remedy that fails never stops training
            action.error = repr(exc)[:500]
            log.warning("foreshock remedy: %s failed: %r", d.kind, exc)
        if action.applied and d.hold_rising is not None:
            self._hold_if_risen(action, d.hold_rising)
        return action

    def _hold_if_risen(self, action: Action, since: int) -> None:
        """``hold_rising_lr``: the learning rate held where the evidence began, if it has
        risen since (the trainer judges: :data:`RATE_RISE`); a trainer that cannot say is
        left as it is. Never raises."""
        if getattr(self.remedies, "hold_if_risen", None) is None:
            return
        try:
            held = self._call("hold_if_risen", since, RATE_RISE)
        except Exception as exc:
            action.detail["hold_rising_error"] = repr(exc)[:500]
            return
        if held is not None:
            action.detail["held_lr"], action.detail["since"] = held, since
            log.warning("foreshock remedy: the learning rate had risen; held from step %d", since)

    def _roll_back(self, action: Action, before: int) -> None:
        """Restore the newest state before step ``before``; where none can be (no snapshot
        that old, a trainer without rollback) the remedy is still applied, and the reason
        kept in ``detail["rollback_error"]``: removing the cause is what saves a run."""
        try:
            action.rolled_back_to = self._call("rollback", before)
        except Exception as exc:
            action.detail["rollback_error"] = repr(exc)[:500]
            log.warning("foreshock remedy: rollback before %s failed: %r", action.kind, exc)

    def _kind_for(self, warning: RunWarning) -> str | None:
        cause = cause_of(warning)
        if cause is None or not _in_fault_direction(warning) or not self._trusted(warning):
            return None
        return self.policy.actions.get(cause)

    def _trusted(self, warning: RunWarning) -> bool:
        """Whether the warning's rule is trusted enough to act on unasked: its stated per-run
        false-alarm rate (the profile's calibration) at most the policy's bound."""
        bound, rate = self.policy.max_false_alarm_rate, warning.false_alarm_rate
        if bound is None or rate is None or rate <= bound:
            return True
        log.warning(
            "foreshock remedy: no action for %s: its rule's false-alarm rate %.3g is above "
            "the policy's %.3g",
            warning.id,
            rate,
            bound,
        )
        return False

    def _allowed(self, step: int, pending: list[Decision]) -> bool:
        """Within ``max_actions`` and ``backoff_steps`` (refusals count for neither)."""
        taken = [a for a in self.actions if "refused" not in a.detail]
        pending = [d for d in pending if not d.refused]
        if len(taken) + len(pending) >= self.policy.max_actions:
            return False
        last = pending[-1].step if pending else taken[-1].step if taken else None
        return last is None or step - last >= self.policy.backoff_steps

    def _remedy(self, kind: str, warning: RunWarning) -> Any:
        """The remedy for ``kind`` under the policy, asked of the trainer now (no rollback,
        no action kept): the lab's loss trigger applies its fix this way."""
        return self._do(decision_for(kind, warning, 0, self.policy))

    def _do(self, decision: Decision) -> Any:
        remedy: Remedy | None = REMEDIES.get(decision.kind)
        if remedy is None:  # never a fall-through to another remedy
            raise NotImplementedError(f"no remedy {decision.kind!r}: one of {list(REMEDIES)}")
        return remedy.apply(self.remedies, decision)

    def _call(self, method: str, *args: Any) -> Any:
        remedy = getattr(self.remedies, method, None)
        if remedy is None:
            raise NotImplementedError(f"this trainer offers no {method}")
        return remedy(*args)


def _in_fault_direction(warning: RunWarning) -> bool:
    """Whether the warning moved the way its series names a fault (:data:`FAULT_DIRECTION`;
    any way for a one-sided series). A person's request is not asked this."""
    metric = (warning.series or "").split("@")[0]
    wanted = FAULT_DIRECTION.get(metric)
    if wanted is None or warning.direction == wanted:
        return True
    log.warning(
        "foreshock remedy: no action for %s: %s moved %s, not %s, the way it names a fault",
        warning.id,
        metric,
        warning.direction,
        wanted,
    )
    return False
