"""Live runs take up a profile published while they train, at a record boundary.

Why: a fleet's profile of a model is built from its ended runs (:mod:`.profile_builder`), but
the runs of that model still training were chosen a profile at their start — the zero-shot
fallback, the one that leads least. Waiting for their next start would leave a week-long run
on the fallback for its whole life.

How: a run judged by the fallback keeps the messages it was fed (at most :data:`MAX_KEPT`; a
run past that stays where it is). When the worker loads a config whose choice for the run's
``start`` is a profile other than the fallback, fresh detectors replay the kept messages with
nothing emitted and take over at the next record: from there the run warns exactly as if the
new profile had judged it from its first record (a test holds them equal). A run with an open
warning is not switched — the warning must be closed by the detectors that opened it — and is
tried again at the next reload. Each switch is an event (:class:`Switch`): the worker logs it
and hands it to its ``on_switch`` (the store's profile lineage, the Profiles page).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from .config import DetectorConfig
from .profiles import ProfileConfigs, choose_profile
from .streams import RunStreams

__all__ = ["MAX_KEPT", "Switch", "switch"]

MAX_KEPT = 20_000  # messages a fallback-judged run keeps for a switch (~ one value each)


@dataclass(frozen=True)
class Switch:
    """One live run moved to another profile: at which record, from what, to what, why."""

    run_id: str
    step: int | None  # the last step judged by the old profile
    from_profile: str
    to_profile: str
    reason: str
    time: float

    def to_dict(self) -> dict[str, Any]:
        return {"action": "switched", **asdict(self)}


def switch(
    run: RunStreams, fresh: DetectorConfig | ProfileConfigs
) -> tuple[RunStreams, Switch] | None:
    """``run`` rebuilt under ``fresh`` if that config now chooses it another profile than the
    fallback it is judged by (see the module docstring), with the event; else None."""
    if not run.keeping or run.alerts_open or not run.kept:
        return None
    old = run.profile
    new = choose_profile(fresh, run.start)
    if new.name == old.name or new.name == getattr(fresh, "fallback", None):
        return None
    rebuilt = RunStreams(run.run_id, fresh)
    for message in run.kept:
        rebuilt.update(message)
    last = next((m.get("step") for m in reversed(run.kept) if m.get("step") is not None), None)
    event = Switch(run.run_id, last, old.name, new.name, new.reason, time.time())
    return rebuilt, event
