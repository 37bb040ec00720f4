"""Which of a person's approved requests a trainer refuses, and why.

A signed request (:mod:`foreshock.transport.approvals`) is a person's decision, but a decision
bounded like the automatic policy's: the same actions a run allows (``max_actions``), spaced
the same (``backoff_steps``), one remedy per warning, and nothing that changes nothing. What
is refused is recorded as an ``action`` record that was not applied (``detail.refused``), so
the run page and the store say who asked for what, and why it was not done.

Refused, in this order (the first reason wins):

* what the control thread refused already (unsigned, unknown key, bad signature, expired,
  future-dated, a replayed request id: ``request["refused"]``);
* a request id this trainer applied or refused before (at this boundary too);
* a warning acted on already, unless the request says ``again``;
* over the policy's bounds: ``max_actions`` actions taken, or fewer than ``backoff_steps``
  steps since the last — except ``stop``: a person may always end a run (it happens once);
* a no-op: ``hold-lr`` at ×1 (it would only mark the warning resolved).

>>> noop = {"request_id": "r2", "warning_id": "w1", "action": "hold-lr", "lr_scale": 1.0}
>>> refusal(noop, taken=[], allowed=True)
'a no-op: hold-lr at x1 changes nothing'
>>> refusal({"request_id": "r1", "warning_id": "w1"}, taken=[("r1", "w9", False)], allowed=True)
'request r1 was handled already'
>>> refusal({"request_id": "r3", "warning_id": "w1"}, taken=[("r1", "w1", True)], allowed=True)
'warning w1 was acted on already (act --again to act once more)'
>>> refusal({"request_id": "r3", "warning_id": "w1"}, taken=[("r1", "w1", False)], allowed=True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["refusal"]


def refusal(
    request: Mapping[str, Any],
    taken: Iterable[tuple[str | None, str, bool]],
    allowed: bool,
    lr_scale: float | None = None,
) -> str | None:
    """Why ``request`` is refused, or None. ``taken``: (request id, warning id, applied) of
    every action taken or decided, refusals too; ``allowed``: within the policy's count and
    backoff; ``lr_scale``: the policy's, when the request gives none."""
    if request.get("refused"):
        return str(request["refused"])
    taken = list(taken)
    request_id = str(request.get("request_id") or "")
    if request_id and any(request_id == r for r, _, _ in taken):
        return f"request {request_id} was handled already"
    warning_id = request.get("warning_id")
    if not request.get("again") and any(w == warning_id and done for _, w, done in taken):
        return f"warning {warning_id} was acted on already (act --again to act once more)"
    if not allowed and request.get("action") != "stop":
        return "over the policy's bounds (max_actions, backoff_steps)"
    scale = request.get("lr_scale") if request.get("lr_scale") is not None else lr_scale
    if request.get("action") == "hold-lr" and scale is not None and float(scale) >= 1:
        return "a no-op: hold-lr at x1 changes nothing"
    return None
