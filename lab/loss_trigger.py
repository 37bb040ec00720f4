"""Loss-triggered rollback as trainers practise it today: the baseline a remedy must beat.

Why it is here: foreshock's remedies act on a warning's *cause* before the loss moves; what
trainers do instead reacts to the loss after it moved — PaLM restarted ~100 steps before a
spike and skipped 200–500 batches, OLMo-core skips outlier steps, llm-foundry's
``KillLossSpike`` stops the run. The lab reproduces that reaction on the same training
computation, so the two are compared run for run (``python -m benchmarks.remediation``):

* the trigger is the project's divergence rule (:mod:`foreshock.detectors.divergence`) applied
  online to every step's loss — it confirms a divergence ``patience`` steps after it starts;
* the reaction restores the newest snapshot at least ``back`` steps before the divergence
  step, skips ``skip_batches`` batches (the data that preceded the blow-up are not replayed),
  and trains on — the schedule rewinds with the weights, as a checkpoint restore does;
* ``fix``: the remedy action applied at the same time, as if the operator had guessed the
  cause (``None``: the fault is left on, which is what a loss watchdog knows to do);
* at most ``max_rollbacks``; after that the run goes on as it is.

A loss that jumps 7 nats at step 300: the smoothed loss crosses its best + 0.5 at 301, and the
rule confirms that divergence 50 steps later, at 350 — the step the reaction comes at.

>>> trigger = LossTrigger(LossTriggerPolicy())
>>> fired = [trigger.observe(step, 2.0 if step < 300 else 9.0) for step in range(400)]
>>> [s for s, d in enumerate(fired) if d is not None], trigger.fired
([350], [301])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from foreshock.detectors.divergence import DivergenceRule, LossDivergence
from foreshock.remediation.remedies import REMEDIES

__all__ = ["LossTrigger", "LossTriggerPolicy"]


@dataclass(frozen=True)
class LossTriggerPolicy:
    """The reaction to a confirmed loss divergence (see the module docstring)."""

    back: int = 100  # steps before the divergence step the restored snapshot is at least
    skip_batches: int = 200  # batches skipped after the restore
    max_rollbacks: int = 3
    fix: str | None = None  # a remedy action applied with the rollback; None: fault left on
    rule: DivergenceRule = field(default_factory=DivergenceRule)

    def __post_init__(self) -> None:
        if self.fix is not None and self.fix not in REMEDIES:
            raise ValueError(f"unknown fix {self.fix!r}; known: {list(REMEDIES)}")
        if self.back < 0 or self.skip_batches < 0 or self.max_rollbacks < 0:
            raise ValueError("back, skip_batches and max_rollbacks must be >= 0")

    def summary(self) -> dict[str, Any]:
        """For the run's labels."""
        return asdict(self)


class LossTrigger:
    """``observe(step, loss)`` at every step: the divergence step once the rule confirms one,
    else None; then the rule starts afresh (the restored run is a new history)."""

    def __init__(self, policy: LossTriggerPolicy) -> None:
        self.policy = policy
        self.fired: list[int] = []  # the divergence steps it reacted to
        self._rule = LossDivergence.of(policy.rule)

    def observe(self, step: int, loss: float) -> int | None:
        self._rule.update(step, loss)
        diverged = self._rule.divergence_step
        if diverged is None:
            return None
        self.fired.append(diverged)
        self._rule = LossDivergence.of(self.policy.rule)
        return diverged

    def restart(self, losses: list[float]) -> None:
        """Replay the kept history into a fresh rule (after a restore to ``len(losses)``)."""
        self._rule = LossDivergence.of(self.policy.rule)
        for step, loss in enumerate(losses):
            self._rule.update(step, loss)

    @property
    def spent(self) -> bool:
        return len(self.fired) >= self.policy.max_rollbacks
