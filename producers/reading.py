"""What one rank reads on a monitoring step, as plain functions of what it holds.

Why apart from the Monitor: the Monitor decides *when* (monitoring steps, armed forwards) and
keeps the state between steps (snapshots, accumulators, observations); reading a step is a
pure pass over the rank's tensors — its owned layers (chosen with its peers,
:mod:`~foreshock.producers.collective`), its share of the norms, its losses, logits and drops —
whose values come to the host in one transfer and are sorted into a
:class:`~foreshock.producers.partials.RankPart`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from foreshock.transport.records import parse_series_key, series_key

from .collective import Peers
from .layouts import AttentionSpec, RouterSpec
from .norm_shares import square_sum
from .partials import RankPart

__all__ = ["holders_of", "owned_by_me", "sort_values", "symptom_chunk", "to_host"]

Chunk = tuple[list[str], torch.Tensor]  # series keys, their values on the device


def owned_by_me(
    peers: Peers,
    rank: int,
    specs: dict[str, Any],
    plan: list[tuple[str, int]],
    failure: Exception | None,
    names: list[str],
) -> tuple[list[AttentionSpec], list[RouterSpec]]:
    """The specs this rank computes, read whole: the ranks exchange their plans
    (``Peers.schedule``; ``failure``: this rank could not read its specs, so every rank skips
    the gathers), each spec is read by the ranks that hold it (a collective among them) and
    kept by one of them, its owner, so the spectra are spread over the ranks. ``plan``: each
    spec's name and how many tensors reading it gathers; ``names``: this rank's parameter
    names, sent with the first plan only."""
    try:
        schedule = peers.schedule(failure is None, plan, names)
    except RuntimeError as exc:
        raise exc from failure
    mine = []
    for i, (name, holders) in enumerate(schedule):
        if rank in holders:  # the holders gather together: the same order on each
            whole = peers.materialize(specs[name], holders[i % len(holders)])
            if whole is not None:
                mine.append(whole)
    return (
        [s for s in mine if isinstance(s, AttentionSpec)],
        [s for s in mine if isinstance(s, RouterSpec)],
    )


def holders_of(peers: Peers | None) -> Callable[[str], int]:
    """How many ranks hold the parameter of a name (1 alone; every rank before the first
    plan exchange told)."""
    if peers is None:
        return lambda name: 1
    counts, world = peers.holders, peers.world
    return (lambda name: world) if counts is None else (lambda name: counts.get(name, 1))


def symptom_chunk(
    named: list[tuple[str, torch.Tensor]],
    holders: Callable[[str], int],
    loss: torch.Tensor | float | None,
    max_logits: dict[str, torch.Tensor],
    drops: dict[str, tuple[torch.Tensor, int]],
) -> Chunk:
    """Loss, this rank's shares of Σ‖g‖² and Σ‖w‖² (``square:`` keys), max logits and dropped
    tokens (``dropped:`` keys), on the parameters' device."""
    params = [p for _, p in named]
    copies = [holders(n) for n, _ in named]
    with_grad = [(p, h) for p, h in zip(params, copies, strict=True) if p.grad is not None]
    grads = [p.grad for p, _ in with_grad if p.grad is not None]  # read local, detached
    entries: list[tuple[str, torch.Tensor | None]] = [
        (
            "square:grad_norm",
            square_sum(grads, [h for _, h in with_grad], [p for p, _ in with_grad]),
        ),
        ("square:weight_norm", square_sum(params, copies)),
    ]
    if loss is not None:
        loss_value = loss.detach() if isinstance(loss, torch.Tensor) else loss
        entries.append(("loss", torch.as_tensor(loss_value, dtype=torch.float32)))
    entries += [(series_key("max_logit", n), v) for n, v in max_logits.items()]
    entries += [(f"dropped:{n}", d) for n, (d, _) in drops.items()]
    device = params[0].device if params else torch.device("cpu")
    kept = [(k, v) for k, v in entries if v is not None]
    values = [torch.as_tensor(v).to(device, torch.float32).reshape(()) for _, v in kept]
    stacked = torch.stack(values) if values else torch.zeros(0, device=device)
    return [k for k, _ in kept], stacked


def to_host(values: list[torch.Tensor]) -> list[float]:
    """Every chunk's values as floats: the one device sync of a monitoring step."""
    if not values:
        return []
    device = values[0].device
    flat = torch.cat([v.detach().to(device, torch.float32).flatten() for v in values])
    return flat.cpu().tolist()


def sort_values(
    part: RankPart, chunks: list[Chunk], drops: dict[str, tuple[torch.Tensor, int]]
) -> None:
    """Bring ``chunks`` to the host and sort each value into ``part`` by its key."""
    keys = [key for chunk_keys, _ in chunks for key in chunk_keys]
    values = to_host([v for _, v in chunks])
    for key, value in zip(keys, values, strict=True):
        if key.startswith("square:"):
            part.squares[key.removeprefix("square:")] = value
        elif key == "loss":
            part.loss = value
        elif key.startswith("max_logit@"):
            part.max_logits[parse_series_key(key).module or key] = value
        elif key.startswith("dropped:"):
            name = key.removeprefix("dropped:")
            part.drops[name] = (value, drops[name][1])
        else:
            part.owned[key] = value
