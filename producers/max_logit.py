"""The largest pre-softmax attention logit of a layer, from the q and k its kernel receives.

Why: under biased rounding in attention's backward the logits grow without bound long before
the loss moves (README, *What the lab shows*). Fused kernels (SDPA, FlashAttention) never
materialise the scores, so on a monitoring step the logits are recomputed from the kernel's
own inputs: max over allowed (query, key) pairs of α q·k [logit units], with the kernel's
scale α (1/√d_h by default) and its mask. On other steps nothing is computed.

Two ways in, for two kinds of code:

* ``SdpaLogitWatch`` (plain PyTorch using ``F.scaled_dot_product_attention``, and models that
  call it directly, such as transformers' Falcon): ``monitor.watch_sdpa()`` — one line.
* transformers models that dispatch through the library's attention registry:
  ``foreshock.producers.hf_attention`` (the HF callback turns it on).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["SdpaLogitWatch", "masked_max_logit"]

_CHUNK_ELEMENTS = 2**24  # scores computed per block of query rows: bounds the working set


def masked_max_logit(
    query: torch.Tensor,
    key: torch.Tensor,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """max α q·k over the (query, key) pairs the mask allows; 0-d float32, detached.

    query (B, H, T_q, d), key (B, H_kv, T_k, d) with H a multiple of H_kv (grouped heads share
    a key head); ``mask`` as SDPA takes it: boolean (True = may attend) or additive (added to
    the logits before the max, so −inf excludes a pair), broadcastable to (B, H, T_q, T_k).
    ``is_causal``: query i sees keys j ≤ i + T_k − T_q. Scores are formed one block of query
    rows at a time (at most 2**24 elements each).

    >>> q = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]]]])  # (1, 1, 2, 2)
    >>> round(masked_max_logit(q, q, scale=1.0).item(), 4)
    4.0
    >>> k = torch.tensor([[[[1.0, 0.0], [5.0, 0.0]]]])  # q0·k1 = 5 lies in the future
    >>> round(masked_max_logit(q, k, scale=1.0).item(), 4)
    5.0
    >>> round(masked_max_logit(q, k, scale=1.0, is_causal=True).item(), 4)
    1.0
    """
    with torch.no_grad():
        q, k = query.detach().float(), key.detach().float()
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        alpha = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        t_q, t_k = q.shape[-2], k.shape[-2]
        rows = max(1, _CHUNK_ELEMENTS // max(1, q.shape[0] * q.shape[1] * t_k))
        best = torch.full((), -math.inf, device=q.device)
        for start in range(0, t_q, rows):
            block = slice(start, min(start + rows, t_q))
            scores = (q[..., block, :] @ k.transpose(-2, -1)) * alpha  # (B, H, rows, T_k)
            scores = _apply_mask(scores, mask, block, is_causal, t_q, t_k)
            best = torch.maximum(best, scores.amax())
        return best


def _apply_mask(
    scores: torch.Tensor,
    mask: torch.Tensor | None,
    block: slice,
    is_causal: bool,
    t_q: int,
    t_k: int,
) -> torch.Tensor:
    if is_causal:
        i = torch.arange(block.start, block.stop, device=scores.device).unsqueeze(1)
        j = torch.arange(t_k, device=scores.device)
        scores = scores.masked_fill(j > i + (t_k - t_q), -math.inf)
    if mask is not None:
        m = mask[..., block, :] if mask.dim() >= 2 and mask.shape[-2] == t_q else mask
        boolean = m.dtype == torch.bool
        scores = scores.masked_fill(~m, -math.inf) if boolean else scores + m.float()
    return scores


class SdpaLogitWatch:
    """Records each watched layer's max logit from the ``F.scaled_dot_product_attention`` calls
    made inside its forward, on monitoring steps only.

    ``Monitor.watch_sdpa()`` builds one: forward pre/post hooks on the layers mark which layer
    is running (a thread-local), and ``F.scaled_dot_product_attention`` is replaced, once per
    process, by a wrapper that reports to that layer's observer and then calls the original
    (code that imported the function by name before the wrapper was installed keeps the
    original; transformers and most code call it as ``F.scaled_dot_product_attention``).
    Off a monitoring step the wrapper costs one attribute lookup; the original is called with
    exactly the same arguments, so training is unchanged. ``close()`` removes the hooks (the
    process-wide wrapper stays, idle).
    """

    _current = threading.local()
    _original: Callable[..., torch.Tensor] | None = None

    def __init__(
        self,
        layers: Iterable[tuple[str, nn.Module]],
        observe: Callable[[str, torch.Tensor], None],
        measuring: Callable[[], bool],
        on_error: Callable[[str, Exception], None],
    ) -> None:
        self._observe, self._measuring, self._on_error = observe, measuring, on_error
        self._handles = []
        for name, module in layers:
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            self._handles.append(module.register_forward_hook(self._leave))
        _install_sdpa_wrapper()

    def _enter(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            watch = self if self._measuring() else None
            SdpaLogitWatch._current.layer = (name, watch)

        return hook

    @staticmethod
    def _leave(module: nn.Module, args: Any, output: Any) -> None:
        SdpaLogitWatch._current.layer = None

    def record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called by the wrapper inside a watched layer on a monitoring step."""
        query, key = args[0], args[1]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        is_causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        value = masked_max_logit(query, key, kwargs.get("scale"), mask, bool(is_causal))
        self._observe(name, value)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _install_sdpa_wrapper() -> None:
    """Replace F.scaled_dot_product_attention by a reporting wrapper, once per process."""
    if SdpaLogitWatch._original is not None:
        return
    original = torch.nn.functional.scaled_dot_product_attention
    SdpaLogitWatch._original = original

    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
        current = getattr(SdpaLogitWatch._current, "layer", None)
        if current is not None and current[1] is not None:
            name, watch = current
            try:
                watch.record(name, args, kwargs)
            except Exception as exc:  # monitoring never breaks the forward pass
                watch._on_error(name, exc)
        return original(*args, **kwargs)

    scaled_dot_product_attention.__doc__ = original.__doc__
    torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention
