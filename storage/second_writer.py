"""One writer group per store.

Two sink groups each read every message, and each sink dedups against what *it* has seen:
both write every record (58 seqs gave 116 step rows) — a renamed group at a redeploy, two
compose stacks on one bucket. So a sink whose store another group committed to in the last
``writer_window`` seconds refuses to start (``SecondWriterError``), unless told to
``take_over`` — and, since a group idle for longer than the window went unseen, a running sink
holds a **lease** in the store (:class:`WriterLease`), renewed while it runs and checked
before every commit.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from foreshock.transport.service import ServiceRefusedError

__all__ = ["LEASE_FILE", "SecondWriterError", "WriterLease", "refuse_a_second_writer"]

log = logging.getLogger("foreshock.storage.sink")


class SecondWriterError(ServiceRefusedError):
    """Another sink group writes this store."""


def refuse_a_second_writer(
    store: Any, uri: str, group_id: str, window: float, take_over: bool
) -> None:
    """Raise ``SecondWriterError`` when another group committed to ``store`` within
    ``window`` seconds (unless ``take_over``: then say so and go on)."""
    others = {
        group: ago for group, ago in store.recent_writers(window).items() if group != group_id
    }
    if not others or take_over:
        if others:
            log.warning("foreshock sink: taking the store over from %s", sorted(others))
        return
    group, ago = min(others.items(), key=lambda item: item[1])
    raise SecondWriterError(
        f"the store {uri} is written by sink group {group!r} (its last commit "
        f"{ago:.0f} s ago); a second group would store every record twice. Stop it and "
        f"use --group {group}, or, once it is stopped, --take-over (or wait "
        f"{window / 60:.0f} min)"
    )


LEASE_FILE = "_writer_lease.json"  # in the store's root: {group, holder, expires}
LEASE_TTL = 60.0  # s: a lease not renewed for this long is free (its sink died)
RENEW_EVERY = 10.0  # s: how often a running sink renews, idle or not


class WriterLease:
    """The store's writer lease (see the module docstring): ``acquire`` at start, ``renew``
    before every commit and every ``RENEW_EVERY`` s while idle, ``release`` at close.

    The commits-in-a-window check alone let a second group in after the first had been idle
    for ``writer_window`` (10 min), and the next run was stored twice; the lease is held as
    long as the first sink runs, whatever it writes. Another group's live lease refuses the
    start (``SecondWriterError`` naming it), and a sink whose lease another group took over
    stops at its next commit rather than write beside it. Torn-free: the lease file is
    written whole (a PUT on object storage; under the store folder's lock on a local disk).
    """

    def __init__(self, location: Any, group_id: str, ttl: float = LEASE_TTL) -> None:
        import uuid

        from .store_files import StoreFiles

        self.files = StoreFiles(location, "")
        self.group_id, self.ttl = group_id, ttl
        self.holder = f"{group_id}/{uuid.uuid4().hex[:12]}"
        self._renewed = 0.0

    def acquire(self, take_over: bool = False) -> None:
        with self.files.lock():
            held = self._held_by_other()
            if held is not None and not take_over:
                raise SecondWriterError(
                    f"the store {self.files} is leased by sink group {held['group']!r} "
                    f"(for {held['expires'] - time.time():.0f} s more, renewed while it runs); a "
                    f"second group would store every record twice. Stop it, or use --group "
                    f"{held['group']}, or --take-over once it is stopped"
                )
            if held is not None:
                log.warning("foreshock sink: taking the store's lease over from %s", held["group"])
            self._write()

    def renew(self, force: bool = True) -> None:
        """Renew the lease (``force`` False: only when ``RENEW_EVERY`` has passed);
        ``SecondWriterError`` when another group holds it now."""
        if not force and time.monotonic() - self._renewed < RENEW_EVERY:
            return
        try:
            with self.files.lock():
                held = self._held_by_other()
                if held is None:
                    self._write()
        except OSError as exc:  # the store away: its commits fail and are retried anyway
            log.warning("foreshock sink: the writer lease was not renewed (%s)", exc)
            return
        if held is not None:
            raise SecondWriterError(
                f"sink group {held['group']!r} took the store's lease over: this sink stops "
                "rather than store its records twice"
            )

    def release(self) -> None:
        """Free the store, if this sink holds the lease (another of its group may renew it)."""
        with self.files.lock():
            lease = json.loads(self.files.read_text(LEASE_FILE) or "{}")
            if lease.get("holder") == self.holder:
                self.files.write_text(LEASE_FILE, json.dumps({"released": self.holder}))

    def _held_by_other(self) -> dict[str, Any] | None:
        try:
            lease = json.loads(self.files.read_text(LEASE_FILE) or "{}")
        except ValueError:
            return None  # a lease file that does not parse holds nothing
        live = isinstance(lease.get("expires"), int | float) and lease["expires"] > time.time()
        ours = lease.get("group") == self.group_id  # sinks of one group share the partitions
        return lease if live and not ours and lease.get("group") else None

    def _write(self) -> None:
        lease = {"group": self.group_id, "holder": self.holder, "expires": time.time() + self.ttl}
        self.files.write_text(LEASE_FILE, json.dumps(lease))
        self._renewed = time.monotonic()
