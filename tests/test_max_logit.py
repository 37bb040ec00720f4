"""max_logit from the q and k an attention kernel receives: the masked maximum against a dense
float64 reference, and ``Monitor.watch_sdpa`` on plain PyTorch code (monitoring steps only)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from foreshock.producers import ListSink, Monitor, MonitorConfig
from foreshock.producers.max_logit import masked_max_logit

torch.set_num_threads(1)


def dense_max(q, k, scale, allowed) -> float:
    """max over allowed pairs of scale·q·k, float64, GQA by repeating key heads."""
    q, k = q.double(), k.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = scale * (q @ k.transpose(-2, -1))
    return float(scores.masked_fill(~allowed, -math.inf).max())


@pytest.mark.parametrize("t_q,t_k", [(9, 9), (4, 9)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_masked_max_matches_dense(t_q: int, t_k: int, kv_heads: int) -> None:
    g = torch.Generator().manual_seed(t_q + kv_heads)
    q = torch.randn(2, 4, t_q, 8, generator=g)
    k = torch.randn(2, kv_heads, t_k, 8, generator=g)
    everything = torch.ones(t_q, t_k, dtype=torch.bool)
    causal = torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
    scale = 1 / math.sqrt(8)
    got = masked_max_logit(q, k).item()
    assert got == pytest.approx(dense_max(q, k, scale, everything), rel=1e-6)
    got = masked_max_logit(q, k, is_causal=True).item()
    assert got == pytest.approx(dense_max(q, k, scale, causal), rel=1e-6)
    padding = torch.rand(2, 1, t_q, t_k, generator=g) > 0.3
    padding[..., 0] = True  # every query keeps one key
    got = masked_max_logit(q, k, 0.5, padding).item()
    assert got == pytest.approx(dense_max(q, k, 0.5, padding), rel=1e-6)
    additive = torch.zeros(2, 1, t_q, t_k).masked_fill(~padding, torch.finfo(torch.float32).min)
    got = masked_max_logit(q, k, 0.5, additive).item()
    assert got == pytest.approx(dense_max(q, k, 0.5, padding), rel=1e-6)


def test_masked_max_in_blocks_of_query_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    import foreshock.producers.max_logit as module

    monkeypatch.setattr(module, "_CHUNK_ELEMENTS", 40)  # a few query rows per block
    q, k = torch.randn(1, 2, 11, 4), torch.randn(1, 2, 11, 4)
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    assert masked_max_logit(q, k, 1.0, is_causal=True).item() == pytest.approx(
        dense_max(q, k, 1.0, causal), rel=1e-6
    )


class SdpaBlock(nn.Module):
    """Plain PyTorch attention through F.scaled_dot_product_attention."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.n_head, self.q_proj, self.k_proj = heads, nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, self.n_head, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        self.last = (q.detach(), k.detach())
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


def test_watch_sdpa_records_on_monitoring_steps_only() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(SdpaBlock())
    monitor = Monitor(model, ListSink(), config=MonitorConfig(spectra_worker=False, every=2))
    assert [a.name for a in monitor.discovery.attention] == ["0"]
    monitor.watch_sdpa()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plain = []
    for step in range(4):
        x = torch.randn(2, 6, 16)
        model(x).square().mean().backward()
        q, k = model[0].last
        plain.append(dense_max(q, k, 1 / math.sqrt(8), torch.ones(6, 6, dtype=torch.bool).tril()))
        optimizer.step()
        record = monitor.step(step)
        optimizer.zero_grad()
        if step % 2 == 0:
            assert record["values"]["max_logit@0"] == pytest.approx(plain[-1], rel=1e-5)
        else:
            assert record is None and not monitor._observed.max_logits
    monitor.close()
    assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks
    with torch.no_grad():
        model(torch.randn(1, 3, 16))  # unwatched after close: still works
