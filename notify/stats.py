"""The notify service's counts, and each receiver's courier's.

Dataclasses rather than dicts of names: a miscounted key is an AttributeError at once, not a
new zero that no exit line or test reads. ``as_dict()`` is what the CLI prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from foreshock.transport.service_loop import ServiceStats

__all__ = ["CourierStats", "NotifierStats"]


@dataclass
class NotifierStats(ServiceStats):
    """``delivered`` and ``failed`` count (event, target) pairs settled (failed: refused, given
    up on, or dropped from a full queue); ``duplicates`` events dropped as repeats; ``skipped``
    updates not sent (``updates=False``) and people's events on resolved warnings;
    ``replayed`` history events read to rebuild the ledger; ``invalid`` messages that are not
    warning events; ``refreshed`` Alertmanager re-posts queued."""

    delivered: int = 0
    failed: int = 0
    duplicates: int = 0
    skipped: int = 0
    replayed: int = 0
    invalid: int = 0
    refreshed: int = 0


@dataclass
class CourierStats(ServiceStats):
    """One receiver's jobs: ``delivered``; ``failed`` (refused or given up on); ``dropped``
    from a full queue (settled as failed); ``retries`` sent again; ``abandoned`` unsettled at
    close (the next notifier sends them again)."""

    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    retries: int = 0
    abandoned: int = 0
