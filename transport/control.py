"""The control topic (``foreshock.control/1``): a person's requests to a running trainer.

A warning names its cause; the policy (:mod:`foreshock.remediation.remedy`) acts on it by itself
only where the trainer opted in. Elsewhere a person decides: ``foreshock warnings act ID``
publishes a *remedy request* on the control topic, keyed by the run id (a run's requests stay
ordered in one partition), and the trainer's sink hands it to the trainer at its next step
boundary (``KafkaSink.poll_requests``, :mod:`foreshock.delivery.control_requests`). The
trainer answers with an ``action`` record on the metrics topic carrying the request's
``request_id`` (:mod:`foreshock.transport.wire`): the acknowledgement ``warnings act --wait``
waits for, and the detectors' reason to resolve the warning.

A request::

    {"schema": "foreshock.control/1", "kind": "remedy-request", "request_id": "<uuid4 hex>",
     "run_id": "...", "warning_id": "...", "family": "router", "module": "blocks.1.moe",
     "step": 450, "action": "scale-router-lr" | null, "rollback": true | false | null,
     "lr_scale": 0.5 | null, "by": "ana", "time": 1764513600.0, "expires": 1764517200.0,
     "again": false, "evidence": {"recent": [[step, value, z], ...]},
     "key_id": "3f2a...", "signature": "<base64 Ed25519>"}

A trainer follows only requests signed by an approver on its allowlist, in their validity
window (:mod:`foreshock.transport.approvals`); ``by`` is then the allowlist's name for the
key. ``again``: act even if this warning was acted on already (a second ``act`` is otherwise
refused: one warning, one remedy).

``action`` null: the trainer's policy picks the action for the family; ``rollback`` and
``lr_scale`` null: the policy's. ``step`` is the warning's (where it opened); ``evidence``
carries its first records, so that a rollback restores a snapshot from before them, as the
automatic path does.

Why a topic of its own, not the warnings topic: the trainer would read every warning event
of every run to find the few requests, and a request is not a warning's event — the warning
changes only when the trainer acted (its ``action`` record).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .approvals import DEFAULT_LIFETIME
from .wire import WireError, check_run_id

__all__ = [
    "ACTION_NAME",
    "CONTROL_SCHEMA",
    "REQUEST_KIND",
    "ControlError",
    "check_request",
    "decode_request",
    "remedy_request",
]

CONTROL_SCHEMA = "foreshock.control/1"
REQUEST_KIND = "remedy-request"
# a remedy's name, as a request carries it: which remedies there are is the trainer's side
# (foreshock.remediation.remedies, one module each), which checks it and refuses, with a
# record, one it does not know; the asking command lists the known ones before sending
ACTION_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
_MAX_BYTES = 100_000


class ControlError(ValueError):
    """A request that cannot be sent or followed; the text says which field and why."""


def remedy_request(
    warning: Mapping[str, Any],
    by: str,
    action: str | None = None,
    rollback: bool | None = None,
    lr_scale: float | None = None,
    now: float | None = None,
    lifetime: float = DEFAULT_LIFETIME,
    again: bool = False,
) -> dict[str, Any]:
    """The request to act on ``warning`` (a stored warning's state: id, run, family, module,
    step, evidence); ControlError for an action or scale the trainer could not follow.

    >>> w = {"id": "w1", "run_id": "r1", "family": "router", "module": "b.1", "step": 450}
    >>> r = remedy_request(w, "ana", "scale-router-lr", lr_scale=0.5, now=0.0)
    >>> r["kind"], r["run_id"], r["action"], r["rollback"], r["lr_scale"], len(r["request_id"])
    ('remedy-request', 'r1', 'scale-router-lr', None, 0.5, 32)
    >>> remedy_request(w, "ana", "Lower LR!")
    Traceback (most recent call last):
    ...
    foreshock.transport.control.ControlError: not a remedy's name: 'Lower LR!'
    """
    recent = (warning.get("evidence") or {}).get("recent")
    request = {
        "schema": CONTROL_SCHEMA,
        "kind": REQUEST_KIND,
        "request_id": uuid.uuid4().hex,
        "run_id": warning.get("run_id"),
        "warning_id": warning.get("id"),
        "family": warning.get("family"),
        "module": warning.get("module"),
        "step": warning.get("step"),
        "action": action,
        "rollback": rollback,
        "lr_scale": lr_scale,
        "by": by,
        "time": time.time() if now is None else now,
        "again": again,
    }
    request["expires"] = (time.time() if now is None else now) + lifetime
    if isinstance(recent, list) and recent:
        request["evidence"] = {"recent": recent[:64]}
    return check_request(request)


def decode_request(data: bytes | str | None) -> dict[str, Any]:
    """A control message's value as a checked request; ControlError otherwise."""
    if data is None or len(data) > _MAX_BYTES:
        raise ControlError("empty or oversized control message")
    try:
        message = json.loads(data)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ControlError(f"not JSON: {exc}") from None
    return check_request(message)


