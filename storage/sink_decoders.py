"""How the sink decodes what it consumes beside the metrics: warnings and dead letters.

A warning is checked only as far as its dedup key needs (``key_only``): the batch builder
checks the rest, and a warning that fails there becomes a dead-letter *row* with the reason
instead of being lost at the consumer. A dead letter never fails to decode: it is stored as it
came, with the reason and origin its headers give.
"""

from __future__ import annotations

from typing import Any

from foreshock.transport.warning import decode

__all__ = ["decode_dead_letter", "decode_warning", "header_int"]


def decode_warning(raw: Any) -> dict[str, Any]:
    """A ``foreshock.warning/1`` event, or :class:`WireError` (the consumer dead-letters it)."""
    return decode(raw.value(), key_only=True)


def decode_dead_letter(raw: Any) -> dict[str, Any]:
    """The raw bytes with the reason, source topic and origin the headers give."""
    headers = {}
    for key, value in raw.headers() or []:
        if isinstance(value, str):
            value = value.encode("utf-8", "replace")
        headers[str(key)] = (value or b"").decode("utf-8", "replace")
    return {
        "raw": raw.value(),
        "reason": headers.get("reason") or "(no reason header)",
        "source": headers.get("topic", "?"),
        "origin_partition": headers.get("partition"),
        "origin_offset": headers.get("offset"),
    }


def header_int(value: Any) -> int | None:
    """A header's partition or offset; None unless it is an int64.

    >>> header_int("12"), header_int("x"), header_int(2**63)
    (12, None, None)
    """
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if -(2**63) <= number < 2**63 else None
