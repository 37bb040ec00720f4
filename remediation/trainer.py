"""The remedies of a remedy policy inside a real training loop: any torch model and optimizer.

:mod:`.remedy` decides what to do about a warning; this module is the trainer's side of it,
the same for the Hugging Face and Lightning callbacks and for a plain loop
(:mod:`.remediation` runs it at the step boundaries). Why one module: the remedies act on
what every loop has — the model, the optimizer, its scheduler — at the one place every loop
has, the boundary between two optimizer steps; a framework adapter only says where that
boundary is and turns ``stop`` into its own flag.

:class:`TrainerRemedies` is what the :class:`~.remedy.Remediator` asks for:

* ``precise_attention(module)``: that attention layer (every one for ``None``) switched to a
  higher-precision implementation through transformers' attention registry (``"sdpa"`` by
  default): the layer gets its own copy of the config
  (:func:`~.integrations.hf_attention.switch_layer`), foreshock's ``max_logit`` wrapper kept;
  a name that is no attention layer of the model, or a layer outside the registry, is an
  error (the action reports it; training goes on);
* ``hold_lr(scale, since)``: every parameter group's learning rate held at ``scale`` × its
  value at step ``since`` (when the warning's evidence began; the newest step at or before
  it this trainer saw, else now), set again by an optimizer step pre-hook, so no scheduler's
  ``step()`` raises it again (one decaying below it is followed; the Trainer's logged
  ``learning_rate`` stays the schedule's: the action record has the held values); never
  below ``HOLD_FLOOR`` × the first hold's reference rate, however often or however low it
  is asked (two ×1e-300 requests once set the rate to exactly 0 and the run trained on,
  looking healthy);
* ``hold_if_risen(since, rise)``: ``hold_lr(1.0, since)`` if some group's rate at this step
  exceeds ``rise`` × its rate at ``since`` (a ramp caught through a mechanism), else nothing;
* ``scale_router_lr(scale)``: the routers' learning rate held at ``scale`` × its value at the
  warning, under any optimizer and schedule: step hooks keep the routers' weights before the
  step and set w = w_old + s · (w_new − w_old), s = min(1, scale · lr_warning / lr_now) with
  lr the router's parameter group's (exactly that learning rate for SGD and Adam(W), whose
  update is linear in it; a schedule still rising cannot undo it, one decaying below the held
  value is followed); a second call scales again; the routers are the ones the Monitor finds;
* ``stop()``: a flag the adapter turns into its trainer's stop;
* ``rollback(step)``: the newest state older than ``step`` restored — an in-memory snapshot
  (model, optimizer, scheduler; bit for bit) or the trainer's own checkpoint
  (:mod:`.trainer_checkpoints`), whichever is newer; the data go on as the trainer would (the
  batches since are not seen again), the steps re-done are counted (``redone``: a callback
  extends its trainer's horizon by them) and the Monitor forgets its ΔW snapshot (the next
  ΔW would span the jump back).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from foreshock.remediation.snapshots import SnapshotRing

if TYPE_CHECKING:
    from foreshock.producers.monitor import Monitor

__all__ = ["PRECISE", "TrainerRemedies"]

PRECISE = "sdpa"  # the default precise attention implementation


def _innermost(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under a framework's wrapper (accelerate's, Lightning's): its hooks
    run at every real step, whatever calls it."""
    while not type(optimizer).__module__.startswith("torch.") and isinstance(
        getattr(optimizer, "optimizer", None), torch.optim.Optimizer
    ):
        optimizer = optimizer.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"not a torch optimizer: {type(optimizer).__name__}")
    return optimizer


# The lowest a learning rate is held, as a share of the rate the first hold scaled.
HOLD_FLOOR = 0.1
RATE_HISTORY = 20_000  # steps whose learning rates are kept for ``hold_lr(scale, since)``


