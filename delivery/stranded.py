"""Spooled messages whose topic the broker no longer has: set aside, so the spool moves on.

Why: a spool is re-sent in order, and a message is only dropped from it once the broker
acknowledged it. A message for a topic the broker does not have — an earlier run's spool,
written under another topic name (a renamed prefix, a topic deleted since) — is never
acknowledged; its send times out exactly as if the broker were down, the producer backs off,
and every spool behind it, the live run's own included, waited forever.

So before a spooled batch is sent, its topics are looked up in the broker's metadata (which a
reachable broker answers at once). Messages for a topic it does not have are *stranded*:
appended, whole and in the spool's own format, to ``<spool_dir>/<spool>.stranded``, with one
loud log line per topic saying how to get them back (create the topic, rename the file to
``.spool``: the next producer or ``foreshock spool flush`` re-sends it). Stranded files are
removed after :data:`KEEP_DAYS` untouched, like rejects files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from .spool import SpooledMessage, spool_line, write_all

__all__ = ["KEEP_DAYS", "expire_kept", "strand"]

log = logging.getLogger(__name__)

KEEP_DAYS = 30  # a rejects or stranded file untouched this long is removed by the next producer
_KEPT = ("*.rejects", "*.stranded")


def strand(spool_path: Path, messages: list[SpooledMessage], missing: set[str]) -> Path:
    """Append ``messages`` to the stranded file beside ``spool_path``; log once per topic.
    Raises ``OSError`` if it cannot be written (the caller then keeps them spooled)."""
    path = spool_path.with_suffix(".stranded")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        write_all(fd, b"".join(spool_line(m) for m in messages))
        os.fsync(fd)
    finally:
        os.close(fd)
    for topic in sorted(missing):
        count = sum(m.topic == topic for m in messages)
        log.error(
            "foreshock: the broker has no topic %r: %d spooled messages for it set aside in %s "
            "(to re-send them, create the topic and rename the file to .spool)",
            topic,
            count,
            path,
        )
    return path


def expire_kept(spool_dir: str | os.PathLike[str], keep_days: float = KEEP_DAYS) -> int:
    """Remove the rejects and stranded files in ``spool_dir`` untouched for ``keep_days``
    (each is named in the log when it is made, and when it goes): a fleet's producers used to
    leave them forever. Returns how many. Never raises: a folder that can't be read is left."""
    removed, cutoff = 0, time.time() - keep_days * 86400
    with contextlib.suppress(OSError):
        for path in [p for pattern in _KEPT for p in Path(spool_dir).glob(pattern)]:
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
                    log.info("foreshock: removed %s (older than %s days)", path, keep_days)
    return removed
