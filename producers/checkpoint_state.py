"""What a checkpoint keeps of the monitoring, so that a resumed job is a *later* attempt.

Attempts are ordered by the restart count first and the producer's start time second
(:mod:`foreshock.transport.attempts`): hosts' clocks skew, a restart count does not. So the
count travels with the trainer's checkpoint — saved beside the model's state, read back on
resume, one more — and the sink stamps the new attempt with it before its first message.
The ids of the approved requests the trainer was handed travel the same way: a request
applied before the checkpoint is refused if it comes again (a resume never re-applies it).
"""

from __future__ import annotations

import logging
from typing import Any

from foreshock.transport.attempts import restart_of

__all__ = ["load_monitoring_state", "monitoring_state"]

log = logging.getLogger("foreshock.monitor")


def monitoring_state(run_id: str, sink: Any) -> dict[str, Any]:
    """The run id, the attempt that wrote the checkpoint and its restart count, and the ids
    of the approved requests the trainer was handed (a resumed attempt refuses a replay)."""
    attempt = getattr(sink, "attempt", None)
    restart = restart_of(attempt) if isinstance(attempt, int) else 0
    state = {"run_id": run_id, "attempt": attempt, "restart": restart}
    seen = getattr(sink, "requests_seen", None)
    return {**state, "requests": list(seen())} if seen is not None else state


def load_monitoring_state(sink: Any, state: dict[str, Any]) -> bool:
    """Make ``sink``'s attempt one restart later than the checkpoint's. False (logged) when
    the state cannot be read: monitoring never stops a resume."""
    try:
        restart = int(state.get("restart") or 0) + 1
        resume = getattr(sink, "resume", None)
        if resume is not None:
            resume(restart)
        remember = getattr(sink, "remember_requests", None)
        if remember is not None and isinstance(state.get("requests"), list):
            remember([str(r) for r in state["requests"]])
        return True
    except Exception as exc:
        log.warning("foreshock monitor: checkpoint state not loaded: %r", exc)
        return False
