"""Trainer integrations: the ``Monitor`` as a callback of a training framework (optional extras).

* :mod:`foreshock.integrations.huggingface` — ``ForeshockCallback``, a
  ``transformers.TrainerCallback`` (``pip install 'foreshock[hf]'``);
* :mod:`foreshock.integrations.lightning` — ``ForeshockLightningCallback``, a
  ``lightning.pytorch.Callback`` / ``pytorch_lightning.Callback``
  (``pip install 'foreshock[lightning]'``).

This package imports without torch or any framework; each callback's module imports its
framework and raises an ``ImportError`` saying which extra to install when it is missing. The
names are also importable from here (lazily)::

    from foreshock.integrations import ForeshockCallback

What both callbacks share lives here: :class:`MonitoredRun`, one run's ``Monitor`` with its
``start`` and ``end`` lifecycle records, which never raises into the training loop. Its
``end`` record carries the run's exact ``divergence_step``: the project's divergence rule
applied to every step's loss (:mod:`foreshock.producers.divergence_watch`), not only to the
monitoring steps' the detectors see.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

from foreshock import __version__
from foreshock.extras import missing_extra
from foreshock.transport.records import RUN_SCHEMA

if TYPE_CHECKING:  # torch-free at run time
    from torch import nn

    from foreshock.detectors.divergence import DivergenceRule
    from foreshock.producers.monitor import Monitor, MonitorConfig
    from foreshock.producers.sinks import Sink

__all__ = [
    "ForeshockCallback",
    "ForeshockLightningCallback",
    "MonitoredRun",
    "RunAccess",
    "missing_extra",
]

log = logging.getLogger("foreshock.integrations")

_LAZY = {
    "ForeshockCallback": "huggingface",
    "ForeshockLightningCallback": "lightning",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)


def trainer_run_id(*candidates: Any, env: Mapping[str, str] | None = None) -> str | None:
    """A run id that survives a restart: ``$FORESHOCK_RUN_ID``, else ``$TORCHELASTIC_RUN_ID``
    (torchrun's job id, the same for every rank and every restart of the job), else the first
    of the trainer's own names given (HF ``args.run_name``, Lightning's logger name/version),
    made to fit the wire's rule; None leaves the choice to ``Monitor`` (a random id, which
    a resumed run cannot keep — pass ``run_id=`` then).

    >>> trainer_run_id("runs/llama 7b: lr=3e-4", env={})
    'runs-llama-7b:-lr=3e-4'
    >>> trainer_run_id("x", env={"TORCHELASTIC_RUN_ID": "job-42"})
    'job-42'
    >>> trainer_run_id(None, "", env={}) is None
    True
    """
    import re

    env = os.environ if env is None else env
    for value in (env.get("FORESHOCK_RUN_ID"), env.get("TORCHELASTIC_RUN_ID"), *candidates):
        if value is None or str(value).strip() in ("", "none"):
            continue
        text = re.sub(r"[^A-Za-z0-9._:@+=-]+", "-", str(value)).strip("-.")[:200]
        if text:
            return text
    return None


class RunAccess:
    """What both callbacks expose of their :class:`MonitoredRun` (``self.run``)."""

    run: MonitoredRun

    @property
    def run_id(self) -> str | None:
        return self.run.run_id

    @property
    def monitor(self) -> Any:
        """The ``Monitor`` once training began (``register_attention`` etc. go through it)."""
        return self.run.monitor


def make_config(config: MonitorConfig | None, options: dict[str, Any]) -> MonitorConfig:
    """A MonitorConfig from ``config`` or from its fields given as keyword options."""
    from foreshock.producers.monitor import MonitorConfig

    if config is not None and options:
        raise TypeError("give either config=MonitorConfig(...) or its fields, not both")
    return config if config is not None else MonitorConfig(**options)


class MonitoredRun:
    """One run's Monitor and lifecycle records, for a framework callback. Never raises.

    ``sink`` is a Sink (``write``/``close``) or a path: a ``JsonlSink`` is opened there when
    the run begins. ``begin`` builds the Monitor and writes the ``start`` record (labels: the
    caller's, over the framework's own), ``step`` forwards to ``Monitor.step`` and gives the
    step's loss to the divergence rule, ``finish`` writes the ``end`` record (with the rule's
    ``divergence_step``) and closes the Monitor and its sink. Only the ranks the Monitor
    emits from (rank 0 by default) write lifecycle records. A failure while building the
    Monitor disables monitoring for the run (logged); the training is never interrupted.

    Under torch.distributed each writing rank applies the rule to its *own* loss (rank 0's by
    default), not the mean over ranks a record carries: the mean would take a collective at
    every step, and one outside the Monitor's exchange could hang a job whose ranks disagree
    about monitoring (a rank whose Monitor failed to build). A divergence is one of the
    weights every data-parallel rank shares, so it shows in any rank's loss (a NaN reaches
    every rank through the gradient all-reduce): one rank's loss is noisier, which the rule's
    smoothing (EMA, 50 steps' patience) absorbs. It is also what a per-rank run
    (``emit_ranks="all"``) means: each rank's ``end`` judges its own loss, as the detectors
    read it (``detectors.streams``).
    """

    def __init__(
        self,
        sink: Sink | str | os.PathLike[str],
        run_id: str | None,
        config: MonitorConfig,
        labels: Mapping[str, Any] | None,
        framework: str,
        divergence: DivergenceRule | None = None,
    ) -> None:
        from foreshock.producers.divergence_watch import DivergenceWatch

        if sink is None:
            raise TypeError("a sink is required: a Sink (JsonlSink, KafkaSink, ...) or a path")
        self.sink_spec = sink
        self.run_id = run_id
        self.config = config
        self.labels = dict(labels or {})
        self.framework = framework
        self.monitor: Monitor | None = None
        self.divergence = DivergenceWatch(divergence)
        self.last_step: int | None = None
        self.state = "new"  # new → running → finished; or disabled
        # the Monitor's state_dict() from the checkpoint this run resumed from, if any: the
        # new attempt orders after the one that wrote it (foreshock.transport.attempts)
        self.resumed_from: dict[str, Any] | None = None

    def checkpoint_state(self) -> dict[str, Any]:
        """What the trainer's checkpoint keeps of the monitoring (``Monitor.state_dict``); the
        state it resumed from until the Monitor exists."""
        if self.monitor is not None:
            return self.monitor.state_dict()
        return dict(self.resumed_from or {})

    @property
    def running(self) -> bool:
        return self.state == "running" and self.monitor is not None

    def begin(
        self,
        model: nn.Module,
        labels: Mapping[str, Any] | None = None,
        *run_names: Any,
        optimizer: Any = None,
    ) -> None:
        """Build the Monitor on ``model`` and write the ``start`` record. Without a ``run_id``,
        the run is named by :func:`trainer_run_id` (from ``run_names``, the trainer's own),
        so that a run resumed from a checkpoint keeps its id."""
        if self.state != "new":
            if self.state == "finished":
                log.warning(
                    "foreshock: this callback already monitored a run and closed its "
                    "sink; use a new callback per training run"
                )
            return
        try:
            from foreshock.producers.monitor import Monitor
            from foreshock.producers.sinks import JsonlSink

            spec = self.sink_spec
            sink = JsonlSink(spec) if isinstance(spec, str | os.PathLike) else spec
            self.run_id = self.run_id or trainer_run_id(*run_names)
            self.monitor = Monitor(
                model, sink, run_id=self.run_id, config=self.config, optimizer=optimizer
            )
            if self.resumed_from is not None:
                self.monitor.load_state_dict(self.resumed_from)
            self.run_id = self.monitor.run_id
            self.state = "running"
        except Exception:
            self.state = "disabled"
            log.warning(
                "foreshock: monitoring disabled, the Monitor could not be built", exc_info=True
            )
            return
        if self.monitor.active:
            import torch

            merged = {
                "framework": self.framework,
                "foreshock": __version__,
                "torch": torch.__version__,
                **dict(labels or {}),
                **self.labels,
            }
            self._write(
                {
                    "schema": RUN_SCHEMA,
                    "kind": "start",
                    "run_id": self.run_id,
                    "rank": self.monitor.rank,
                    "time": time.time(),
                    "labels": merged,
                    "monitor": self.monitor.describe(),
                }
            )

    def step(self, step: int, loss: Any = None, own: bool = True) -> dict[str, Any] | None:
        """``Monitor.step`` (itself never raises); the record on monitoring steps. Call it at
        every optimizer step: the divergence rule reads every step's loss. ``own=False``: the
        loss is not this step's own (a framework's last logged value): the Monitor records
        it, the rule does not read it (a step it cannot see)."""
        if not self.running:
            return None
        self.last_step = step
        monitor = self.monitor
        assert monitor is not None
        record = monitor.step(step, loss=loss)
        if monitor.active:  # the ranks that write the end record
            self.divergence.observe(step, loss if own else None)
            if step % monitor.config.every == 0:
                self.divergence.drain()  # just after the Monitor's own device sync
        return record

    def finish(self, status: str = "finished", **fields: Any) -> None:
        """Write the ``end`` record and close the Monitor and its sink. Safe to call twice."""
        if not self.running:
            return
        monitor = self.monitor
        assert monitor is not None
        self.state = "finished"
        monitor.flush()  # the records still waiting for their spectra go before the end
        if monitor.active:
            self._write(
                {
                    "schema": RUN_SCHEMA,
                    "kind": "end",
                    "run_id": self.run_id,
                    "rank": monitor.rank,
                    "time": time.time(),
                    "status": status,
                    "last_step": self.last_step,
                    "records": monitor.records_written,
                    "monitor_errors": monitor.errors,
                    **self.divergence.end_fields(),
                    **fields,
                }
            )
        try:
            monitor.close()
        except Exception:
            log.warning("foreshock: closing the monitor failed", exc_info=True)

    def _write(self, record: dict[str, Any]) -> None:
        assert self.monitor is not None
        try:
            self.monitor.sink.write(record)
        except Exception:
            self.monitor.errors += 1
            log.warning("foreshock: could not write the %s record", record["kind"], exc_info=True)
