"""Which job may write a run: the live attempt, a resume that replaces it, or a stray.

A run id names one training job. A resume from a checkpoint starts a new attempt under it
(:mod:`foreshock.transport.attempts`) and must take over: the detectors follow it, the store
shows it. But another producer writing under a live run id — an evaluation job reusing the
id, a copy-pasted launch script — also starts a newer attempt, and when the detectors
followed whatever attempt was newest, one record of such a job blinded them: the live run
diverged with no warning, and the fleet page showed the stray's ``end`` as the run's.

So a newer attempt takes over only when it says it is a resume, or when the live attempt is
gone:

* its **restart count** is above the live attempt's: it resumed from a checkpoint the run
  wrote (what the HF and Lightning callbacks, torchrun and Slurm carry), or
* the live attempt has been **silent** for ``STALE_AFTER_S`` of producer time when the newer
  attempt's message was made: a job resubmitted by hand after a crash, that lost its
  restart count, is not left unwatched.

Any other newer attempt is a **stray** (until the live attempt falls silent that long: then
it is the replacement after all): its messages never displace the live attempt's —
the detectors skip them and raise one ``collision`` warning, the sink stores them apart
(dead letters, with the reason) — and an older attempt's messages (a crashed job's spool
flushed late) are ``OLDER``, as before. Both sides (:mod:`foreshock.detectors.engine`,
:mod:`foreshock.storage.attempts`) decide with this one class, message by message in the
order the broker gives them, so they agree.

>>> guard = AttemptGuard()
>>> [guard.classify({"attempt": 10, "time": t}) for t in (0.0, 25.0)]
['live', 'live']
>>> guard.classify({"attempt": 11, "time": 30.0})  # a second job while the run sends
'stray'
>>> guard.classify({"attempt": 10, "time": 50.0}), guard.classify({"attempt": 9, "time": 1.0})
('live', 'older')
>>> guard.classify({"attempt": (1 << 52) + 5, "time": 60.0})  # resumed from a checkpoint
'takeover'
"""

from __future__ import annotations

import math
from typing import Any, Literal

from .attempts import restart_of

__all__ = ["STALE_AFTER_S", "AttemptGuard", "Verdict"]

# Seconds of producer time the live attempt must have been silent for a newer attempt of the
# same restart count to replace it. A live job writes a record every few seconds to minutes
# (a checkpoint save or an evaluation pause it for longer, rarely 5 minutes); a job
# resubmitted after a crash starts after the scheduler's queue and the model's load.
STALE_AFTER_S = 300.0

Verdict = Literal["live", "takeover", "older", "stray"]


class AttemptGuard:
    """``classify(message)``: the verdict on one message of one (run, rank), in order."""

    def __init__(self) -> None:
        self.live: int | None = None  # the attempt followed
        self.strays: set[int] = set()  # attempts refused while the live one wrote
        self._last_time: float | None = None  # the live attempt's newest producer time

    def classify(self, message: dict[str, Any]) -> Verdict:
        if message.get("attempt") is None:  # unstamped (a file written before attempts)
            return "live"
        verdict = self.peek(message)
        attempt, time = _attempt(message), _time(message)
        if verdict == "stray":
            self.strays.add(attempt)
        elif verdict in ("live", "takeover"):
            if verdict == "takeover":
                self._last_time = None
            self.live = attempt
            if time is not None:
                self._last_time = max(time, self._last_time or time)
        return verdict

    def peek(self, message: dict[str, Any]) -> Verdict:
        """The verdict ``classify`` would give, nothing remembered."""
        attempt = _attempt(message)
        if self.live is None or attempt == self.live or message.get("attempt") is None:
            return "live"
        if attempt < self.live:
            return "older"
        if restart_of(attempt) > restart_of(self.live) or self._silent(_time(message)):
            return "takeover"
        return "stray"

    def _silent(self, time: float | None) -> bool:
        last = self._last_time
        return time is not None and last is not None and time - last >= STALE_AFTER_S


def _attempt(message: dict[str, Any]) -> int:
    value = message.get("attempt")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _time(message: dict[str, Any]) -> float | None:
    value = message.get("time")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
