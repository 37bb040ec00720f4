"""Router monitors for MoE routers over E experts (softmax or sigmoid scoring).

Mechanism watched: the stable-winner loop. An expert that wins slightly more gets more gradient
and wins more; a high learning rate or a small global batch feeds the loop until routing
collapses onto a few experts. The full softmax distribution sharpens before any top-k choice
changes, so per-token routing entropy moves first; the router's weight rows drifting toward a
common direction is the structural trace of the same collapse.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "RoutingAccumulator",
    "conditioning_ratio",
    "cosine_lower_bound",
    "expert_load_stats",
    "mean_pairwise_cosine",
    "merge_states",
    "router_output",
    "routing_logits",
    "token_entropy",
]


def router_output(
    output: object, n_experts: int, top_k: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits (…, E), selected experts (…, k) or None) from what a router module returned.

    A plain gate returns the logits. transformers' MoE routers return a tuple (logits, scores,
    indices): the logits are its first floating (…, E) tensor, the selection its integer
    (…, k) tensor — the experts actually chosen, after any score-correction bias or grouped
    top-k, which the logits alone cannot reproduce. A boolean (…, E) tensor is a routing map
    (Megatron's ``routing_map``: True where a token goes to an expert, fewer than k after
    token dropping); it is returned as the selection as it is.

    >>> logits, chosen = router_output((torch.zeros(3, 4), torch.ones(3, 2), torch.ones(3, 2,
    ...     dtype=torch.long)), n_experts=4, top_k=2)
    >>> tuple(logits.shape), tuple(chosen.shape)
    ((3, 4), (3, 2))
    """
    if isinstance(output, torch.Tensor):
        return output, None
    if not isinstance(output, tuple | list):
        raise TypeError(f"router output is a {type(output).__name__}, not logits or a tuple")
    tensors = [t for t in output if isinstance(t, torch.Tensor)]
    logits = next(
        (t for t in tensors if t.is_floating_point() and t.shape[-1:] == (n_experts,)), None
    )
    if logits is None:
        raise ValueError(f"no (…, {n_experts}) logits in the router's output")
    masks = [t for t in tensors if t.dtype == torch.bool and t.shape[-1:] == (n_experts,)]
    indices = [t for t in tensors if not t.is_floating_point() and t.dtype != torch.bool]
    selected = next((t for t in indices if top_k and t.shape[-1:] == (top_k,)), None)
    return logits, masks[0] if masks else selected


def routing_logits(logits: torch.Tensor, scoring: str = "softmax") -> torch.Tensor:
    """Logits whose softmax is the routing distribution the entropy is taken over.

    softmax routers: the logits themselves, p = softmax(z). Sigmoid routers (DeepSeek-V3) score
    each expert independently, s_e = σ(z_e); their distribution is the normalised scores
    p_e = s_e / Σ s_j = softmax(ln σ(z))_e, so the logits are ln σ(z) (``logsigmoid``, stable).

    >>> z = torch.tensor([0.0, 2.0])
    >>> p = torch.softmax(routing_logits(z, "sigmoid"), -1)
    >>> torch.allclose(p, torch.sigmoid(z) / torch.sigmoid(z).sum())
    True
    """
    if scoring == "sigmoid":
        return torch.nn.functional.logsigmoid(logits.float())
    return logits


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the full routing distribution p = softmax(logits)  [nats].

    H(p) = −Σ_e p_e ln p_e, computed stably from log-softmax; shape (..., E) → (...).
    Ranges over [0, ln E]; divide by ln E for a [0, 1] scale comparable across router sizes.

    >>> round(token_entropy(torch.zeros(4)).item() / math.log(4), 6)
    1.0
    >>> abs(token_entropy(torch.tensor([0.0, -1e4])).item()) < 1e-9
    True
    >>> round(token_entropy(torch.tensor([0.0, 0.0, -math.inf])).item(), 6)  # a masked expert
    0.693147
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    # A masked expert (logit −inf) has p = 0 and adds 0 ln 0 = 0, not 0 · (−inf) = NaN.
    return 0.0 - (logp.exp() * logp.masked_fill(logp == -math.inf, 0.0)).sum(-1)


