"""A consumed message and where it came from: the envelope every consumer service reads.

Why a type: a message's place in the log (topic, partition, offset) and the broker's time are
not part of the message; carried as magic ``_``-keys inside it, every reader had to strip them
and a writer could forget to. The consumer (:mod:`foreshock.transport.consumer`) hands out
:class:`Consumed` envelopes; the services read ``.message`` and the place beside it.

A decoder that finds a message unusable either raises
:class:`~foreshock.transport.wire.WireError` (the consumer dead-letters it) or
:class:`SkippedMessageError` (handed out with ``invalid`` set and an empty message: the
service counts it and moves on, where a dead letter would only be noise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Consumed", "SkippedMessageError"]


class SkippedMessageError(Exception):
    """Raised by a decoder for a message its service skips (counted, not dead-lettered)."""


@dataclass
class Consumed:
    """One message as consumed: the decoded ``message``; its ``topic``, ``partition`` and
    ``offset``; the broker's ``time`` (s since the epoch; None where it gave none);
    ``invalid``: why a decoder skipped it (then ``message`` is empty).

    >>> c = Consumed({"run_id": "r1", "seq": 0}, "foreshock.metrics", 2, 41)
    >>> c.message["run_id"], c.partition, c.offset, c.invalid
    ('r1', 2, 41, None)
    """

    message: Any  # a wire message (a dict), or what the topic's decoder made (a WarningEvent)
    topic: str
    partition: int
    offset: int
    time: float | None = None
    invalid: str | None = None
