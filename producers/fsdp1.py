"""FSDP1 (``FullyShardedDataParallel``, Lightning's ``FSDPStrategy``): its parameters whole.

Why apart from :mod:`~foreshock.producers.collective`: FSDP1 holds no DTensors. Outside
forward its parameters are views into each rank's shard of a flat parameter (1-D pieces, or
empty), so every rank enters :func:`whole_parameters` around its whole measurement
(``summon_full_params``, an all-gather, on every rank in the same order) and the specs read
whole plain tensors: nothing is left for the collective step to gather.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from torch.distributed.fsdp import FullyShardedDataParallel

__all__ = ["fsdp1_roots", "whole_parameters"]

log = logging.getLogger("foreshock.monitor")


def fsdp1_roots(modules: list[nn.Module]) -> list[FullyShardedDataParallel]:
    """The outermost FSDP1 instances in ``modules`` and their submodules, in module order."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # torch without distributed support
        return []
    found: list[FullyShardedDataParallel] = []
    inside: set[int] = set()
    for top in modules:
        for module in top.modules():
            if isinstance(module, FullyShardedDataParallel) and id(module) not in inside:
                found.append(module)
                inside.update(id(m) for m in module.modules())
    return found


@contextlib.contextmanager
def whole_parameters(
    model: nn.Module, roots: list[nn.Module] | tuple[nn.Module, ...] = ()
) -> Iterator[None]:
    """Every FSDP1 parameter of ``model`` whole while inside (its ``roots``, the FSDP1 wrappers
    around it, first); nothing to do for any other model.

    Why: FSDP1 keeps each rank's shard of a flat parameter; outside forward the model's
    parameters are views into that shard (1-D pieces, or empty). ``summon_full_params`` makes
    them the whole tensors, the same ``Parameter`` objects (``use_orig_params=True``, Lightning's
    default), with their whole gradients; ``writeback=False``: measuring never changes the model.
    It is a collective: every rank enters it, in the same order. An instance not yet lazily
    initialised is entered only when it is a root given here: entering a nested instance first
    would make it a root and break the training's own first forward."""
    wrappers = fsdp1_roots([*roots, model])
    given = {id(r) for r in roots}
    with contextlib.ExitStack() as stack:
        for fsdp in wrappers:
            if fsdp._is_root is None and id(fsdp) not in given and fsdp is not model:
                log.warning("foreshock: FSDP1 wrapper not initialised yet: left sharded")
                continue
            stack.enter_context(
                type(fsdp).summon_full_params(
                    fsdp, writeback=False, with_grads=bool(fsdp._use_orig_params)
                )
            )
        yield
