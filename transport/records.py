"""The monitoring record: one per (run, monitoring step), holding all values of that step.

Torch-free on purpose: consumers (detectors, storage, dashboard) parse records without torch.
It lives with the wire (:mod:`.wire`), below every room that writes or reads records.

A record is a JSON object::

    {"schema": "foreshock.metrics/1", "run_id": "...", "step": 120, "time": 1764513600.0,
     "rank": 0, "world_size": 1, "values": {"loss": 2.31, "attn.d2.entropy@h.0.attn#h3": 0.71},
     "flags": ["nonfinite:grad_norm"]}

Each value's key names a series: ``<metric>[@<module>][#h<head>]`` — the metric (its first dot
component hints at its family, :mod:`foreshock.catalogue` says which), the module path in the
model, and the head index for per-head values. A value is a float, or null where it is not
finite (a flag then says which).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "METRICS_SCHEMA",
    "RUN_SCHEMA",
    "MetricsRecord",
    "SeriesKey",
    "finite_or_none",
    "parse_series_key",
    "series_key",
]

METRICS_SCHEMA = "foreshock.metrics/1"
RUN_SCHEMA = "foreshock.run/1"  # a run's own records: kind "start" / "end" / "action"
_KEY = re.compile(r"^(?P<metric>[A-Za-z0-9_.]+)(?:@(?P<module>[^#@]*))?(?:#h(?P<head>\d+))?$")


class SeriesKey(NamedTuple):
    metric: str
    module: str | None
    head: int | None


def series_key(metric: str, module: str | None = None, head: int | None = None) -> str:
    """Build a series key.

    >>> series_key("attn.d2.entropy", "transformer.h.0.attn", 3)
    'attn.d2.entropy@transformer.h.0.attn#h3'
    >>> series_key("loss")
    'loss'
    """
    key = metric if module is None else f"{metric}@{module}"
    return key if head is None else f"{key}#h{head}"


def parse_series_key(key: str) -> SeriesKey:
    """Split a series key into (metric, module, head); ValueError on a malformed key.

    >>> parse_series_key("attn.d2.entropy@transformer.h.0.attn#h3")
    SeriesKey(metric='attn.d2.entropy', module='transformer.h.0.attn', head=3)
    >>> parse_series_key("grad_norm")
    SeriesKey(metric='grad_norm', module=None, head=None)
    """
    match = _KEY.match(key)
    if match is None:
        raise ValueError(f"malformed series key: {key!r}")
    head = match["head"]
    return SeriesKey(match["metric"], match["module"], None if head is None else int(head))


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN/Inf: non-finite values travel as null (and get a flag)."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class MetricsRecord:
    """One monitoring step of one run (and rank): the record the Monitor writes and the
    detectors and the store read (see the module docstring for the wire form).

    ``values`` maps series keys to floats, or None where a value was not finite (a flag then
    says which); ``emit_ranks`` is the Monitor's mode ("zero": one global record; "all": one
    per rank); ``error`` says why a step has no values (a monitoring step that failed whole).
    ``attempt`` and ``seq`` are the sender's stamps (:mod:`foreshock.transport.attempts`, the
    stream's sequence number): absent on a record the Monitor has just made.

    >>> r = MetricsRecord("r1", 120, {"loss": 2.31}, ("nonfinite:grad_norm",), time=0.0)
    >>> message = r.to_message()
    >>> message["schema"], message["flags"], "error" in message
    ('foreshock.metrics/1', ['nonfinite:grad_norm'], False)
    >>> MetricsRecord.from_message(message) == r
    True
    """

    run_id: str
    step: int
    values: Mapping[str, float | None]
    flags: tuple[str, ...] = ()
    rank: int = 0
    world_size: int = 1
    time: float = field(default_factory=time.time)
    emit_ranks: str | None = None
    error: str | None = None
    attempt: int | None = None
    seq: int | None = None

    @property
    def per_rank(self) -> bool:
        """A rank's own record in a run of several processes (not the one global record).

        >>> MetricsRecord("r", 1, {}, world_size=4, emit_ranks="zero").per_rank
        False
        >>> MetricsRecord("r", 1, {}, world_size=4).per_rank
        True
        """
        return self.world_size > 1 and self.emit_ranks != "zero"

    def to_message(self) -> dict[str, Any]:
        """The record as it goes on the wire (flags sorted; absent fields left out)."""
        message: dict[str, Any] = {
            "schema": METRICS_SCHEMA,
            "run_id": self.run_id,
            "step": int(self.step),
            "time": self.time,
            "rank": self.rank,
            "world_size": self.world_size,
        }
        if self.emit_ranks is not None:
            message["emit_ranks"] = self.emit_ranks
        message["values"] = dict(self.values)
        message["flags"] = sorted(self.flags)
        if self.error is not None:
            message["error"] = self.error
        for stamp in ("attempt", "seq"):
            if getattr(self, stamp) is not None:
                message[stamp] = getattr(self, stamp)
        return message

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> MetricsRecord:
        """A metrics message read back (a validated one: :func:`foreshock.transport.wire.
        validate`); fields the producer left out take their defaults."""
        return cls(
            run_id=str(message["run_id"]),
            step=int(message["step"]),
            values=message.get("values") or {},
            flags=tuple(message.get("flags") or ()),
            rank=int(message.get("rank") or 0),
            world_size=int(message.get("world_size") or 1),
            time=float(message.get("time") or 0.0),
            emit_ranks=message.get("emit_ranks"),
            error=message.get("error"),
            attempt=_int_or_none(message.get("attempt")),
            seq=_int_or_none(message.get("seq")),
        )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
