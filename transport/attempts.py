"""The order of a run's attempts: what the checkpoint carried first, the clock only second.

A run resumed from a checkpoint keeps its run id and starts a new *attempt* (a new producer:
:mod:`foreshock.transport.wire`). Every consumer must agree on which attempt is the newest —
the detectors follow it, the store's views show its values and status, the dashboard numbers
attempts by it, a replay feeds them in its order — and neither a clock nor the broker can say:

* a host whose clock is behind starts a *later* attempt with an *earlier* start time;
* a crashed attempt's spool flushed late from another host reaches the broker *after* the
  attempt that replaced it.

What the producer knows and no clock can invert is its **restart count**: how many times the
run was restarted before this attempt. It travels with the checkpoint the attempt resumed
from (``Monitor.state_dict()``, which the Hugging Face and Lightning callbacks save and load
with the trainer's own checkpoints), or comes from the scheduler
(``TORCHELASTIC_RESTART_COUNT`` under torchrun, ``SLURM_RESTART_COUNT`` under Slurm), or is
given (``KafkaSink(restart=…)``, ``FORESHOCK_RESTART``). The attempt number is the restart
count in its high bits and the producer's start time (µs) below them,

    attempt = restart · 2^52 + (start_µs mod 2^52),

so ordering attempts as integers — which every consumer already did, the store's views in
SQL included — orders them by restart count first and by start time only between attempts
that know nothing of each other (two fresh starts). 2^52 µs is 142 years; restart counts up
to 2^11 − 1 fit the wire's int64. An attempt number written before this scheme is restart 0
with its start time: it orders as it always did.

>>> a = attempt_number(0, 1_800_000_000_000_000)
>>> b = attempt_number(1, 1_799_999_940_000_000)  # resumed on a host 60 s behind
>>> b > a, restart_of(b), restart_of(a)
(True, 1, 0)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

__all__ = ["MAX_RESTART", "attempt_number", "restart_of", "scheduler_restart"]

TIME_BITS = 52
MAX_RESTART = (1 << 11) - 1
RESTART_VARIABLES = ("FORESHOCK_RESTART", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")

log = logging.getLogger(__name__)


def attempt_number(restart: int, started_us: int | None = None) -> int:
    """The attempt number of a producer restarted ``restart`` times, started at
    ``started_us`` (µs since the epoch; default now). Restart counts beyond
    :data:`MAX_RESTART` count as it (logged)."""
    if started_us is None:
        started_us = time.time_ns() // 1000
    if not 0 <= restart <= MAX_RESTART:
        log.warning("restart count %s outside 0..%d: clamped", restart, MAX_RESTART)
        restart = min(max(restart, 0), MAX_RESTART)
    return (restart << TIME_BITS) | (started_us % (1 << TIME_BITS))


def restart_of(attempt: int) -> int:
    """The restart count an attempt number carries (0 for one written before this scheme)."""
    return int(attempt) >> TIME_BITS


def scheduler_restart(environ: Mapping[str, str] | None = None) -> int:
    """The restart count the environment gives (see the module docstring), else 0.

    >>> scheduler_restart({"TORCHELASTIC_RESTART_COUNT": "2"})
    2
    >>> scheduler_restart({"SLURM_RESTART_COUNT": "x"})
    0
    """
    environ = os.environ if environ is None else environ
    for name in RESTART_VARIABLES:
        text = environ.get(name)
        if text is not None and text.strip().isdigit():
            return int(text)
    return 0
