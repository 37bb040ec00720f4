"""A numbered message as the Kafka sink sends it, or its stand-in when it can't be carried.

Why stand-ins: a valid record too large to carry (over the client's real limit:
``message.max.bytes`` less the key and the record framing, or the wire's
:data:`~foreshock.transport.wire.MAX_MESSAGE_BYTES`) must not leave a hole in its stream, and
must not block the spool behind it. So it is refused (kept whole in the rejects file) and
replaced by a *stand-in* with its seq: ``values`` empty, flag ``producer_rejected``, ``error``
saying why — the shape of the monitor's own error records, so the store shows the step and why
its values are missing. Splitting such a record by series was not done: one step would become
several messages with one seq each, and every consumer (storage's one row per step, the
detectors' step order) would have to learn to merge them. A message the wire format refuses
outright gives its seq back instead (the stream stays gap-free). A message the client or the
broker refuses once sent is *quarantined*: refused once however often it is retried, and its
stand-in sent in its place.
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.wire import MAX_MESSAGE_BYTES, WireError, encode, validate

from .rejects import Rejects, dumps, loads
from .spool import SpooledMessage
from .stream_numbers import StreamNumbers

__all__ = ["RECORD_OVERHEAD", "STAND_IN_FLAG", "Encoder"]

# librdkafka refuses a message when key + value + headers + this exceed ``message.max.bytes``
# (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD: a record's length, attributes, timestamp and offset
# deltas, key and value lengths and header count, each varint at its widest). Measured: with
# the default 1,000,000 it takes a value of at most 999,959 bytes under the 5-byte key "run-x".
RECORD_OVERHEAD = 36
STAND_IN_FLAG = "producer_rejected"
_STAND_IN_FIELD_BYTES = 4096  # a stand-in keeps every field of the refused message up to this
_QUARANTINE_MEMORY = 10_000  # digests of quarantined messages remembered, then forgotten


class Encoder:
    """Encodes numbered messages for ``topic`` under the client's ``max_message_bytes``."""

    def __init__(
        self, topic: str, max_message_bytes: int, rejects: Rejects, numbers: StreamNumbers
    ) -> None:
        self.topic, self.max_message_bytes = topic, max_message_bytes
        self._rejects, self._numbers = rejects, numbers
        self._quarantined: set[int] = set()

    def encode(self, message: dict[str, Any]) -> SpooledMessage | None:
        """The message as it goes on the wire; a stand-in if it is valid but too large to
        carry; None (its seq given back) if the wire format refuses it."""
        try:
            value = encode(message)  # first: it checks the run id the key is made of
        except WireError as exc:
            try:
                validate(message)
            except WireError:
                self._numbers.give_back(message)
                self._rejects.refuse("invalid", str(exc), message=message)
                return None
            text = dumps(message)
            kind = "too large" if len(text.encode()) > MAX_MESSAGE_BYTES else "not serialisable"
            return self._stand_in(message, kind, str(exc), text)
        item = SpooledMessage(self.topic, message["run_id"].encode(), value)
        if not self.fits(item):
            return self._stand_in(message, "too large", self.size_detail(item), item.value.decode())
        return item

    def _stand_in(
        self, message: dict[str, Any], kind: str, detail: str, text: str
    ) -> SpooledMessage | None:
        self._rejects.refuse(kind, detail, message=message, text=text)
        item = self.stand_in(message, kind, self.topic)
        if item is None:
            self._numbers.give_back(message)
        return item

    def stand_in(self, message: dict[str, Any], kind: str, topic: str) -> SpooledMessage | None:
        """A valid message with the refused one's seq: values emptied, flagged, the reason.
        Its other small fields stay (run, rank, step, time, labels, any the wire adds later)."""
        stand_in = {
            k: v
            for k, v in message.items()
            if k not in ("values", "flags", "error") and len(dumps(v)) <= _STAND_IN_FIELD_BYTES
        }
        if message.get("kind") == "metrics":
            stand_in["values"] = {}
        stand_in["flags"] = [STAND_IN_FLAG]
        stand_in["error"] = f"refused by the producer ({kind}); the record is " + (
            self._rejects.kept_where
        )
        try:
            item = SpooledMessage(topic, str(message["run_id"]).encode(), encode(stand_in))
        except (WireError, KeyError, UnicodeError):
            return None
        return item if self.fits(item) else None

    def quarantine(self, item: SpooledMessage, kind: str, detail: str) -> SpooledMessage | None:
        """The sending thread's refusal of an already numbered message: keep it in the rejects
        file (once, however often it is retried) and return its stand-in, if it can have one."""
        message = loads(item.value)
        digest = hash(item)
        if digest not in self._quarantined:
            if len(self._quarantined) > _QUARANTINE_MEMORY:
                self._quarantined.clear()
            self._quarantined.add(digest)
            self._rejects.refuse(kind, detail, message=message, item=item)
        return None if message is None else self.stand_in(message, kind, item.topic)

    def fits(self, item: SpooledMessage) -> bool:
        """Whether the client and the wire format both take ``item``."""
        return len(item.value) <= self.max_value_bytes(item.key)

    def max_value_bytes(self, key: bytes = b"") -> int:
        """The largest value this producer can send under ``key``: the wire's limit, or the
        client's real one (``message.max.bytes`` less the key and the record framing)."""
        return min(MAX_MESSAGE_BYTES, self.max_message_bytes - RECORD_OVERHEAD - len(key))

    def size_detail(self, item: SpooledMessage) -> str:
        return (
            f"message of {len(item.value):,} bytes; at most {self.max_value_bytes(item.key):,}"
            f" fit under key {item.key[:40]!r} (message.max.bytes "
            f"{self.max_message_bytes:,} less {RECORD_OVERHEAD} bytes of framing and the "
            f"key; the wire format's limit is {MAX_MESSAGE_BYTES:,})"
        )
