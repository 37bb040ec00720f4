"""Keep a stray job's records out of a live run's tables, as the messages arrive.

A run resumed from a checkpoint keeps its ``run_id`` and starts a new ``attempt`` (see
:mod:`foreshock.transport.wire`): it takes over, and its records are the run's. Another job
writing under a live run id (an evaluation reusing it) also shows up as a newer attempt; when
the store kept it beside the live one, the views — which show a run's newest attempt — showed
the stray's values and its ``end`` (the fleet page said ``finished`` while the run trained
on). So each (run, rank) has an :class:`~foreshock.transport.attempt_guard.AttemptGuard`, the
one the detectors decide with: a message of a **stray** attempt is stored apart — a
``dead_letters`` row with the reason and the whole message (source ``sink:identity``),
nothing lost — and the run's tables hold the live attempt, its resumes and its older
attempts' late spools, as before.

The guards live in the sink's memory: a sink restarted mid-run takes the first attempt it
then reads of each run as the live one (the detectors' worker, restarted, does the same).
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.attempt_guard import AttemptGuard

__all__ = ["AttemptTracker"]


class AttemptTracker:
    """``observe(message)`` → why a message goes apart (a stray attempt's), else None.

    >>> t = AttemptTracker()
    >>> [t.observe({"run_id": "r", "attempt": 1, "time": s}) for s in (1.0, 2.0, 3.0)]
    [None, None, None]
    >>> t.observe({"run_id": "r", "attempt": 2, "time": 3.5})  # a second job while 1 sends
    'run id collision: run r rank 0: attempt 2 writes while attempt 1 is live and does not resume it (no higher restart count): stored apart'
    >>> t.observe({"run_id": "r", "attempt": 2, "time": 900.0})  # 1 silent for 15 minutes
    """  # noqa: E501

    def __init__(self) -> None:
        self._guards: dict[tuple[str, int], AttemptGuard] = {}

    def observe(self, message: dict[str, Any]) -> str | None:
        key = (str(message.get("run_id")), _int(message.get("rank")))
        guard = self._guards.setdefault(key, AttemptGuard())
        live = guard.live
        if guard.classify(message) != "stray":
            return None
        return (
            f"run id collision: run {key[0]} rank {key[1]}: attempt "
            f"{_int(message.get('attempt'))} writes while attempt {live} is live and does not "
            "resume it (no higher restart count): stored apart"
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
