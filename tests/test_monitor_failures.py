"""A failing part of a monitoring step loses only its own values, never the record."""

import pytest
import torch

import foreshock.producers.monitor as monitor_module
from foreshock.lab.model import GPT, GPTConfig
from foreshock.producers import ListSink, Monitor, MonitorConfig

torch.set_num_threads(1)


def test_failing_attention_part_keeps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise torch.linalg.LinAlgError("simulated: the algorithm failed to converge")

    monkeypatch.setattr(monitor_module, "attention_chunks", broken)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16, n_experts=4))
    sink = ListSink()
    monitor = Monitor(model, sink, config=MonitorConfig(every=1))
    x = torch.randint(0, 256, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    record = monitor.step(0, loss=loss)
    assert record is not None and monitor.errors == 1
    assert "monitor_error@attention" in record["flags"]
    assert record["values"]["loss"] == pytest.approx(loss.item())
    assert "router.token_entropy_norm@h.0.mlp.gate" in record["values"]
    assert not any(key.startswith("attn.") for key in record["values"])
