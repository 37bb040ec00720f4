"""A remedy policy: which action answers which cause, and the bounds every action keeps.

Why apart from the :class:`~foreshock.remediation.remedy.Remediator` that applies it: a policy
is plain settings — read from a file, written into a run's labels, compared by the
benchmarks' stamps — and needs none of the machinery that acts (``foreshock.remediation.remedy``
has the table of what each action does).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from foreshock.remediation.remedies import REMEDIES

__all__ = ["CAUSES", "DEFAULT_ACTIONS", "RATE_RISE", "REMEDIES", "RemedyPolicy", "policy_summary"]

CAUSES = ("attention-numerics", "optimizer", "router")
DEFAULT_ACTIONS = {
    "attention-numerics": "precise-attention",
    "optimizer": "hold-lr",
    "router": "scale-router-lr",
}

# ``hold_rising_lr``: a learning rate "has risen" when the rate now exceeds RATE_RISE × its
# value at the warning's first evidence (a decaying or constant schedule never does; a warm-up
# still running over the evidence window may, and a warning then is held where it began)
RATE_RISE = 1.25


@dataclass(frozen=True)
class RemedyPolicy:
    """What to do, by the warning's cause (``actions``; a cause absent: nothing). Read from a
    TOML or JSON file with ``from_file``."""

    actions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    attention_scope: str = "all"  # precise-attention: "all" layers, or the named "module"
    lr_scale: float = 0.5  # hold-lr: the held learning rate, × its value at ``hold_from``
    # hold-lr: the rate it scales — when the warning's "evidence" began (its first record), or
    # at the "warning"
    hold_from: str = "evidence"
    router_lr_scale: float = 0.1  # scale-router-lr: the routers' learning rate factor
    # with precise-attention or scale-router-lr: also hold the learning rate at its value when
    # the warning's evidence began, if it has risen since by more than RATE_RISE (a rate that
    # rose while the mechanism broke is a cause of its own: a ramp caught through the router
    # or the attention it drives, which the mechanism's remedy alone does not stop)
    hold_rising_lr: bool = True
    # restore the newest snapshot before the warning's evidence first: for every cause (True),
    # none (False), or the causes listed (e.g. ["router"])
    # (the default: a router's, whose rows have aligned by the warning — holding its learning
    # rate from there keeps the routing collapsed: see the module docstring)
    rollback: bool | Sequence[str] = ("router",)
    # on the fallback profile (zero-shot: none was calibrated on this model) every action
    # restores that snapshot first: its warnings come late (its rules reach 25–34 % of the
    # envelope lead), and on two unseen models only acting on the undamaged weights ended
    # runs inside the healthy band (docs/remediation.md); in one process
    rollback_uncalibrated: bool = True
    max_actions: int = 3  # per run
    backoff_steps: int = 100  # steps between two actions
    dry_run: bool = False  # decide and report, do nothing
    # act on a warning only if its rule's stated per-run false-alarm rate is at most this
    # (None: any); a person's request (``approve``) is not gated
    max_false_alarm_rate: float | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.actions.values()) - set(REMEDIES))
        if unknown:
            raise ValueError(f"unknown remedy action(s) {unknown}; known: {list(REMEDIES)}")
        if not 0 < self.lr_scale <= 1 or not 0 < self.router_lr_scale <= 1:
            raise ValueError("lr_scale and router_lr_scale must be in (0, 1]")
        if self.hold_from not in ("evidence", "warning"):
            raise ValueError(f"hold_from must be 'evidence' or 'warning', got {self.hold_from!r}")
        if self.attention_scope not in ("all", "module"):
            raise ValueError(
                f"attention_scope must be 'all' or 'module', got {self.attention_scope!r}"
            )
        if self.max_actions < 0 or self.backoff_steps < 0:
            raise ValueError("max_actions and backoff_steps must be >= 0")
        if self.max_false_alarm_rate is not None and not 0 <= self.max_false_alarm_rate <= 1:
            raise ValueError("max_false_alarm_rate must be in [0, 1]")
        if not isinstance(self.rollback, bool):
            if isinstance(self.rollback, str) or not isinstance(self.rollback, Sequence):
                raise ValueError("rollback must be true, false or a list of causes")
            unknown = sorted(set(self.rollback) - set(CAUSES))
            if unknown:
                raise ValueError(f"rollback: unknown cause(s) {unknown}; known: {list(CAUSES)}")
            object.__setattr__(self, "rollback", tuple(self.rollback))

    def rolls_back(self, cause: str) -> bool:
        """Whether an action for ``cause`` restores a snapshot first."""
        return self.rollback if isinstance(self.rollback, bool) else cause in self.rollback

    @property
    def snapshots(self) -> bool:
        """Whether the trainer must keep snapshots: some cause rolls back."""
        return self.keeps_snapshots(CAUSES)

    def keeps_snapshots(self, causes: Iterable[str]) -> bool:
        """Whether a model that can have only ``causes`` needs snapshots: one of them rolls
        back and has an action (a dense model has no router cause: no router rollback)."""
        return any(self.rolls_back(c) and c in self.actions for c in causes)

    @classmethod
    def from_file(cls, path: str | Path) -> RemedyPolicy:
        """A policy file: TOML (a ``[remedy]`` table, or the top level) or JSON, with the
        fields above; unknown keys are refused, naming them."""
        path = Path(path)
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        data = data.get("remedy", data)
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"{path}: unknown policy keys {extra}; known: {sorted(known)}")
        return cls(**data)


def policy_summary(policy: RemedyPolicy) -> Mapping[str, Any]:
    """The policy as it goes into a run's labels."""
    return {**asdict(policy), "actions": dict(policy.actions)}
