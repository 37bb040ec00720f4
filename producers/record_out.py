"""The Monitor's records as they leave it: non-finite values made null and flagged, and the
error record a failed monitoring step writes in place of its metrics.

Why here and not in the wire format: a NaN or Inf is not an error of the monitoring (a
diverging run makes them), so it must never stop a record — but JSON has no NaN, and a
consumer must tell "no value" from "a value that blew up". Each becomes null with a flag
naming where it came from: ``nonfinite@<module>`` for a module's series, ``nonfinite:<key>``
for a run-level one (loss, grad_norm, …).

>>> message, nonfinite = finite_record("r", 5, {"loss": float("nan"), "grad_norm": 1.0}, set())
>>> message["values"], nonfinite
({'loss': None, 'grad_norm': 1.0}, ['nonfinite:loss'])
"""

from __future__ import annotations

import logging
from typing import Any

from foreshock.transport.records import MetricsRecord, parse_series_key

__all__ = ["error_record", "finite_record", "say_nonfinite"]

log = logging.getLogger("foreshock.monitor")


def finite_record(
    run_id: str,
    step: int,
    values: dict[str, float],
    flags: set[str],
    rank: int = 0,
    world_size: int = 1,
    emit_ranks: str = "zero",
) -> tuple[dict[str, Any], list[str]]:
    """The metrics message, and the ``nonfinite`` flags it carries (sorted; empty when every
    value was finite)."""
    out: dict[str, float | None] = {}
    for key, value in values.items():
        if not _nonfinite(value):
            out[key] = value
            continue
        module = parse_series_key(key).module
        flags.add(f"nonfinite@{module}" if module else f"nonfinite:{key}")
        out[key] = None
    nonfinite = sorted(f for f in flags if f.startswith("nonfinite"))
    record = MetricsRecord(
        run_id, int(step), out, tuple(flags), rank, world_size, emit_ranks=emit_ranks
    )
    return record.to_message(), nonfinite


def say_nonfinite(step: int, nonfinite: list[str]) -> None:
    """The one log line for a run's first record with non-finite values."""
    log.warning(
        "foreshock monitor: non-finite values at step %s (%s); they are "
        "emitted as null with these flags, and this is logged once",
        step,
        ", ".join(nonfinite),
    )


def error_record(
    run_id: str, step: Any, last_step: int, exc: Exception, rank: int = 0, world_size: int = 1
) -> dict[str, Any]:
    """A valid metrics message (the wire format wants step >= 0) flagged ``monitor_error``:
    stamped with ``step``, or with ``last_step`` when ``step`` is not a usable step number."""
    try:
        stamp = int(step)
    except Exception:
        stamp = -1
    if stamp < 0:
        stamp = max(last_step, 0)
    failed = MetricsRecord(
        run_id, stamp, {}, ("monitor_error",), rank, world_size, error=repr(exc)[:500]
    )
    return failed.to_message()


def _nonfinite(value: Any) -> bool:
    """NaN or ±Inf (a None, a value already missing, is not)."""
    return value != value or value in (float("inf"), float("-inf"))
