"""One receiver's deliveries, on a thread and a bounded queue of its own: a receiver that is down,
slow or hanging delays no other receiver.

Before this, the notifier sent each event to its targets one after the other, each with up to
a 5 s timeout per try: one receiver that hung held every other one (and the consumer loop) for
as long. Now the notifier only queues (:meth:`Courier.submit` never blocks), and each courier
sends its own queue in order — so a receiver still sees a warning's ``opened`` before its
``cleared`` — retrying what may pass (connection errors, timeouts, 5xx, 429) with exponential
backoff and jitter (:func:`~foreshock.notify.delivery.backoff_delay`, at least a 429's
``Retry-After``, at most ``max_delay``) until it passes or the job has waited ``patience``
seconds (or, if set, ``retries`` retries). What may not pass (another 4xx) is dropped at once.

A receiver that stays down fills its queue: past ``capacity`` the oldest job is dropped (and
logged) — memory is bounded and the newest state (a resolve) is what is kept. Each job's
``done(delivered, answer)`` runs on the courier's thread once it is settled (delivered, given
up, refused or dropped); the notifier commits a warning's offset only when every courier has
settled it. :meth:`Courier.close` gives what is queued one try each within a grace period and
abandons the rest *unsettled* (``done`` is not called): the next notifier sends it again.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .delivery import backoff_delay, request
from .stats import CourierStats
from .targets import Target

__all__ = ["Courier", "Job"]

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One request: ``method url`` with ``body`` (JSON bytes), and who to tell once settled."""

    url: str
    body: bytes | None
    method: str = "POST"
    what: str = "warning"  # for logs: never the URL (a Slack URL's path is its secret)
    done: Callable[[bool, Any], None] | None = None
    queued: float = field(default_factory=time.monotonic)


class Courier:
    """Sends one target's jobs in order; ``stats`` counts delivered, failed (refused or given
    up), dropped (queue full), retries and abandoned (left at close) jobs."""

    def __init__(
        self,
        target: Target,
        timeout: float = 5.0,
        backoff: float = 0.5,
        max_delay: float = 60.0,
        patience: float = 900.0,
        retries: int | None = None,
        capacity: int = 1000,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.target, self.timeout, self.backoff, self.max_delay = (
            target,
            timeout,
            backoff,
            max_delay,
        )
        self.patience, self.retries, self.capacity, self.jitter = (
            patience,
            retries,
            capacity,
            jitter,
        )
        self.stats = CourierStats()
        self._queue: deque[Job] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._closing = threading.Event()
        self._deadline = math.inf
        self._down_since: float | None = None
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"foreshock-notify {target.where}"
        )
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; never blocks (past ``capacity`` the oldest queued job is dropped)."""
        dropped = None
        with self._cv:
            if len(self._queue) >= self.capacity:
                dropped = self._queue.popleft()
                self.stats.dropped += 1
            self._queue.append(job)
            self._cv.notify()
        if dropped is not None:
            log.warning(
                "foreshock notify: %s: %d deliveries queued; dropped the oldest (%s)",
                self.target.where,
                self.capacity,
                dropped.what,
            )
            _settle(dropped, False, None)

    def pending(self) -> int:
        """Jobs queued or in flight."""
        with self._cv:
            return len(self._queue) + self._busy

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or in flight; False if ``timeout`` s passed first."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def stop(self, grace: float) -> None:
        """Start closing: one try each for what is queued, for at most ``grace`` s."""
        with self._cv:
            self._deadline = time.monotonic() + grace
            self._closing.set()
            self._cv.notify_all()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def close(self, grace: float = 10.0) -> None:
        self.stop(grace)
        self.join(grace + self.timeout + 1.0)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing.is_set():
                    self._cv.wait()
                if not self._queue:
                    return
                if self._closing.is_set() and time.monotonic() > self._deadline:
                    self.stats.abandoned += len(self._queue)
                    self._queue.clear()
                    self._cv.notify_all()
                    return
                job = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(job)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _deliver(self, job: Job) -> None:
        """Try ``job`` until it passes, cannot pass, or has waited long enough."""
        tries = 0
        while True:
            outcome = request(self.target, job.url, job.body, job.method, self.timeout)
            tries += 1
            if outcome.ok:
                if self._down_since is not None:
                    log.warning(
                        "foreshock notify: %s is back after %.0f s",
                        self.target.where,
                        time.monotonic() - self._down_since,
                    )
                    self._down_since = None
                self.stats.delivered += 1
                _settle(job, True, outcome.answer)
                return
            if not outcome.retry:
                log.error(
                    "foreshock notify: %s refused the %s (not retried): %s",
                    self.target.where,
                    job.what,
                    outcome.reason,
                )
                self.stats.failed += 1
                _settle(job, False, None)
                return
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "foreshock notify: %s: %s; retrying with backoff (the other receivers go on)",
                    self.target.where,
                    outcome.reason,
                )
            if self._closing.is_set():
                self.stats.abandoned += 1  # unsettled: the next notifier sends it again
                return
            waited = time.monotonic() - job.queued
            if (self.retries is not None and tries > self.retries) or waited >= self.patience:
                log.warning(
                    "foreshock notify: %s: %s after %d tries in %.0f s; giving up on the %s",
                    self.target.where,
                    outcome.reason,
                    tries,
                    waited,
                    job.what,
                )
                self.stats.failed += 1
                _settle(job, False, None)
                return
            delay = max(
                backoff_delay(tries, self.backoff, self.max_delay, self.jitter), outcome.wait
            )
            delay = min(delay, self.max_delay, max(self.patience - waited, 0.0))
            log.debug(
                "foreshock notify: %s: %s; retry in %.2g s",
                self.target.where,
                outcome.reason,
                delay,
            )
            self.stats.retries += 1
            self._closing.wait(delay)


def _settle(job: Job, delivered: bool, answer: Any) -> None:
    if job.done is None:
        return
    try:
        job.done(delivered, answer)
    except Exception:  # the notifier's bookkeeping must not kill a courier
        log.exception("foreshock notify: settling a delivery failed")
