"""The Monitor as a Hugging Face ``transformers.TrainerCallback`` (``pip install 'foreshock[hf]'``).

Usage::

    from foreshock.integrations.huggingface import ForeshockCallback
    from foreshock.producers.sinks import JsonlSink

    callback = ForeshockCallback(JsonlSink("runs/r1.jsonl"), run_id="r1", every=10)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()

Hooks:

* ``on_train_begin`` builds the ``Monitor`` on the trainer's model (the ``model`` argument of
  the callback events: the unwrapped model) and writes the run's ``start`` record;
* ``on_optimizer_step`` (transformers ≥ 4.41) measures. The Trainer calls it right after
  ``optimizer.step()`` and before ``lr_scheduler.step()`` / ``model.zero_grad()``: the weights
  are the updated ones and the gradients still those of the step, which is where the Monitor
  wants to be called (``grad_norm`` needs them). ``on_step_end`` comes after ``zero_grad()``;
  it is used only where ``on_optimizer_step`` did not run for the step (older transformers, or
  a Trainer subclass that skips it), and its records then lack ``grad_norm``;
* ``on_step_end`` also writes the step's mechanism series and warnings through the Trainer's
  ``report_to`` loggers (below);
* ``on_train_end`` writes the ``end`` record and closes the Monitor and its sink;
* with ``remedy=``: ``on_step_begin`` snapshots (a policy that rolls back) and ``on_step_end``
  acts on the step's warnings and approved requests, after the scheduler's step and
  ``zero_grad()``: the boundary before the next update.

The trackers (``trackers=True``): foreshock's scalars (:mod:`.trackers`: one per mechanism
metric, and the warnings of the detectors run in-process) go to each ``report_to`` callback
(TensorBoard, MLflow, W&B, ...) as an ``on_log`` of their own once a monitoring step's record
is written, at the ``global_step`` of the loss of the record's update (the spectra worker
writes it a step later). Not merged into the Trainer's own
``logs``: those come every ``logging_steps`` and reach the ``report_to`` callbacks before this
one (user callbacks come after them), so a warning would wait for, or miss, a logging step.
The callback finds the Trainer's callbacks through the handler calling its first event (no
argument of the events names it); ``attach(trainer)`` says it explicitly. Warning texts go
where the tracker takes text: TensorBoard and W&B as the ``foreshock/warning`` text series,
MLflow as run tags.

Steps are numbered like the lab's loops: the 0-based index of the optimizer update (the
Trainer's ``global_step`` during ``on_optimizer_step``): its step ``n`` is the record's ``n - 1``.

The loss: the Trainer hands callbacks no per-step loss (``log_history`` holds it only at the
logging steps, and after the step). A forward hook on the model keeps the ``loss`` of each
training forward (detached, on device: no sync) since the last update; the step's loss is their
mean, or their sum where the Trainer passed ``num_items_in_batch`` (the model then normalised
each micro-batch by the whole accumulated batch's token count). A model whose output has no
``loss`` (a ``compute_loss_func`` or label smoothing) falls back to the last logged loss.

The ``end`` record's ``divergence_step``: the project's divergence rule applied to every
update's loss (``MonitoredRun``, :mod:`foreshock.producers.divergence_watch`), null when the
run did not diverge. A step whose loss is the logged fallback is one the rule cannot read;
the record then has no ``divergence_step`` and the detectors estimate it.

Sharded training (accelerate's FSDP2 from ``TrainingArguments(fsdp=True, fsdp_config=...)``)
needs nothing more: the Trainer calls the callback on every rank, every rank builds a Monitor on
the model FSDP2 shards in place (DTensors, gathered per layer: ``producers.collective``).

A run that raises is not seen by the callback (the Trainer has no exception event): no ``end``
record then (the Kafka sink synthesises a ``closed`` one at exit).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from foreshock.detectors.trackers import TEXT_KEY, TrackerFeed, TrackerUpdate
from foreshock.integrations import MonitoredRun, RunAccess, make_config, missing_extra
from foreshock.integrations.recipes import trainer_recipe

try:
    import transformers
    from transformers import TrainerCallback
except ImportError as exc:
    raise missing_extra(__name__, "transformers", "hf") from exc
try:  # a checkpoint's callback states (transformers ≥ 4.41)
    from transformers.trainer_callback import ExportableState
except ImportError:  # older: the monitoring state is not kept; a resume orders by its clock

    class ExportableState:  # type: ignore[no-redef]
        pass


if TYPE_CHECKING:
    import torch

    from foreshock.detectors.config import DetectorConfig
    from foreshock.detectors.divergence import DivergenceRule
    from foreshock.detectors.profiles import ProfileConfigs
    from foreshock.producers.monitor import MonitorConfig
    from foreshock.producers.sinks import Sink
    from foreshock.remediation.remedy import RemedyPolicy

__all__ = ["ForeshockCallback"]

log = logging.getLogger("foreshock.integrations.huggingface")

_ARG_LABELS = (
    "learning_rate",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
)


class ForeshockCallback(RunAccess, TrainerCallback, ExportableState):
    """Attach foreshock's ``Monitor`` to a ``transformers.Trainer`` run.

    sink:    a Sink (``JsonlSink``, ``KafkaSink``, ...) or a path for a ``JsonlSink``; closed
             at the end of training
    run_id:  the run's id (default: a random one, see ``Monitor``); ``self.run_id`` after start
    config:  a ``MonitorConfig``, or its fields as keyword options (``every=10``, ...)
    labels:  free-form labels for the ``start`` record (project, scenario, ...); they override
             the ones the callback adds (framework and versions, a few TrainingArguments)
    max_logit: record each attention layer's largest logit on monitoring steps, through
             transformers' attention registry (``integrations.hf_attention``)
    trackers: write the mechanism series and the warnings through the Trainer's ``report_to``
             loggers (see the module docstring)
    warnings: run the detectors in the trainer process (:class:`.trackers.TrackerFeed`):
             ``True`` with the shipped calibrated profiles, or a ``DetectorConfig`` /
             ``ProfileConfigs``; ``False`` for the series only
    divergence: the ``DivergenceRule`` applied to every step's loss for the ``end`` record's
             ``divergence_step`` (default: the project's, the lab's)
    remedy:  a ``RemedyPolicy`` (or a policy file's path) acting on the in-process warnings
             at the step boundaries (``on_step_end``, before the next update): precise
             attention, the learning rate held, the routers' scaled, stop (the Trainer's
             ``should_training_stop``), a rollback (:mod:`foreshock.remediation.runner`);
             each action an ``action`` record in the sink. Off by default

    One callback per training run: after ``on_train_end`` its sink is closed. Each checkpoint
    keeps the monitoring's state (``ExportableState``: the attempt and its restart count), and
    a run resumed from it continues as a later attempt whatever the hosts' clocks say. (Leave
    ``restore_callback_states_from_checkpoint`` off: it rebuilds callbacks without their sink.)
    """

    def __init__(
        self,
        sink: Sink | str | os.PathLike[str],
        run_id: str | None = None,
        *,
        config: MonitorConfig | None = None,
        labels: Mapping[str, Any] | None = None,
        max_logit: bool = True,
        trackers: bool = True,
        warnings: bool | DetectorConfig | ProfileConfigs = True,
        divergence: DivergenceRule | None = None,
        remedy: RemedyPolicy | str | os.PathLike[str] | None = None,
        **config_options: Any,
    ) -> None:
        # here, not above: it imports torch, and a missing extra must fail on the framework
        from foreshock.remediation.hooks import RemedyHooks

        self.feed = TrackerFeed(warnings)
        self.remedy = RemedyHooks(remedy, warnings, self.feed)
        self._max_logit = max_logit
        config = make_config(config, config_options)
        self.run = MonitoredRun(sink, run_id, config, labels, "transformers", divergence)
        self._trackers = trackers
        self._handler: Any = None  # the Trainer's CallbackHandler
        self._pending: TrackerUpdate | None = None  # measured, not yet written to the trackers
        self._failed_trackers: set[str] = set()
        self._losses: list[torch.Tensor] = []
        self._losses_summed = False
        self._hook: Any = None
        self._optimizer_stepped_at: int | None = None

    def state(self) -> dict[str, Any]:
        """For the Trainer's checkpoints (``ExportableState``): the monitoring's state."""
        return {"args": {}, "attributes": {"monitor_state": self.run.checkpoint_state()}}

    def attach(self, trainer: Any) -> None:
        """Name the Trainer whose ``report_to`` loggers get foreshock's scalars (found by
        itself when the Trainer calls the callback; needed only if that fails)."""
        self._handler = trainer.callback_handler

    # ---- events -------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._find_handler()

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        self._find_handler()  # a callback added after the Trainer's __init__ starts here
        if model is None:
            log.warning("foreshock: on_train_begin without a model; monitoring disabled")
            return
        self.run.resumed_from = _resumed_from(state, type(self).__name__)
        try:
            labels = _labels(args, model, getattr(state, "max_steps", None))
        except Exception:
            labels = {}
        name = getattr(args, "run_name", None)
        self.run.begin(model, labels, name, optimizer=kwargs.get("optimizer"))
        if self.run.running:
            signature = self.run.monitor.signature() if self.run.monitor else None
            self.feed.start(self.run.run_id, {**labels, **self.run.labels}, signature)
        monitor = self.run.monitor if self.run.running else None
        if monitor is not None and self._max_logit:
            try:
                from foreshock.producers.hf_attention import record_max_logit

                record_max_logit(model, monitor)
            except Exception:
                log.warning("foreshock: no max_logit for this model", exc_info=True)
        if self.run.running:
            try:
                self._hook = model.register_forward_hook(self._keep_loss, with_kwargs=True)
            except Exception:
                log.warning("foreshock: no loss hook on the model", exc_info=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        def setup() -> tuple[Any, Any, Any]:  # the Trainer's, once the remedy starts
            strategy = getattr(args.save_strategy, "value", args.save_strategy)
            if self.remedy.checkpoints is None and strategy == "steps" and args.output_dir:
                from foreshock.remediation.checkpoints import HFCheckpoints

                self.remedy.checkpoints = HFCheckpoints(args.output_dir)
            return kwargs["optimizer"], kwargs.get("lr_scheduler"), kwargs["model"]

        self.remedy.before_step(
            self.monitor if self.run.running else None, state.global_step, setup
        )

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After optimizer.step(), before zero_grad(); global_step is not yet incremented.
        self._optimizer_stepped_at = state.global_step
        self._step(state.global_step, state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After zero_grad() and global_step += 1: only a fallback, where on_optimizer_step
        # did not run for this update.
        step = state.global_step - 1
        if self._optimizer_stepped_at != step:
            self._step(step, state)
        update = self._pending
        self._report(args, _at_update(state, update), control, kwargs)
        if self.remedy.at_boundary(state.global_step, update):  # acts before the next update
            control.should_training_stop = True
        state.max_steps += self.remedy.take_extension()  # a rollback's steps, trained again
        for resolved in self.remedy.take_updates():  # the warnings its actions resolved
            self._pending = resolved
            self._report(args, state, control, kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._pending = None  # on_step_end wrote it; the loggers may be closed by now
        self._remove_hook()
        status, fields = self.remedy.finish("finished")
        self.run.finish(
            status, global_step=state.global_step, **fields, **self.feed.profile_fields()
        )

    # ---- internals ----------------------------------------------------------------------
    def _step(self, step: int, state: Any) -> None:
        try:
            loss, own = self._step_loss(state)
        except Exception:
            loss, own = None, False
        record = self.run.step(step, loss=loss, own=own)
        if record is not None:
            self._pending = self.feed.update(record)

    def _find_handler(self) -> None:
        """The Trainer's CallbackHandler: ``self`` of the ``call_event`` frame calling us."""
        if self._handler is not None or not self._trackers:
            return
        from transformers.trainer_callback import CallbackHandler

        frame: FrameType | None = sys._getframe(1)
        for _ in range(8):  # call_event → on_* (→ a subclass's super() calls) → here
            if frame is None:
                break
            caller = frame.f_locals.get("self")
            if isinstance(caller, CallbackHandler):
                self._handler = caller
                return
            frame = frame.f_back

    def _report(self, args: Any, state: Any, control: Any, kwargs: dict[str, Any]) -> None:
        """Write the pending update through every ``report_to`` callback of the Trainer."""
        update, self._pending = self._pending, None
        if update is None or not self._trackers:
            return
        if self._handler is None:
            if "no handler" not in self._failed_trackers:
                self._failed_trackers.add("no handler")
                log.warning(
                    "foreshock: the Trainer's loggers were not found; call "
                    "callback.attach(trainer) to send them foreshock's scalars"
                )
            return
        for callback in list(self._handler.callbacks):
            name = type(callback).__name__
            try:
                _report_to(callback, update, args, state, control, kwargs)
            except Exception:
                if name not in self._failed_trackers:  # once per tracker, not every step
                    self._failed_trackers.add(name)
                    log.warning(
                        "foreshock: %s could not log foreshock's scalars", name, exc_info=True
                    )

    def _keep_loss(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        try:
            import torch

            if not (module.training and torch.is_grad_enabled()):
                return  # evaluation, generation
            loss = output.get("loss") if isinstance(output, Mapping) else None
            if loss is None:
                loss = getattr(output, "loss", None)
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                self._losses.append(loss.detach())
                self._losses_summed = kwargs.get("num_items_in_batch") is not None
        except Exception:  # never break the forward pass
            pass

    def _step_loss(self, state: Any) -> tuple[Any, bool]:
        """(the update's loss, whether it is the update's own: not the logged fallback)."""
        losses, self._losses = self._losses, []
        if losses:
            total = losses[0] if len(losses) == 1 else sum(losses[1:], losses[0])
            return (total if self._losses_summed else total / len(losses)), True
        for entry in reversed(state.log_history):
            if "loss" in entry:
                return entry["loss"], False
        return None, False

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def _at_update(state: Any, update: TrackerUpdate | None) -> Any:
    """The Trainer's state at the update a record measured (u at global step u + 1), where the
    trackers plot it: the spectra worker writes a record a step later (``spectra_worker``)."""
    if update is None or getattr(state, "global_step", None) == update.step + 1:
        return state
    try:  # a dataclass, as it has been; else plot it now
        return dataclasses.replace(state, global_step=update.step + 1)
    except TypeError:
        return state


def _report_to(
    callback: Any, update: TrackerUpdate, args: Any, state: Any, control: Any, kwargs: dict
) -> None:
    """One ``report_to`` callback's share of ``update``; other callbacks get nothing."""
    from transformers.integrations import integration_utils

    known = integration_utils.INTEGRATION_TO_CALLBACK
    # a report_to callback; every one is a TrainerCallback (``known`` is typed dict[str, type])
    if not (isinstance(callback, TrainerCallback) and isinstance(callback, tuple(known.values()))):
        return
    logs: dict[str, Any] = dict(update.scalars)
    text = update.text()
    takes_text = tuple(known[n] for n in ("tensorboard", "wandb") if n in known)
    if text and isinstance(callback, takes_text):
        logs[TEXT_KEY] = text
    if logs:
        callback.on_log(args, state, control, logs=logs, **kwargs)
    if text and "mlflow" in known and isinstance(callback, known["mlflow"]):
        import mlflow  # the callback logs to the fluent API's active run

        if state.is_world_process_zero and mlflow.active_run() is not None:
            mlflow.set_tags(update.tags())


def _labels(args: Any, model: Any, max_steps: int | None = None) -> dict[str, Any]:
    labels: dict[str, Any] = {"transformers": transformers.__version__}
    recipe = trainer_recipe(args, max_steps)
    if recipe is not None:
        labels["recipe"] = recipe
    trainer = {name: getattr(args, name) for name in _ARG_LABELS if hasattr(args, name)}
    labels["trainer"] = {k: v for k, v in trainer.items() if isinstance(v, int | float | str)}
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if isinstance(model_type, str):
        labels["model_type"] = model_type
    return labels


def _resumed_from(state: Any, name: str) -> dict[str, Any] | None:
    """The monitoring state the checkpoint a Trainer resumed from kept (None: a fresh run).
    A resume from a checkpoint written without it is still a restart (count 0 before it)."""
    if not getattr(state, "global_step", 0):
        return None
    saved = (getattr(state, "stateful_callbacks", None) or {}).get(name)
    saved = saved[-1] if isinstance(saved, list) and saved else saved
    attributes = saved.get("attributes", {}) if isinstance(saved, dict) else {}
    kept = attributes.get("monitor_state")
    return kept if isinstance(kept, dict) else {"restart": 0}
