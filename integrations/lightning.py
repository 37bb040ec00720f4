"""The Monitor as a Lightning callback (``pip install 'foreshock[lightning]'``).

Usage::

    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.producers.sinks import JsonlSink

    callback = ForeshockLightningCallback(JsonlSink("runs/r1.jsonl"), run_id="r1", every=10)
    lightning.pytorch.Trainer(max_steps=1000, callbacks=[callback]).fit(module, loader)

The callback is a ``lightning.pytorch.Callback`` and, where ``pytorch_lightning`` is installed
too (``lightning`` installs it), also a ``pytorch_lightning.Callback``: either Trainer takes it.

Hooks:

* ``on_fit_start`` builds the ``Monitor`` on the LightningModule (module names in records are
  then prefixed by its attribute, e.g. ``model.h.0.attn``) and writes the ``start`` record;
* ``on_train_batch_end`` measures, on the batches after which an optimizer update happened
  (``trainer.global_step`` moved since ``on_train_batch_start``). With automatic optimisation
  Lightning runs ``optimizer.step(closure)`` and then this hook; ``zero_grad`` runs only inside
  the *next* batch's closure, after that batch's ``training_step``. So here the weights are the
  updated ones and the gradients still the step's: the place the Monitor is meant to be called.
  ``on_before_zero_grad`` is *not* that place in Lightning 2.x: it fires inside the closure of
  the following step, after its forward, before the very first update (no gradients yet),
  and never after the last update; the router statistics gathered in a step's forward would
  be reported against the previous step;
* ``on_fit_end`` writes the ``end`` record and closes; ``on_exception`` does so with status
  ``crashed``;
* with ``remedy=``: ``on_train_batch_start`` snapshots (a policy that rolls back) and
  ``on_train_batch_end`` of an update acts on its warnings and approved requests (Lightning
  has stepped the scheduler by then: the boundary before the next update).

Sharded strategies need nothing more: every rank runs the callback, so every rank builds a
Monitor and measures with its peers (``producers.collective``). ``ModelParallelStrategy``
(FSDP2/TP in ``configure_model``) holds DTensors, gathered per layer. ``FSDPStrategy`` (FSDP1)
wraps the LightningModule from outside in a root whose flat shards the module's parameters
view: the callback hands that root (``trainer.strategy.model``) to the Monitor's peers, and
discovery and each monitoring step read the parameters whole inside ``summon_full_params``
(``fsdp1.whole_parameters``; ``use_orig_params=True``, Lightning's default). Series of
an FSDP1-wrapped block carry its ``_fsdp_wrapped_module`` in their module names.

The trackers (``trackers=True``): at every monitoring step foreshock's scalars
(:mod:`.trackers`: one per mechanism metric, and the warnings of the detectors run in-process)
go to each of ``trainer.loggers`` through ``log_metrics``, at the step Lightning logs the same
update's metrics at (the record's). Not through ``pl_module.log``: that writes only every
``log_every_n_steps``, which would drop a warning between two. Warning texts go where the
logger takes text: TensorBoard's ``foreshock/warning`` text series, MLflow run tags.

Steps are the 0-based index of the optimizer update (``trainer.global_step - 1`` after it),
as in the lab's loops. The loss is the ``loss`` of ``training_step``'s output (``outputs`` of
``on_train_batch_end``), summed over the micro-batches of an accumulated update (Lightning has
already divided each by ``accumulate_grad_batches``); under manual optimisation the last
batch's. Without one there, ``trainer.callback_metrics[loss_key]`` is used.

The ``end`` record's ``divergence_step``: the project's divergence rule applied to every
update's loss (``MonitoredRun``, :mod:`foreshock.producers.divergence_watch`), null when the
run did not diverge. A ``callback_metrics`` loss may be an epoch's aggregate, not the
update's: the rule does not read it, and the record then has no ``divergence_step`` (the
detectors estimate it).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from foreshock.detectors.trackers import TEXT_KEY, TrackerFeed, TrackerUpdate
from foreshock.integrations import MonitoredRun, RunAccess, make_config, missing_extra

_bases: list[type] = []
_versions: dict[str, str] = {}
try:
    import lightning
    from lightning.pytorch import Callback as _LightningCallback

    _bases.append(_LightningCallback)
    _versions["lightning"] = lightning.__version__
except ImportError:
    pass
try:
    import pytorch_lightning
    from pytorch_lightning import Callback as _PLCallback

    _bases.append(_PLCallback)
    _versions["pytorch_lightning"] = pytorch_lightning.__version__
except ImportError:
    pass
if not _bases:
    raise missing_extra(__name__, "lightning (or pytorch_lightning)", "lightning")

if TYPE_CHECKING:
    import torch

    from foreshock.detectors.config import DetectorConfig
    from foreshock.detectors.divergence import DivergenceRule
    from foreshock.detectors.profiles import ProfileConfigs
    from foreshock.producers.monitor import MonitorConfig
    from foreshock.producers.sinks import Sink
    from foreshock.remediation.remedy import RemedyPolicy

__all__ = ["ForeshockLightningCallback"]

log = logging.getLogger("foreshock.integrations.lightning")

_LOSS_KEYS = ("train_loss", "loss", "train/loss")


class _ForeshockHooks(RunAccess):
    """The callback's behaviour; combined below with each installed Lightning's Callback."""

    def __init__(
        self,
        sink: Sink | str | os.PathLike[str],
        run_id: str | None = None,
        *,
        config: MonitorConfig | None = None,
        labels: Mapping[str, Any] | None = None,
        loss_key: str | None = None,
        trackers: bool = True,
        warnings: bool | DetectorConfig | ProfileConfigs = True,
        divergence: DivergenceRule | None = None,
        remedy: RemedyPolicy | str | os.PathLike[str] | None = None,
        **config_options: Any,
    ) -> None:
        super().__init__()
        # here, not above: it imports torch, and a missing extra must fail on the framework
        from foreshock.remediation.hooks import RemedyHooks

        self.feed = TrackerFeed(warnings)
        self.remedy = RemedyHooks(remedy, warnings, self.feed)
        config = make_config(config, config_options)
        self.run = MonitoredRun(sink, run_id, config, labels, "lightning", divergence)
        self.loss_key = loss_key
        self._trackers = trackers
        self._failed_trackers: set[str] = set()
        self._step_before: int | None = None
        self._loss: torch.Tensor | float | None = None

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Kept in Lightning's checkpoints: the monitoring's state (its attempt and restart
        count), so a run resumed from one continues as a later attempt whatever the clocks."""
        return {"monitor_state": self.run.checkpoint_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kept = state_dict.get("monitor_state") if isinstance(state_dict, dict) else None
        self.run.resumed_from = kept if isinstance(kept, dict) else {"restart": 0}

    # ---- events -------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            labels = _labels(trainer)
        except Exception:
            labels = {}
        wrappers = _outer_wrappers(trainer, pl_module)
        with _whole_parameters(pl_module, wrappers):  # FSDP1: discovery reads whole weights
            optimizer = (getattr(trainer, "optimizers", None) or [None])[0]
            self.run.begin(pl_module, labels, _logger_run_name(trainer), optimizer=optimizer)
        monitor = self.run.monitor if self.run.running else None
        peers = monitor.peers if monitor is not None else None
        if peers is not None:
            peers.roots.extend(wrappers)  # each monitoring step reads them whole again
        if self.run.running:
            signature = self.run.monitor.signature() if self.run.monitor else None
            self.feed.start(self.run.run_id, {**labels, **self.run.labels}, signature)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_before = trainer.global_step

        def setup() -> tuple[Any, Any, Any]:  # the trainer's, once the remedy starts
            saved_in = getattr(getattr(trainer, "checkpoint_callback", None), "dirpath", None)
            if self.remedy.checkpoints is None and saved_in:
                from foreshock.remediation.checkpoints import LightningCheckpoints

                self.remedy.checkpoints = LightningCheckpoints(saved_in)
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
            return trainer.optimizers[0], (schedulers or [None])[0], pl_module

        monitor = self.run.monitor if self.run.running else None
        self.remedy.before_step(monitor, trainer.global_step, setup)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.run.running:
            return
        loss = None
        try:
            self._gather_loss(trainer, outputs)
        except Exception:
            log.debug("foreshock: no loss in this batch's outputs", exc_info=True)
        step = trainer.global_step
        if self._step_before is None or step == self._step_before:
            return  # a micro-batch of an accumulating update: no optimizer step yet
        own = self._loss is not None  # training_step's own; callback_metrics' may be stale
        try:
            loss = self._loss if own else self._metric_loss(trainer)
        except Exception:
            log.debug("foreshock: no loss for this step", exc_info=True)
        self._loss = None
        record = self.run.step(step - 1, loss=loss, own=own)
        update = self.feed.update(record) if record is not None else None
        if update is not None and self._trackers:
            self._report(trainer, update)
        if self.remedy.at_boundary(step, update):  # the scheduler has stepped: a boundary
            trainer.should_stop = True
        _extend(trainer, self.remedy.take_extension())  # a rollback's steps, trained again
        for resolved in self.remedy.take_updates():  # the warnings its actions resolved
            if self._trackers:
                self._report(trainer, resolved)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        status, fields = self.remedy.finish("finished")
        self.run.finish(
            status, global_step=trainer.global_step, **fields, **self.feed.profile_fields()
        )

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        _, fields = self.remedy.finish("crashed")
        error = repr(exception)[:500]
        self.run.finish("crashed", global_step=trainer.global_step, error=error, **fields)

    # ---- internals ----------------------------------------------------------------------
    def _report(self, trainer: Any, update: TrackerUpdate) -> None:
        """Write ``update`` through every logger of the trainer; a failing one is skipped."""
        for logger in getattr(trainer, "loggers", None) or []:
            name = type(logger).__name__
            try:
                _report_to(logger, update)
            except Exception:
                if name not in self._failed_trackers:  # once per logger, not every step
                    self._failed_trackers.add(name)
                    log.warning(
                        "foreshock: %s could not log foreshock's scalars", name, exc_info=True
                    )

    def _gather_loss(self, trainer: Any, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not _is_scalar(loss):
            return
        loss = loss.detach()
        automatic = getattr(trainer.lightning_module, "automatic_optimization", True)
        if automatic and self._loss is not None:
            self._loss = self._loss + loss  # each already divided by accumulate_grad_batches
        else:
            self._loss = loss

    def _metric_loss(self, trainer: Any) -> Any:
        metrics = trainer.callback_metrics
        for key in (self.loss_key,) if self.loss_key else _LOSS_KEYS:
            value = metrics.get(key)
            if _is_scalar(value):
                return value.detach()
        return None


def _report_to(logger: Any, update: TrackerUpdate) -> None:
    """One Lightning logger's share of ``update`` (its ``log_metrics`` and, for TensorBoard and
    MLflow, the warning texts); Lightning's loggers write on global rank 0 only."""
    if update.scalars:
        logger.log_metrics(update.scalars, step=update.step)
    text = update.text()
    if not text:
        return
    kinds = {cls.__name__ for cls in type(logger).__mro__}
    if "TensorBoardLogger" in kinds:
        logger.experiment.add_text(TEXT_KEY, text, update.step)
    elif "MLFlowLogger" in kinds and logger.run_id is not None:
        for key, value in update.tags().items():
            logger.experiment.set_tag(logger.run_id, key, value)


def _outer_wrappers(trainer: Any, pl_module: Any) -> list[Any]:
    """The strategy's wrapper around the LightningModule (``FSDPStrategy``: the FSDP1 root,
    which the module's own ``modules()`` do not reach), if there is one."""
    from torch import nn

    model = getattr(getattr(trainer, "strategy", None), "model", None)
    return [model] if isinstance(model, nn.Module) and model is not pl_module else []


def _whole_parameters(pl_module: Any, wrappers: list[Any]) -> contextlib.ExitStack:
    """``fsdp1.whole_parameters`` under a process group (FSDP1 keeps flat shards outside
    forward; summoning them is a collective every rank enters from ``on_fit_start``). A
    failure to enter is logged, never raised: the Monitor then sees the shards."""
    import torch

    stack = contextlib.ExitStack()
    dist = torch.distributed
    if not (wrappers and dist.is_available() and dist.is_initialized()):
        return stack
    try:
        from foreshock.producers.fsdp1 import whole_parameters

        stack.enter_context(whole_parameters(pl_module, wrappers))
    except Exception:
        log.warning("foreshock: could not read the FSDP1 parameters whole", exc_info=True)
    return stack


def _is_scalar(value: Any) -> TypeGuard[torch.Tensor]:
    import torch

    return isinstance(value, torch.Tensor) and value.numel() == 1


def _labels(trainer: Any) -> dict[str, Any]:
    labels: dict[str, Any] = dict(_versions)
    fields = {
        "max_steps": getattr(trainer, "max_steps", None),
        "max_epochs": getattr(trainer, "max_epochs", None),
        "accumulate_grad_batches": getattr(trainer, "accumulate_grad_batches", None),
        "precision": getattr(trainer, "precision", None),
        "world_size": getattr(trainer, "world_size", None),
    }
    labels["trainer"] = {k: v for k, v in fields.items() if v not in (None, "")}
    return labels


class ForeshockLightningCallback(_ForeshockHooks, *_bases):  # type: ignore[misc]
    """Attach foreshock's ``Monitor`` to a Lightning ``Trainer.fit`` run.

    sink:     a Sink (``JsonlSink``, ``KafkaSink``, ...) or a path for a ``JsonlSink``; closed
              at the end of fit
    run_id:   the run's id (default: a random one, see ``Monitor``); ``self.run_id`` after start
    config:   a ``MonitorConfig``, or its fields as keyword options (``every=10``, ...)
    labels:   free-form labels for the ``start`` record; they override the callback's own
    loss_key: the ``callback_metrics`` key of the training loss, used where ``training_step``
              returns none (default: the first of train_loss, loss, train/loss)
    trackers: write the mechanism series and the warnings through ``trainer.loggers`` (see the
              module docstring)
    warnings: run the detectors in the trainer process (:class:`.trackers.TrackerFeed`):
              ``True`` with the shipped calibrated profiles, or a ``DetectorConfig`` /
              ``ProfileConfigs``; ``False`` for the series only
    divergence: the ``DivergenceRule`` applied to every step's loss for the ``end`` record's
              ``divergence_step`` (default: the project's, the lab's)
    remedy:   a ``RemedyPolicy`` (or a policy file's path) acting on the in-process warnings
              at the end of each update's batch (the scheduler has stepped): precise attention,
              the learning rate held, the routers' scaled, stop (``trainer.should_stop``), a
              rollback (:mod:`foreshock.remediation.runner`); each action an ``action``
              record in the sink. Off by default

    One callback per fit: after ``on_fit_end`` its sink is closed.
    """


def _logger_run_name(trainer: Any) -> str | None:
    """``<logger name>-version_<version>``: what Lightning names a run's log folder, and what
    a run resumed with ``ckpt_path`` under the same logger version keeps."""
    logger = getattr(trainer, "logger", None)
    version = getattr(logger, "version", None) if logger is not None else None
    if version is None:
        return None
    version = version if isinstance(version, str) else f"version_{version}"
    return f"{getattr(logger, 'name', None) or 'lightning'}-{version}"


def _extend(trainer: Any, steps: int) -> None:
    """Lengthen a step-bounded fit by ``steps`` (an epoch-bounded one ends with its data)."""
    loop = trainer.fit_loop.epoch_loop
    if steps and loop.max_steps != -1:
        loop.max_steps += steps
