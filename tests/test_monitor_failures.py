"""A failing part of a monitoring step loses only its own values, never the record; non-finite
weights and gradients are reported, never raised into the training loop."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import foreshock.producers.monitor as monitor_module
from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.producers import ListSink, Monitor, MonitorConfig
from foreshock.transport.wire import encode

torch.set_num_threads(1)


def test_failing_attention_part_keeps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise torch.linalg.LinAlgError("simulated: the algorithm failed to converge")

    monkeypatch.setattr(monitor_module, "attention_chunks", broken)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16, n_experts=4))
    sink = ListSink()
    monitor = Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=1))
    x = torch.randint(0, 256, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    record = monitor.step(0, loss=loss)
    assert record is not None and monitor.errors == 1
    assert "monitor_error@attention" in record["flags"]
    assert record["values"]["loss"] == pytest.approx(loss.item())
    assert "router.token_entropy_norm@h.0.mlp.gate" in record["values"]
    assert not any(key.startswith("attn.") for key in record["values"])


# ---- non-finite weights and gradients in a real training run ---------------------------------

TINY = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, n_experts=4)
STEPS, EVERY = 12, 2
Hook = Callable[[int, GPT], None]


def _train(
    sink: ListSink,
    *,
    before_forward: Hook | None = None,
    after_backward: Hook | None = None,
    before_monitor: Hook | None = None,
    skip_optimizer_at: int | None = None,
) -> tuple[Monitor, list[float]]:
    """A tiny GPT-MoE trained for STEPS steps in the order the Monitor documents (backward,
    optimizer step, monitor, zero_grad), with hooks that reach into the real tensors."""
    torch.manual_seed(0)
    model = GPT(TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = ByteBatches(stdlib_bytes(200_000), TINY.block_size, 4, seed=0)
    monitor = Monitor(model, sink, run_id="nonfinite", config=MonitorConfig(every=EVERY))
    losses = []
    for step in range(STEPS):
        if before_forward:
            before_forward(step, model)
        x, y = batches.next()
        _, loss = model(x, y)
        loss.backward()
        if after_backward:
            after_backward(step, model)
        if step != skip_optimizer_at:  # a skipped step, as AMP's GradScaler does on overflow
            optimizer.step()
        if before_monitor:
            before_monitor(step, model)
        monitor.step(step, loss=loss)  # must never raise
        optimizer.zero_grad()
        losses.append(loss.item())
    monitor.close()
    return monitor, losses


def _w_q(model: GPT) -> torch.Tensor:
    """The real W_q of layer 0: the first n_embd rows of the fused c_attn weight."""
    return model.h[0].attn.c_attn.weight[: TINY.n_embd]


def _attention_values(record: dict[str, Any]) -> list[float | None]:
    return [v for k, v in record["values"].items() if k.startswith("attn.")]


def _valid_on_the_wire(records: list[dict[str, Any]]) -> None:
    for seq, record in enumerate(records):
        encode({**record, "kind": "metrics", "seq": seq})  # raises WireError if not


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_w_q_is_reported_and_training_runs_to_the_end(
    bad: float, caplog: pytest.LogCaptureFixture
) -> None:
    def poison(step: int, model: GPT) -> None:
        if step == 5:  # between monitoring steps 4 and 6
            with torch.no_grad():
                _w_q(model).fill_(bad)

    sink = ListSink()
    with caplog.at_level(logging.WARNING, logger="foreshock.monitor"):
        monitor, losses = _train(sink, before_forward=poison)
    assert len(losses) == STEPS  # the loop ran to its last step
    assert [r["step"] for r in sink.records] == list(range(0, STEPS, EVERY))
    assert monitor.errors == 0 and monitor.records_written == len(sink.records)
    for record in sink.records:
        attention = _attention_values(record)
        if record["step"] < 5:
            assert not any(f.startswith("nonfinite") for f in record["flags"])
            assert all(v is not None for v in record["values"].values())
        else:  # NaN/Inf spread by the forward, backward and optimizer to every weight
            assert "nonfinite@h.0.attn" in record["flags"]
            assert attention and all(v is None for v in attention)
            assert record["values"]["loss"] is None and "nonfinite:loss" in record["flags"]
    assert monitor.nonfinite_records == 3
    warned = [r for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(warned) == 1 and "step 6" in warned[0].getMessage()  # logged once
    _valid_on_the_wire(sink.records)


def test_nonfinite_w_q_at_a_monitoring_step_only_loses_that_window() -> None:
    """W_q non-finite while the monitor looks (step 4), then repaired: the values that depend
    on it (step 4, and step 6 whose ΔW is taken from the step-4 snapshot) are null, the rest
    is measured as usual."""
    saved: dict[str, torch.Tensor] = {}

    def poison(step: int, model: GPT) -> None:
        if step == 4:
            saved["w_q"] = _w_q(model).detach().clone()
            with torch.no_grad():
                _w_q(model)[0, 0] = math.nan

    def repair(step: int, model: GPT) -> None:
        if step == 5:
            with torch.no_grad():
                _w_q(model).copy_(saved["w_q"])

    sink = ListSink()
    monitor, losses = _train(sink, before_monitor=poison, before_forward=repair)
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert monitor.errors == 0
    by_step = {r["step"]: r for r in sink.records}
    assert by_step[4]["flags"] == ["nonfinite:weight_norm", "nonfinite@h.0.attn"]
    assert by_step[6]["flags"] == ["nonfinite@h.0.attn"]
    for step in (4, 6):
        assert all(v is None for v in _attention_values(by_step[step]))
        assert by_step[step]["values"]["loss"] is not None
        assert by_step[step]["values"]["router.epsilon@h.0.mlp.gate"] is not None
    for step in (2, 8, 10):
        assert by_step[step]["flags"] == []
        assert all(v is not None for v in by_step[step]["values"].values())
    _valid_on_the_wire(sink.records)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_gradients_skipped_step_are_reported(bad: float) -> None:
    """An overflowed step (gradients of W_q non-finite, optimizer step skipped as GradScaler
    does): the grad norm is null and flagged; the weights and everything else stay measured."""

    def poison(step: int, model: GPT) -> None:
        if step == 4:
            model.h[0].attn.c_attn.weight.grad[: TINY.n_embd].fill_(bad)

    sink = ListSink()
    monitor, losses = _train(sink, after_backward=poison, skip_optimizer_at=4)
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert monitor.errors == 0
    by_step = {r["step"]: r for r in sink.records}
    assert by_step[4]["flags"] == ["nonfinite:grad_norm"]
    assert by_step[4]["values"]["grad_norm"] is None
    assert all(v is not None for k, v in by_step[4]["values"].items() if k != "grad_norm")
    assert all(r["flags"] == [] for s, r in by_step.items() if s != 4)
    _valid_on_the_wire(sink.records)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_gradients_applied_are_reported_and_training_runs_on(bad: float) -> None:
    """The same gradients applied by the optimizer: every weight turns non-finite from then on;
    the monitor reports it at every monitoring step and the loop still reaches its end."""

    def poison(step: int, model: GPT) -> None:
        if step == 4:
            model.h[0].attn.c_attn.weight.grad[: TINY.n_embd].fill_(bad)

    sink = ListSink()
    monitor, losses = _train(sink, after_backward=poison)
    assert len(losses) == STEPS and monitor.errors == 0
    for record in sink.records:
        if record["step"] >= 4:
            assert {"nonfinite:grad_norm", "nonfinite:weight_norm", "nonfinite@h.0.attn"} <= set(
                record["flags"]
            )
            assert all(v is None for v in _attention_values(record))
        else:
            assert record["flags"] == []
    _valid_on_the_wire(sink.records)


def test_failing_router_hook_flags_its_step_not_step_minus_one() -> None:
    """A forward hook that raises used to write an error record with step -1, which the wire
    format rejects; now that step's own record carries the flag and keeps everything else."""
    calls = {"n": 0}

    def fail_once(step: int, model: GPT) -> None:
        if step == 3:  # the forward of step 4, a monitoring step: its hooks are armed
            monitor = model._test_monitor
            acc = monitor._observed.accumulators["h.0.mlp.gate"]

            def broken(*args: Any, **kwargs: Any) -> None:
                calls["n"] += 1
                del acc.update  # fails in this forward only
                raise RuntimeError("simulated hook failure")

            acc.update = broken

    sink = ListSink()
    original = Monitor.__init__

    def remember(self: Monitor, model: GPT, *args: Any, **kwargs: Any) -> None:
        original(self, model, *args, **kwargs)
        model._test_monitor = self

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Monitor, "__init__", remember)
        monitor, losses = _train(sink, before_monitor=fail_once)
    assert len(losses) == STEPS and calls["n"] == 1
    assert all(r["step"] >= 0 for r in sink.records)
    assert monitor.errors == 1
    by_step = {r["step"]: r for r in sink.records}
    assert "monitor_error@h.0.mlp.gate" in by_step[4]["flags"]
    assert "router.epsilon@h.0.mlp.gate" in by_step[4]["values"]  # weight geometry kept
    assert "router.token_entropy@h.0.mlp.gate" not in by_step[4]["values"]
    assert by_step[4]["values"]["loss"] is not None
    assert all(r["flags"] == [] for s, r in by_step.items() if s != 4)  # the next steps: whole
    assert "router.token_entropy@h.0.mlp.gate" in by_step[6]["values"]
    _valid_on_the_wire(sink.records)


def test_a_sink_failing_to_close_writes_no_record() -> None:
    class ClosingFails(ListSink):
        def close(self) -> None:
            raise OSError("disk gone")

    torch.manual_seed(0)
    sink = ClosingFails()
    monitor = Monitor(GPT(TINY), sink, run_id="r")
    monitor.close()  # must not raise
    assert monitor.errors == 1 and sink.records == []


def test_an_error_record_is_valid_on_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("simulated")

    torch.manual_seed(0)
    sink = ListSink()
    monitor = Monitor(GPT(TINY), sink, run_id="r", config=MonitorConfig(every=1))
    monkeypatch.setattr(monitor, "_measure", broken)
    assert monitor.step(7) is None
    assert monitor.errors == 1
    [record] = sink.records
    assert record["step"] == 7 and record["flags"] == ["monitor_error"]
    assert "simulated" in record["error"]
    _valid_on_the_wire(sink.records)