def expert_load_stats(load: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy of the expert load after top-k, normalized by ln E, and MaxVio.

    load_e = number of (token, slot) assignments to expert e;  q_e = load_e / Σ load;
    entropy = −Σ q_e ln q_e / ln E (1 = perfectly balanced, 0 = one expert takes all);
    MaxVio = max_e load_e / mean_e load_e − 1 (0 = balanced, E − 1 = one expert takes all).

    >>> h, v = expert_load_stats(torch.tensor([5.0, 5.0, 5.0, 5.0]))
    >>> round(h.item(), 6), round(v.item(), 6)
    (1.0, 0.0)
    >>> h, v = expert_load_stats(torch.tensor([8.0, 0.0, 0.0, 0.0]))
    >>> round(abs(h.item()), 6), round(v.item(), 6)
    (0.0, 3.0)
    """
    load = load.float()
    q = load / load.sum().clamp_min(1e-30)
    entropy = (0.0 - torch.special.xlogy(q, q).sum()) / math.log(load.numel())
    maxvio = load.max() / load.mean().clamp_min(1e-30) - 1.0
    return entropy, maxvio


def mean_pairwise_cosine(weight: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity over all pairs of router weight rows (E×d).

    With û_e = w_e / ‖w_e‖ and ū = mean_e û_e:  Σ_{i≠j} cos(w_i, w_j) = E²‖ū‖² − E, so
    mean_{i≠j} cos = (E‖ū‖² − 1) / (E − 1). O(E·d), no E×E matrix.

    >>> round(mean_pairwise_cosine(torch.eye(3)).item(), 6)         # orthogonal rows
    0.0
    >>> round(mean_pairwise_cosine(torch.ones(4, 5)).item(), 6)     # identical rows
    1.0
    """
    unit = torch.nn.functional.normalize(weight.float(), dim=-1)
    n = unit.shape[0]
    u_bar = unit.mean(0)
    return (n * u_bar.square().sum() - 1.0) / (n - 1)


def conditioning_ratio(weight: torch.Tensor) -> torch.Tensor:
    """Conditioning ratio ε = max_e ‖w_e − w̄‖ / ‖w̄‖ of router rows around their mean w̄.

    Why: a small ε pins every row near the common direction w̄. Writing w_e = w̄ + r_e with
    ‖r_e‖ ≤ ε‖w̄‖, the angle between w_e and w̄ is at most arcsin ε (ε < 1), so any two rows are
    within 2·arcsin ε of each other and

        cos(w_i, w_j) ≥ cos(2 arcsin ε) = 1 − 2ε²   for every pair i, j,

    i.e. the router scores every token almost the same way for every expert and cannot
    discriminate. (For ε ≥ 1 the bound says nothing.) w̄ = 0 gives ε = +inf.

    In float64: ε is smallest exactly where w_e − w̄ cancels most, and in float32 that
    cancellation cost 1e-4 of ε's relative precision on rows that agree to 0.5 %.

    >>> w = torch.tensor([[1.0, 0.1], [1.0, -0.1]])
    >>> round(conditioning_ratio(w).item(), 6)
    0.1
    >>> round(cosine_lower_bound(conditioning_ratio(w)).item(), 6)
    0.98
    """
    w = weight.double()
    w_bar = w.mean(0)
    spread = (w - w_bar).norm(dim=-1).max()
    return spread / w_bar.norm()


def cosine_lower_bound(eps: torch.Tensor) -> torch.Tensor:
    """The pairwise-cosine floor max(1 − 2ε², −1) implied by a conditioning ratio ε (see above).

    For ε ≥ 1 the bound says nothing, and the floor is the trivial −1.

    >>> [round(v, 6) for v in cosine_lower_bound(torch.tensor([0.1, 3.0])).tolist()]
    [0.98, -1.0]
    """
    return (1.0 - 2.0 * eps.square()).clamp_min(-1.0)


class _Entropies(NamedTuple):
    """What a ``RoutingAccumulator`` keeps of its tokens' normalized entropies h."""

    sum: torch.Tensor  # Σ h
    min: torch.Tensor  # min h
    hist: torch.Tensor  # the histogram of h on [0, 1]


class RoutingAccumulator:
    """Accumulates routing statistics over the forward passes of one monitored step.

    Tokens are never stored: the mean and min are running reductions and the 5th percentile
    comes from a fixed histogram of normalized entropy on [0, 1] (``bins`` bins, so its
    resolution is 1/bins), which also merges across gradient-accumulation micro-batches.
    Everything stays on the logits' device until ``summary()``.

    >>> acc = RoutingAccumulator(n_experts=4, top_k=1)
    >>> acc.update(torch.tensor([[0.0, 0.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0]]))
    >>> {k: round(float(v), 2) for k, v in acc.summary().items()}  # doctest: +NORMALIZE_WHITESPACE
    {'token_entropy': 0.69, 'token_entropy_norm': 0.5, 'token_entropy_norm_p05': 0.0,
     'token_entropy_norm_min': 0.0, 'load_entropy': 0.5, 'load_maxvio': 1.0}
    """

    def __init__(
        self, n_experts: int, top_k: int | None, bins: int = 1000, scoring: str = "softmax"
    ) -> None:
        if n_experts < 2:
            raise ValueError(f"a router needs at least 2 experts, got {n_experts}")
        if top_k is not None and not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, {n_experts}], got {top_k}")
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
        self.n_experts, self.top_k, self.bins, self.scoring = n_experts, top_k, bins, scoring
        self.reset()

    def reset(self) -> None:
        self._count = 0
        self._h: _Entropies | None = None  # None while empty
        # the expert load; None also once a batch did not say which experts it chose
        self._load: torch.Tensor | None = None

    @property
    def empty(self) -> bool:
        return self._count == 0

    def update(self, logits: torch.Tensor, selected: torch.Tensor | None = None) -> None:
        """Add a batch of router logits, shape (..., E), and the experts the router selected
        for each token where it says — indices (…, k) or a boolean routing map (…, E), whose
        column sums are the load; else the top-k of the logits are counted."""
        logits = logits.detach().reshape(-1, self.n_experts)
        h = token_entropy(routing_logits(logits, self.scoring)) / math.log(self.n_experts)
        h = h.clamp(0.0, 1.0)  # round-off just past an edge would fall out of the histogram
        hist = torch.histc(h, bins=self.bins, min=0.0, max=1.0)
        load = None
        if selected is not None and selected.dtype == torch.bool:  # (…, E) routing map
            load = selected.detach().reshape(-1, self.n_experts).sum(0).float()
        elif selected is not None:
            chosen = selected.detach().flatten().long()
            load = torch.bincount(chosen, minlength=self.n_experts)[: self.n_experts].float()
        elif self.top_k is not None:
            chosen = logits.topk(self.top_k, dim=-1).indices.flatten()
            load = torch.bincount(chosen, minlength=self.n_experts).float()
        if self._h is None:  # the first batch
            self._h, self._load = _Entropies(h.sum(), h.min(), hist), load
        else:
            kept = self._h
            self._h = _Entropies(
                kept.sum + h.sum(), torch.minimum(kept.min, h.min()), kept.hist + hist
            )
            self._load = None if load is None or self._load is None else self._load + load
        self._count += h.numel()

    def state(self) -> torch.Tensor | None:
        """[count, Σ h, min h, histogram…, load…] in float64, None when empty: what ranks
        combine (sum, but min for min h) to get the statistics of the union of their tokens.

        >>> a, b = RoutingAccumulator(4, 1), RoutingAccumulator(4, 1)
        >>> a.update(torch.tensor([[0.0, 0.0, 0.0, 0.0]])); b.update(torch.tensor([[9.0, 0, 0, 0]]))
        >>> both = RoutingAccumulator(4, 1); both.load_state(merge_states([a.state(), b.state()]))
        >>> round(float(both.summary()["token_entropy_norm"]), 2)
        0.5
        """
        if self._h is None:
            return None
        count = torch.tensor(float(self._count))
        parts = [torch.stack([count, self._h.sum.cpu(), self._h.min.cpu()])]
        parts += [self._h.hist.cpu()] + ([self._load.cpu()] if self._load is not None else [])
        return torch.cat([p.double().reshape(-1) for p in parts])

    def load_state(self, state: torch.Tensor | None) -> None:
        """Replace what was gathered by a ``state()`` (or a merge of several)."""
        self.reset()
        if state is None:
            return
        state = torch.as_tensor(state, dtype=torch.float64)
        self._count = int(state[0].item())
        self._h = _Entropies(state[1].float(), state[2].float(), state[3 : 3 + self.bins].float())
        load = state[3 + self.bins :]
        self._load = load.float() if load.numel() == self.n_experts else None

    def summary(self) -> dict[str, torch.Tensor]:
        """Scalar tensors (still on device): mean raw and normalized entropy, p5, min, load."""
        if self._h is None:
            return {}
        mean_norm = self._h.sum / self._count
        cdf = self._h.hist.cumsum(0) / self._count
        p05_bin = torch.searchsorted(cdf, torch.tensor(0.05, device=cdf.device))
        out = {
            "token_entropy": mean_norm * math.log(self.n_experts),
            "token_entropy_norm": mean_norm,
            "token_entropy_norm_p05": p05_bin.float() / self.bins,
            "token_entropy_norm_min": self._h.min,
        }
        if self._load is not None:
            out["load_entropy"], out["load_maxvio"] = expert_load_stats(self._load)
        return out


def merge_states(states: list[torch.Tensor | None]) -> torch.Tensor | None:
    """One accumulator state from several ranks' (``RoutingAccumulator.state``): counts, sums,
    histograms and loads add, the minimum is the least. States without a load (a rank that
    saw no selection) drop the load of the merge rather than undercount it."""
    present = [torch.as_tensor(s, dtype=torch.float64) for s in states if s is not None]
    if not present:
        return None
    width = min(s.numel() for s in present)
    stacked = torch.stack([s[:width] for s in present])
    merged = stacked.sum(0)
    merged[2] = stacked[:, 2].min()
    return merged
