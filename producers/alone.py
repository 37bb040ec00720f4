"""What a rank measuring alone must not touch, and the one loud line that says so.

A rank with no peers to measure with (``collective.Peers.join`` found no process group, or
the group did not join) cannot read what only the group holds: touching a DTensor parameter
alone issues collectives its peers never join, and the job aborts (gloo) or hangs (NCCL);
Megatron's tensor-parallel partitions and FSDP1's flat shards are no whole weight. So those
parts are *refused*: dropped from the discovery before they are read, named in one ERROR line
and in ``Monitor.describe()["refused"]``. Monitoring the rest goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .discovery import Discovery
from .fsdp1 import fsdp1_roots
from .layouts import AttentionSpec, RouterSpec
from .sharding import sharded_tensors

__all__ = ["Refusals"]

log = logging.getLogger("foreshock.monitor")

SYMPTOMS_SHARDED = "symptoms (sharded parameters: grad_norm, weight_norm)"
SYMPTOMS_FSDP1 = "symptoms (grad_norm, weight_norm)"


class Refusals:
    """The parts refused so far (``refused``, by name) and whether the norms are
    (``norms``: a rank's own shards are no norm of the model)."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.norms = False

    def check(
        self,
        model: nn.Module,
        discovery: Discovery,
        attention: Sequence[AttentionSpec],
        routers: Sequence[RouterSpec],
        live_params: Callable[[], list[torch.Tensor]],
    ) -> None:
        """Refuse, in ``discovery``, the parts of a model this lone rank cannot read whole;
        ``attention`` and ``routers`` are the specs read from the live parameters."""
        refused = [a.name for a in attention if sharded_tensors(a.tensors())]
        refused += [r.name for r in routers if sharded_tensors(r.tensors())]
        if not self.norms and sharded_tensors(live_params()):
            self.norms = True
            refused.append(SYMPTOMS_SHARDED)
        self.refuse(discovery, refused, "sharded parameters, and this rank measures alone")
        if fsdp1_roots([model]):  # flat shards: no part of them is a whole weight
            self.norms = True
            parts = [a.name for a in attention] + [r.name for r in routers]
            self.refuse(discovery, [*parts, SYMPTOMS_FSDP1], "FSDP1, measured alone")

    def refuse(self, discovery: Discovery, parts: list[str], why: str) -> None:
        """Stop measuring ``parts`` (specs by name), with one ERROR line."""
        new = [name for name in parts if name not in self.refused]
        if not new:
            return
        self.refused += new
        names = set(parts)
        discovery.attention = [a for a in discovery.attention if a.name not in names]
        discovery.routers = [r for r in discovery.routers if r.name not in names]
        log.error(
            "foreshock: the model is sharded (%s); these parts are NOT measured, so that "
            "monitoring never reports a shard as the whole or hangs the job: %s",
            why,
            ", ".join(new),
        )
