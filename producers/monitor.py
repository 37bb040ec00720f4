"""The in-trainer ``Monitor``: attaches the mechanism monitors to a live model.

Usage, once per optimizer step (after ``optimizer.step()``, before ``zero_grad()``)::

    monitor = Monitor(model, JsonlSink("runs/r1.jsonl"), run_id="r1")
    for step, batch in enumerate(loader):
        loss = model(batch); loss.backward(); optimizer.step()
        monitor.step(step, loss=loss)
        optimizer.zero_grad()
    monitor.close()

Every ``every`` (δ) steps it snapshots W_q and W_k of each attention layer and, from the
previous snapshot, computes the ΔW and Δ2/Δ3 spectra (alone, on a worker thread from copies
taken at the step: :mod:`.spectra_worker`); forward hooks on the routers gather
routing entropies during the forward pass of that step only. Between monitoring steps it does
nothing but bookkeeping. Monitoring never raises into the training loop: an error is logged,
counted in ``errors`` and written as an error record at the step it happened (a failure in a
forward hook or observer is flagged ``monitor_error@<module>`` in that step's record).

Non-finite weights, gradients or loss are not errors: their values are emitted as null with a
``nonfinite@<module>`` (or ``nonfinite:<key>``) flag, logged once, and monitoring carries on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from foreshock.transport.wire import check_run_id

from .alone import Refusals
from .checkpoint_state import load_monitoring_state, monitoring_state
from .collective import Peers, gathers_of
from .deferred import measured_alone, worker_copies
from .discovery import Discovery, discover
from .fsdp1 import whole_parameters
from .layouts import AttentionSpec, RouterSpec
from .learning_rates import LearningRates
from .live import LiveModel
from .max_logit import SdpaLogitWatch
from .measure import attention_chunks, router_geometry_chunk
from .monitor_config import MonitorConfig
from .observations import StepObservations
from .partials import RankPart, combine
from .reading import holders_of, owned_by_me, sort_values, symptom_chunk
from .record_out import error_record, finite_record, say_nonfinite
from .registration import Registration
from .run_bounds import RunBounds
from .sharding import is_dtensor
from .sinks import Sink
from .spectra_worker import SpectraWorker
from .world import rank_and_world

__all__ = ["Monitor", "MonitorConfig"]

log = logging.getLogger("foreshock.monitor")


class Monitor(Registration):
    """Mechanism monitors on a model, emitting one record per monitoring step to ``sink``."""

    def __init__(
        self,
        model: nn.Module,
        sink: Sink,
        run_id: str | None = None,
        config: MonitorConfig | None = None,
        auto_discover: bool = True,
        optimizer: Any = None,
    ) -> None:
        self.model, self.sink = model, sink
        self.learning_rates = LearningRates(optimizer)  # lr@group.<i>; .watch(opt) to swap
        self.config = config or MonitorConfig()
        self.run_id = check_run_id(run_id or uuid.uuid4().hex[:12])  # fail now, not per record
        self.rank, self.world_size = rank_and_world()
        self._bounds = RunBounds(self.run_id, self.rank, self.world_size)
        self.peers = Peers.join(self.config.join_timeout_s)
        # active: this rank writes records; participating: it measures (hooks, collectives)
        self.active = self.config.emit_ranks == "all" or self.rank == 0
        self.participating = self.active or self.peers is not None
        self.discovery = discover(model) if auto_discover else Discovery()
        self.live = LiveModel(model)  # the model read through its live parameters
        self._refusals = Refusals()
        self.errors = 0
        self.records_written = 0
        self.nonfinite_records = 0  # records with a non-finite value (emitted as null, flagged)
        self._last_step = -1  # the last step passed to step(): error records are stamped with it
        self._snapshots: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        alone = self.config.spectra_worker and self.peers is None  # (module docstring)
        self.spectra = SpectraWorker(self.config.spectra_queue) if alone else None
        self._jobs: tuple[list, list] = ([], [])  # copies for the worker: attention, routers
        self._observed = StepObservations(self._fail_hook)  # this step's forward reports
        self._closers: list[Callable[[], None]] = []  # attached observers' removal
        self._refuse_alone()
        if self.participating:
            for router in self.discovery.routers:
                self._observed.hook_router(router)
        found = self.discovery.attention or self.discovery.routers or self.refused
        if auto_discover and not found:
            log.warning("foreshock found no attention or router:\n%s", self.discovery.summary())

    def _refuse_alone(self) -> None:
        """A rank measuring alone drops what only the group could read (``alone``)."""
        if self.peers is None:
            attention, routers = self._current_specs()
            self._refusals.check(self.model, self.discovery, attention, routers, self.live.params)

    @property
    def refused(self) -> list[str]:
        """The parts not measured, by name (``alone``): in ``describe()`` too."""
        return self._refusals.refused

    def _current_specs(self) -> tuple[list[AttentionSpec], list[RouterSpec]]:
        """The discovered specs, read from the model's live parameters (see ``live``)."""
        return self.live.specs(self.discovery.attention, self.discovery.routers)

    def observe_max_logit(self, name: str, value: torch.Tensor) -> None:
        """A layer's max pre-softmax attention logit, from the model's forward (kept on device
        until emission: cheap only where the model already has the scores)."""
        if self.measuring:
            self._observed.max_logit(name, value)

    def observe_router_drops(self, name: str, dropped: torch.Tensor | int, assigned: int) -> None:
        """From a capacity-limited MoE layer's forward: ``dropped`` of its ``assigned``
        token→expert assignments overflowed. Emitted as ``router.dropped_fraction@<name>`` =
        Σ dropped / Σ assigned over the monitoring step's forwards (0–1): what a collapsing
        router costs when tokens pile onto few experts. ``name``: the router's module."""
        if self.measuring:
            self._observed.router_drops(name, dropped, assigned)

    @property
    def measuring(self) -> bool:
        """True during the forward and backward of a monitoring step (when observers report)."""
        return self.participating and self._observed.armed

    def watch_sdpa(self, layers: dict[str, nn.Module] | None = None) -> SdpaLogitWatch:
        """Record ``max_logit@<layer>`` from each attention layer's ``F.scaled_dot_product_
        attention`` calls, on monitoring steps only (plain PyTorch: ``monitor.watch_sdpa()``).
        ``layers``: names to modules (default: those discovered). Removed by ``close()``."""
        layers = self.attention_modules() if layers is None else layers
        watch = SdpaLogitWatch(layers.items(), self.observe_max_logit, lambda: self.measuring,
                               self._observed.failed)  # fmt: skip
        self.on_close(watch.close)
        return watch

    def compute_in_step(self) -> None:
        """From now on each record is computed and written by its own step (no spectra
        worker; what waits is written now): remedies act at the boundary after a record."""
        if self.spectra is not None:
            self.flush()
            self.spectra.close()
            self.spectra = None

    def on_close(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` at ``close()``: how attached observers (hooks, wrappers) detach."""
        self._closers.append(undo)

    # ---- the training-loop call ---------------------------------------------------------
    def step(self, step: int, loss: torch.Tensor | float | None = None) -> dict[str, Any] | None:
        """Call once per optimizer step, on every rank. Returns the record this call wrote (on
        the ranks that write), else None: the monitoring step's own, or with the spectra
        worker (``MonitorConfig.spectra_worker``) an earlier one whose spectra are solved."""
        if not self.participating:
            return None
        try:
            self._last_step = int(step)
            written = self._write_ready()
            if step % self.config.every != 0:
                return written
            record = self._measure(step, loss)
            if record is None:  # measured its share and writes nothing, or waits for spectra
                return written
            self._write(record)
            return record
        except Exception as exc:
            self._fail(step, exc)
            return None
        finally:
            if self._observed.armed:  # only an armed step gathered anything
                self._observed.clear()
            self._observed.armed = (step + 1) % self.config.every == 0

    def _write(self, record: dict[str, Any]) -> None:
        self._bounds.before_first(self.sink, self.describe)  # a start where none went
        self.sink.write(record)
        self.records_written += 1

    def _write_ready(self, wait: bool = False) -> dict[str, Any] | None:
        """Write the records whose spectra the worker solved (all of them with ``wait``), in
        step order; the last one written, else None."""
        last = None
        for step, values, flags in self.spectra.ready(wait) if self.spectra else ():
            last = self._record(step, values, flags)
            self._write(last)
        return last

    def flush(self) -> None:
        """Write every record still waiting for its spectra: before the run's ``end`` record
        (the integrations call it), and at ``close``. Never raises."""
        try:
            self._write_ready(wait=True)
        except Exception as exc:
            self._fail(self._last_step, exc)

    def _measure(self, step: int, loss: torch.Tensor | float | None) -> dict[str, Any] | None:
        """This rank's share, exchanged with its peers (``collective``); the record to write.

        ``_local_part`` never raises, so every rank reaches the exchange: an error on one
        rank is a flag in the record, never a peer left waiting in a collective."""
        part = self._local_part(step, loss)
        if self.peers is None:
            parts = [part]
        else:
            gathered = self.peers.exchange(part, to_all=self.config.emit_ranks == "all")
            if not self.active or gathered is None:
                return None
            parts = gathered
        own = [p for p in parts if p.rank == self.rank]
        data = own if self.config.emit_ranks == "all" else parts
        jobs, self._jobs = self._jobs, ([], [])
        rates = self.learning_rates.values()  # the rates of this step
        if self.spectra is not None:  # alone: the rest on the worker (``deferred``)
            done = measured_alone(self.spectra, step, part, jobs, rates, self.config)
            return None if done is None else self._record(step, *done)
        values, flags = combine(parts, data, self._observed.accumulators)
        return self._record(step, {**values, **rates}, set(flags))

    def _local_part(self, step: int, loss: torch.Tensor | float | None) -> RankPart:
        """``_read_part`` in a group, with FSDP1 parameters whole (``whole_parameters``: a
        collective every rank enters here, at the same point of each monitoring step)."""
        if self.peers is None:
            return self._read_part(step, loss)
        with whole_parameters(self.model, self.peers.roots):
            return self._read_part(step, loss)

    def _read_part(self, step: int, loss: torch.Tensor | float | None) -> RankPart:
        """What this rank measures: the layers and routers it owns, its share of the data
        statistics and of the norms. Failures become flags, one part at a time."""
        part = RankPart(rank=self.rank)
        observed = self._observed
        flags: set[str] = {f"monitor_error@{name}" for name in observed.errors}
        chunks: list[tuple[list[str], torch.Tensor]] = []

        def gather(name: str, make: Callable[[], Any]) -> Any:
            try:  # one failing part (e.g. an eigen-solver) loses only its own values
                return make()
            except Exception as exc:
                self._fail_part(step, name, exc)
                flags.add(f"monitor_error@{name}")
                return None

        owned = gather("sharded", self._owned_specs)
        attention, routers = owned if owned is not None else ([], [])
        if self.spectra is not None:  # copied now, computed on the worker (``deferred``)
            self._jobs = worker_copies(attention, routers, self._snapshots, self.config, gather)
        else:
            made = gather(
                "attention", lambda: attention_chunks(attention, self._snapshots, self.config)
            )
            chunks += made or []
            for router in routers:
                made = gather(router.name, functools.partial(router_geometry_chunk, router))
                chunks += [made] if made is not None else []
        squares = gather("symptoms", lambda: self._symptom_chunk(loss))
        chunks += [squares] if squares is not None else []
        sort_values(part, chunks, observed.drops)
        for name, acc in observed.accumulators.items():
            part.routers[name] = (acc.n_experts, acc.top_k, acc.bins, acc.scoring)
            if name not in observed.errors:  # a failed hook keeps only the weight geometry
                state = gather(name, acc.state)
                part.routing[name] = None if state is None else state.tolist()
        part.flags = sorted(flags)
        return part

    def _owned_specs(self) -> tuple[list[AttentionSpec], list[RouterSpec]]:
        """The specs this rank computes, read whole (``reading.owned_by_me`` in a group;
        alone, every spec is its own)."""
        specs: dict[str, AttentionSpec | RouterSpec]
        try:
            self._refuse_alone()
            attention, routers = self._current_specs()
            every: list[AttentionSpec | RouterSpec] = [*attention, *routers]
            specs, failure = {s.name: s for s in every}, None
            plan = [(name, gathers_of(s)) for name, s in specs.items()]
        except Exception as exc:  # in a group, still exchange plans: no peer may wait for us
            specs, failure, plan = {}, exc, []
        if self.peers is None:
            if failure is not None:
                raise failure
            return attention, routers
        first = self.peers.holders is None  # parameter names travel with the first plan only
        names = [name for name, _ in self.live.named_params()] if first else []
        return owned_by_me(self.peers, self.rank, specs, plan, failure, names)

    def _symptom_chunk(self, loss: torch.Tensor | float | None) -> tuple[list[str], torch.Tensor]:
        """Loss, this rank's shares of Σ‖g‖² and Σ‖w‖², max logits and dropped tokens."""
        named = [] if self._refusals.norms else self.live.named_params()
        if self.peers is None:
            named = [(n, p) for n, p in named if not is_dtensor(p)]
        observed = self._observed
        return symptom_chunk(
            named, holders_of(self.peers), loss, observed.max_logits, observed.drops
        )

    def _record(self, step: int, values: dict[str, float], flags: set[str]) -> dict[str, Any]:
        """The metrics record: non-finite values become null with a ``nonfinite`` flag
        (``record_out``), logged the first time."""
        c = self.config
        message, nonfinite = finite_record(
            self.run_id, step, values, flags, self.rank, self.world_size, c.emit_ranks
        )
        if nonfinite:
            self.nonfinite_records += 1
            if self.nonfinite_records == 1:
                say_nonfinite(step, nonfinite)
        return message

    def _fail_part(self, step: int, part: str, exc: Exception) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.warning("foreshock monitor: %s failed at step %s: %r", part, step, exc)

    def _fail_hook(self, module: str, exc: Exception) -> None:
        """A forward hook or observer failed (once per module and step): count and log it;
        the step's record flags it."""
        self._fail_part(self._last_step + 1, f"{module} (forward hook)", exc)

    def _fail(self, step: Any, exc: Exception) -> None:
        """A monitoring step failed as a whole: log, count, and write an error record
        (``record_out.error_record``)."""
        self.errors += 1
        if self.errors <= 3:
            log.warning("foreshock monitor error at step %s:\n%s", step, traceback.format_exc())
        with contextlib.suppress(Exception):
            last = self._last_step
            self.sink.write(error_record(self.run_id, step, last, exc, self.rank, self.world_size))

    # ---- lifecycle ----------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Config and discovery, for logs and the run-start record."""
        return {
            "run_id": self.run_id,
            "rank": self.rank,
            "config": asdict(self.config),
            "discovery": self.discovery.summary(),
            "refused": list(self.refused),
            "signature": self.signature(),
        }

    def forget_weights(self) -> None:
        """Older weights were restored (a rollback): no ΔW across the jump back, next step."""
        self._snapshots.clear()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the monitoring (``checkpoint_state``), saved with the
        model's; ``load_state_dict`` on resume (the HF and Lightning callbacks do both). The
        records still with the spectra worker are written first: the checkpoint covers them."""
        self.flush()
        return monitoring_state(self.run_id, self.sink)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resuming from a checkpoint whose ``state_dict()`` this is: this attempt is one
        restart later. Call it before the sink's first message; never raises."""
        if not load_monitoring_state(self.sink, state):
            self.errors += 1

    def close(self) -> None:
        """Remove the hooks and close the sink. Safe to call twice."""
        self._observed.remove_hooks()
        for close in self._closers:
            close()
        self._closers.clear()
        self.flush()
        if self.spectra is not None:
            self.spectra.close()
        try:
            self._bounds.at_close(self.sink, self._last_step)  # the end of a start it wrote
            self.sink.close()
        except Exception as exc:  # the sink itself failed: nothing left to write a record to
            self.errors += 1
            log.warning("foreshock monitor: closing the sink failed: %r", exc)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