def check_request(message: Any) -> dict[str, Any]:
    """``message`` if it is a remedy request a trainer can follow, else ControlError naming
    the field: the trainer's side applies only what this lets through."""
    if not isinstance(message, dict):
        raise ControlError(f"a request is a JSON object, not {type(message).__name__}")
    if message.get("schema") != CONTROL_SCHEMA or message.get("kind") != REQUEST_KIND:
        raise ControlError(f"not a {CONTROL_SCHEMA} {REQUEST_KIND}")
    try:
        check_run_id(message.get("run_id"))
    except WireError as exc:
        raise ControlError(str(exc)) from None
    for name in ("request_id", "warning_id", "family", "by"):
        if not isinstance(message.get(name), str) or not message[name]:
            raise ControlError(f"{name} must be a non-empty string, got {message.get(name)!r:.80}")
    if message.get("module") is not None and not isinstance(message["module"], str):
        raise ControlError("module must be a string or null")
    step = message.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ControlError(f"step must be an integer >= 0, got {step!r:.80}")
    _check_choice(message)
    moment = message.get("time")
    if isinstance(moment, bool) or not isinstance(moment, int | float) or not math.isfinite(moment):
        raise ControlError("time must be a number (Unix seconds)")
    _check_evidence(message.get("evidence"))
    _check_approval(message)
    return message


def _check_approval(message: dict[str, Any]) -> None:
    """The signature's fields, where present, of the types the trainer verifies."""
    expires = message.get("expires")
    if expires is not None and (
        isinstance(expires, bool)
        or not isinstance(expires, int | float)
        or not math.isfinite(expires)
    ):
        raise ControlError("expires must be a number (Unix seconds) or absent")
    for name in ("key_id", "signature"):
        if message.get(name) is not None and not isinstance(message[name], str):
            raise ControlError(f"{name} must be a string or absent")
    if not isinstance(message.get("again", False), bool):
        raise ControlError("again must be true or false")


def _check_evidence(evidence: Any) -> None:
    """Absent, or ``{"recent": [[step, ...], ...]}``: the trainer reads the first steps."""
    if evidence is None:
        return
    recent = evidence.get("recent", []) if isinstance(evidence, dict) else None
    if not isinstance(recent, list) or not all(
        isinstance(r, list) and r and isinstance(r[0], int) and not isinstance(r[0], bool)
        for r in recent
    ):
        raise ControlError('evidence must be {"recent": [[step, ...], ...]}')


def _check_choice(message: dict[str, Any]) -> None:
    """What the person chose: a remedy's name (or null), a rollback flag, a scale in (0, 1]."""
    action = message.get("action")
    if action is not None and not (isinstance(action, str) and ACTION_NAME.fullmatch(action)):
        raise ControlError(f"not a remedy's name: {action!r:.80}")
    if message.get("rollback") is not None and not isinstance(message["rollback"], bool):
        raise ControlError("rollback must be true, false or null")
    scale = message.get("lr_scale")
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1:
        raise ControlError(f"lr_scale must be a number in (0, 1], got {scale!r:.80}")
