"""A job every few seconds on a thread of its own, for as long as a ``with`` block runs.

The sink's step 5 (compaction, retention, vacuum) must not stall its loop, and a failure of
one round must not end the rounds to come: each is logged and retried at the next tick. The
thread stops with the block (and is joined), so a stopped sink leaves nothing running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["periodically"]

log = logging.getLogger("foreshock.storage.sink")


@contextmanager
def periodically(every: float, job: Callable[[], None], what: str) -> Iterator[None]:
    """Run ``job`` every ``every`` seconds on a daemon thread while the block runs; ``what``
    names it in the log and the thread's name."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                job()
            except Exception:
                log.exception("foreshock sink: %s failed (will retry)", what)

    thread = threading.Thread(target=loop, name=f"foreshock-{what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
