"""A small decoder-only transformer with MoE MLPs, readable top to bottom (after nanoGPT).

Attention runs through ``flash_attention``: exact forward, FlashAttention's backward, and a
per-layer ``lowp`` switch that the fault scenarios flip at their onset.

Layouts are the common ones so that foreshock's discovery sees what it sees in the wild:
a fused ``c_attn`` projection with an ``n_head`` attribute, and MoE blocks with a Linear
``gate`` over an ``experts`` list and a ``top_k`` attribute (Mixtral style).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import LowPrecision, flash_attention

__all__ = ["GPT", "GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 256  # bytes
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 0  # key/value heads (GQA) where the architecture has them; 0 = n_head
    n_embd: int = 128
    n_experts: int = 8  # 0 = dense MLP
    top_k: int = 2
    expert_hidden: int = 0  # 0 = 4·n_embd / top_k: top-k experts cost one dense 4d MLP
    aux_loss_weight: float = 0.01  # Switch load-balancing loss; 0 = off
    capacity_factor: float = 0.0  # c > 0: each expert takes ⌈c·N·k/E⌉ assignments; 0 = dropless
    bias: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.lowp: LowPrecision | None = None  # the fa-lowprec / fa-noise switch
        self.logit_observer: Callable[[torch.Tensor], None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y, max_logit = flash_attention(q, k, v, self.lowp)  # (B, nh, T, hs), ()
        if self.logit_observer is not None:
            self.logit_observer(max_logit)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class MoE(nn.Module):
    """Softmax router over E experts, top-k dispatch, renormalized top-k weights.

    With ``capacity_factor`` c > 0 each expert takes at most capacity = ⌈c · N · k / E⌉ of the
    N·k assignments of a batch of N tokens (Switch Transformer, GShard, Megatron's expert
    capacity); an overflowing assignment is dropped: that expert adds nothing to the token,
    whose residual stream passes the layer unchanged. Priority within an expert: every top-1
    assignment before any top-2 one, then token order (GShard). A collapsing router piles
    tokens onto few experts, so drops are what it costs; ``drop_observer(dropped, assigned)``
    reports them on every forward.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.top_k, self.n_experts = config.top_k, config.n_experts
        self.gate = nn.Linear(config.n_embd, config.n_experts, bias=False)
        hidden = config.expert_hidden or 4 * config.n_embd // config.top_k
        self.experts = nn.ModuleList(
            MLP(config.n_embd, hidden, config.bias) for _ in range(config.n_experts)
        )
        self.capacity_factor = config.capacity_factor
        self.aux_loss = torch.zeros(())
        self.drop_observer: Callable[[torch.Tensor, int], None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        flat = x.view(-1, C)
        probs = F.softmax(self.gate(flat), dim=-1)  # (N, E)
        top_p, top_i = probs.topk(self.top_k, dim=-1)  # (N, k)
        top_p = top_p / top_p.sum(-1, keepdim=True)
        out = self._dispatch(flat, top_i, top_p)
        # Switch balancing loss: E · Σ_e (fraction of tokens routed to e) · (mean prob of e)
        load = F.one_hot(top_i[:, 0], self.n_experts).float().mean(0)
        self.aux_loss = self.n_experts * (load * probs.mean(0)).sum()
        return out.view(B, T, C)

    def _dispatch(self, flat: torch.Tensor, top_i: torch.Tensor, top_p: torch.Tensor):
        """Σ_k p_k · expert_k(x) over the kept assignments: one gather sorted by expert, one
        matmul pair per expert, one scatter back — rather than a mask, a gather and a scatter
        per expert."""
        n, k = top_i.shape
        expert_of = top_i.reshape(-1)  # (N·k,) assignment a = token·k + slot → expert
        counts = torch.bincount(expert_of, minlength=self.n_experts)
        if self.capacity_factor > 0:
            slot_token = torch.arange(k).repeat(n) * n + torch.arange(n).repeat_interleave(k)
            order = (expert_of * (n * k) + slot_token).argsort()  # expert, then slot, token
            order, counts = self._within_capacity(order, counts, n * k)
        else:
            order = expert_of.argsort(stable=True)
        token = order // k
        chunks = flat[token].split(counts.tolist())
        y = torch.cat([expert(c) for expert, c in zip(self.experts, chunks, strict=True)])
        y = y * top_p.reshape(-1)[order, None]
        return torch.zeros_like(flat).index_add_(0, token, y)

    def _within_capacity(self, order: torch.Tensor, counts: torch.Tensor, assigned: int):
        """Keep each expert's first ⌈c·N·k/E⌉ assignments of ``order``; report the drops."""
        capacity = math.ceil(self.capacity_factor * assigned / self.n_experts)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(assigned) - starts.repeat_interleave(counts)
        kept = rank < capacity
        if self.drop_observer is not None:
            self.drop_observer((~kept).sum(), assigned)
        return order[kept], counts.clamp(max=capacity)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        if config.n_experts:
            self.mlp: nn.Module = MoE(config)
        else:
            self.mlp = MLP(config.n_embd, 4 * config.n_embd, config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        if self.config.n_experts and self.config.aux_loss_weight:
            aux = (
                sum(m.aux_loss for m in self.modules() if isinstance(m, MoE)) / self.config.n_layer
            )
            loss = loss + self.config.aux_loss_weight * aux
        return logits, loss
