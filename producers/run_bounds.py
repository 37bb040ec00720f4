"""A run's ``start`` and ``end`` records when nothing else writes them: a Monitor in a plain loop.

The trainer integrations and the lab write a run's ``start`` record (labels, the model's
signature) before its first monitoring record and its ``end`` record after the last; a plain
training loop with ``Monitor(model, JsonlSink(...))`` wrote neither, and the file it left was
refused by ``foreshock detect --replay`` and ``store import`` ("no start record"). So a sink
that can tell whether a run's ``start`` went through it (``has_start(run_id)``: the local
sinks; the Kafka sink synthesises its own) gets one from the Monitor before the first record
when none did, and then an ``end`` record (status ``finished``, the last step) when the
Monitor closes. A sink that cannot tell is left alone: a second ``start`` is worse than none.

>>> import os, tempfile
>>> from foreshock.producers.sinks import JsonlSink, read_jsonl
>>> sink = JsonlSink(os.path.join(tempfile.mkdtemp(), "run.jsonl"))
>>> bounds = RunBounds("r1", 0, 1)
>>> bounds.before_first(sink, lambda: {"config": {}})
>>> bounds.before_first(sink, lambda: {"config": {}})   # once
>>> bounds.at_close(sink, last_step=99)
>>> [(r["kind"], r.get("status")) for r in read_jsonl(sink.path)]
[('start', None), ('end', 'finished')]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from foreshock import __version__
from foreshock.transport.records import RUN_SCHEMA

__all__ = ["RunBounds"]


class RunBounds:
    """Writes the ``start`` (and later the ``end``) a run's sink has not seen (see above)."""

    def __init__(self, run_id: str, rank: int, world_size: int) -> None:
        self.run_id, self.rank, self.world_size = run_id, rank, world_size
        self.checked = False
        self.wrote_start = False

    def before_first(self, sink: Any, describe: Callable[[], dict[str, Any]]) -> None:
        """Before the Monitor's first record: a ``start`` if the sink saw none for the run."""
        if self.checked:
            return
        self.checked = True
        has_start = getattr(sink, "has_start", None)
        if has_start is None or has_start(self.run_id):
            return
        import torch

        labels = {"framework": "plain", "foreshock": __version__, "torch": torch.__version__}
        sink.write({**self._head("start"), "labels": labels, "monitor": describe()})
        self.wrote_start = True

    def at_close(self, sink: Any, last_step: int) -> None:
        """The ``end`` of a run whose ``start`` this wrote (others end it themselves)."""
        if self.wrote_start and not getattr(sink, "has_end", lambda run_id: False)(self.run_id):
            sink.write({**self._head("end"), "status": "finished", "last_step": last_step})
            self.wrote_start = False

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "kind": kind,
            "run_id": self.run_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "time": time.time(),
        }