class _TrainingState:
    """The optimizer and its scheduler as one state for :class:`SnapshotRing` (restored
    together: a schedule left ahead of the weights it steps would skip its own steps)."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler

    def state_dict(self) -> dict[str, Any]:
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
        return {"optimizer": self.optimizer.state_dict(), "scheduler": scheduler}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])


def _or_minus_one(step: int | None) -> int:
    return -1 if step is None else step


class TrainerRemedies:
    """The remedies for a torch ``model`` trained by ``optimizer`` (see the module docstring).

    monitor:   the run's Monitor, whose attention layers and routers the remedies act on
               (default: found in ``model`` as the Monitor would)
    precise:   the attention implementation ``precise_attention`` switches to
    snapshots: a :class:`SnapshotRing` for ``rollback``
    checkpoints: the trainer's checkpoints for ``rollback`` (:mod:`.trainer_checkpoints`);
               with neither, rollback is refused
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        lr_scheduler: Any = None,
        *,
        monitor: Monitor | None = None,
        precise: str = PRECISE,
        snapshots: SnapshotRing | None = None,
        checkpoints: Any = None,
    ) -> None:
        self.model, self.monitor, self.precise = model, monitor, precise
        self.checkpoints = checkpoints
        self.optimizer = _innermost(optimizer)
        self.state = _TrainingState(self.optimizer, lr_scheduler)
        self.ring = snapshots
        self.switched: dict[str, str] = {}  # attention layer -> its implementation now
        self.held: list[float] | None = None  # each group's held learning rate
        self._schedule_ref: list[float] | None = None  # the scheduler's rates at the hold
        self._unheld: list[float] = []  # each group's rate the first hold scaled
        self._rates: deque[tuple[int, list[float]]] = deque(maxlen=RATE_HISTORY)
        self.router_scale = 1.0
        self.stopped = False
        self.redone = 0  # steps whose training a rollback undid
        self.step = 0  # the step about to be trained
        self._routers: list[torch.Tensor] = []
        self._router_groups: list[dict[str, Any]] = []  # each router tensor's param group
        self._router_lr: list[float] = []  # their group's lr at the (first) warning
        self._before: list[torch.Tensor] = []
        self._hooks: list[Any] = []

    # ---- the loop's boundary ------------------------------------------------------------
    def before_step(self, step: int) -> bool:
        """Snapshot when due (once per step: a loop may call it per micro-batch), and hold
        the learning rate (the pre-hook does it too; this keeps the groups' lr readable).
        True when a snapshot was taken now."""
        taken = False
        if self.ring is not None and step not in self.ring.steps:
            taken = self.ring.maybe_take(step, self.model, self.state)
        self.step = step
        self._apply_held()
        if not self._rates or self._rates[-1][0] != step:
            self._rates.append((step, self._group_rates()))
        return taken

    # ---- the remedies -------------------------------------------------------------------
    def precise_attention(self, module: str | None) -> dict[str, str]:
        from foreshock.producers.hf_attention import check_switchable, switch_layer

        layers = self._attention_layers()
        names = list(layers) if module is None else [module]
        unknown = [n for n in names if n not in layers]
        if unknown or not names:
            known = ", ".join(sorted(layers)[:6]) or "none"
            raise KeyError(f"no attention layer {unknown or module!r} in this model ({known})")
        for name in names:  # all or none
            check_switchable(layers[name], self.precise)
        for name in names:
            self.switched[name] = switch_layer(layers[name], self.precise)
        return {n: self.switched[n] for n in names}

    def hold_lr(self, scale: float, since: int | None = None) -> list[float]:
        base = self._rates_at(self._rise_start(since))
        self._unheld = self._unheld or self._rates_at(since)  # the rates the first hold scaled
        floor = [HOLD_FLOOR * lr for lr in self._unheld]
        self.held = [max(scale * lr, low) for lr, low in zip(base, floor, strict=False)]
        self._schedule_ref = self._schedule_rates()  # its own decay from here is followed
        self._apply_held()
        if not any(h[0] == "lr" for h in self._hooks):
            hook = self.optimizer.register_step_pre_hook(lambda *_: self._apply_held())
            self._hooks.append(("lr", hook))
        return self.held

    def hold_if_risen(self, since: int, rise: float) -> list[float] | None:
        """``hold_lr(1.0, since)`` if some group's rate at this step (before any rollback
        restored older ones) exceeds ``rise`` × its rate at step ``since``; else None."""
        then = self._rates_at(since)
        now = self._rates[-1][1] if self._rates else self._group_rates()
        if not any(lr > rise * old for lr, old in zip(now, then, strict=False)):
            return None
        return self.hold_lr(1.0, since)

    def scale_router_lr(self, scale: float) -> float:
        if not self._routers:
            self._routers = self._router_parameters()
            groups = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
            self._router_groups = [groups[id(p)] for p in self._routers]
            self._router_lr = [float(g["lr"]) for g in self._router_groups]
        if not self._routers:
            raise LookupError("no router of this model is trained by the optimizer")
        self.router_scale *= scale
        if not any(h[0] == "router" for h in self._hooks):
            pre = self.optimizer.register_step_pre_hook(lambda *_: self._keep_routers())
            post = self.optimizer.register_step_post_hook(lambda *_: self._scale_routers())
            self._hooks += [("router", pre), ("router", post)]
        return self.router_scale

    def stop(self) -> None:
        self.stopped = True

    def rollback(self, before: int) -> int | None:
        sources = [s for s in (self.ring, self.checkpoints) if s is not None]
        if not sources:
            raise RuntimeError("rollback needs snapshots (rollback = true) or checkpoints")
        newest = max(sources, key=lambda s: _or_minus_one(s.newest_before(before)))
        restored = newest.restore_before(before, self.model, self.state)
        if restored is not None:
            self.redone += max(0, self.step - restored)
            if self.monitor is not None:  # its ΔW would span the jump back
                self.monitor.forget_weights()
        return restored

    def close(self) -> None:
        """Remove the optimizer hooks (the held lr and the routers' scale end with them)."""
        for _, hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ---- internals ----------------------------------------------------------------------
    def _group_rates(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def _rates_at(self, step: int | None) -> list[float]:
        """Each group's learning rate at the newest step ≤ ``step`` this trainer saw (now for
        None, or a step older than every one kept)."""
        if step is not None:
            for seen, rates in reversed(self._rates):
                if seen <= step:
                    return rates
        return self._group_rates()

    def _apply_held(self) -> None:
        if self.held is None:
            return
        decay = self._schedule_decay()
        for group, lr, d in zip(self.optimizer.param_groups, self.held, decay, strict=False):
            lr = min(lr * d, float(group["lr"]))  # a schedule decaying below the hold: followed
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def _rise_start(self, since: int | None) -> int | None:
        """The step at which the rate rising into ``since`` began (``since`` itself where it
        was not rising): a ramp is warned of after it began, and the rate before it is the
        one to hold. Any group's rate strictly higher than the step before counts."""
        if since is None:
            return None
        kept = [(step, rates) for step, rates in self._rates if step <= since]
        start = since
        for (_, rates), (previous, before) in zip(kept[::-1], kept[-2::-1], strict=False):
            if not any(r > b for r, b in zip(rates, before, strict=False)):
                break
            start = previous
        return start

    def _schedule_rates(self) -> list[float] | None:
        """The scheduler's own rate per group (``get_last_lr``), else None."""
        scheduler = self.state.scheduler
        try:
            rates = scheduler.get_last_lr() if scheduler is not None else None
            return [float(r) for r in rates] if rates else None
        except Exception:  # a scheduler without it, or not stepped yet
            return None

    def _schedule_decay(self) -> list[float]:
        """Per group, min(1, the scheduler's rate now / at the hold): the hold decays with the
        schedule (a WSD or cosine decay still runs under a hold; a schedule rising is not
        followed). 1 without a scheduler."""
        ref, now = self._schedule_ref, self._schedule_rates()
        if not ref or not now:
            return [1.0] * len(self.optimizer.param_groups)
        return [min(1.0, n / r) if r > 0 else 1.0 for n, r in zip(now, ref, strict=False)]

    def _keep_routers(self) -> None:
        self._before = [p.detach().clone() for p in self._routers]

    @torch.no_grad()
    def _scale_routers(self) -> None:
        if len(self._before) != len(self._routers):
            return
        for weight, old, group, lr0 in zip(
            self._routers, self._before, self._router_groups, self._router_lr, strict=True
        ):
            weight.copy_(torch.lerp(old, weight.detach(), self._router_factor(group, lr0)))
        self._before = []

    def _router_factor(self, group: dict[str, Any], lr_at_warning: float) -> float:
        """s = min(1, router_scale · lr_warning / lr_now): the router's step as if its
        learning rate were held at router_scale × its value at the warning."""
        now = float(group["lr"])
        if now <= 0:
            return self.router_scale
        return min(1.0, self.router_scale * lr_at_warning / now)

    def _discovery(self) -> Any:
        if self.monitor is not None:
            return self.monitor.discovery
        from foreshock.producers.discovery import discover

        return discover(self.model)

    def _attention_layers(self) -> dict[str, nn.Module]:
        """{name: module} of the attention layers, named as the Monitor names them."""
        if self.monitor is not None:
            return self.monitor.attention_modules()
        from foreshock.producers.names import named_modules

        modules = dict(named_modules(self.model))
        return {a.name: modules[a.name] for a in self._discovery().attention if a.name in modules}

    def _router_parameters(self) -> list[torch.Tensor]:
        """The routers' weights (and biases) the optimizer trains, each once."""
        trained = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        found: dict[int, torch.Tensor] = {}
        for router in self._discovery().routers:
            for tensor in (router.weight, router.bias):
                if tensor is not None and id(tensor) in trained:
                    found[id(tensor)] = tensor
        return list(found.values())
