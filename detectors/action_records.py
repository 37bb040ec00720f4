"""An action the trainer took about a warning resolves it: every action is an event.

A trainer that acts on a warning — by its policy or at a person's request (``foreshock
warnings act``) — writes an ``action`` record in its run's stream
(:func:`foreshock.remediation.remedy.action_record`). Once the cause is removed the statistic
that warned may take hundreds of steps to fall back under its threshold, or never (a learning
rate held lower does not bring a drifted entropy back); left open, the warning would keep
paging about something already handled. So an *applied* action resolves the warning it names
at once: a ``cleared`` event whose evidence says ``resolved_by: action`` and what was done.

What resolves nothing: a dry run (nothing was done), a failed action (``error``: the cause is
still there; the store keeps the record, the dashboard shows it), and an action naming a
warning that is not open (resolved already, or another rank's detector holds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["resolution"]


def resolution(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The clearing's evidence for an ``action`` record, or None where it resolves nothing.

    >>> why = resolution({"kind": "action", "action": "hold-lr", "step": 470, "applied": True,
    ...                   "source": "approved", "request_id": "q1", "warning_id": "w1"})
    >>> why["resolved_by"], why["action"]["what"], why["action"]["step"], why["action"]["source"]
    ('action', 'hold-lr', 470, 'approved')
    >>> resolution({"action": "stop", "step": 5, "applied": False, "error": "no stop()"}) is None
    True
    >>> resolution({"action": "stop", "step": 5, "applied": True, "dry_run": True}) is None
    True
    """
    if message.get("applied") is not True or message.get("dry_run") or message.get("error"):
        return None
    return {
        "resolved_by": "action",
        "action": {
            "what": message.get("action"),
            "step": message.get("step"),
            "source": message.get("source") or "policy",
            "request_id": message.get("request_id"),
            "approver": message.get("approver"),  # who approved it (a verified request)
            "rolled_back_to": message.get("rolled_back_to"),
            "error": message.get("error"),
        },
    }
