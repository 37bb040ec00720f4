"""One HTTP try to get a payload to a receiver: standard library only.

:func:`request` makes one try and says whether another may pass (connection errors, timeouts,
5xx, 429 — with its ``Retry-After``) or not (any other 4xx: the payload or the URL is wrong);
retrying, with backoff and jitter, is the courier's (:mod:`foreshock.notify.courier`). It
never raises, and logs say where by kind, scheme and host only (``Target.where``). What is
sent: :mod:`foreshock.notify.payloads`.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .signing import signature_headers
from .targets import Target

__all__ = ["Outcome", "Target", "backoff_delay", "encode", "request"]

log = logging.getLogger(__name__)


def encode(payload: Any) -> bytes:
    """A payload's JSON body (ValueError if it is not JSON: a bug, never a retry)."""
    try:
        return json.dumps(payload, default=str).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"payload is not JSON: {exc}") from None


@dataclass(frozen=True)
class Outcome:
    """One try: ``ok`` (a 2xx came back, with its JSON ``answer`` if any), else whether another
    try may pass (``retry``), why not, and the receiver's ``Retry-After`` (``wait``, s)."""

    ok: bool
    retry: bool = False
    reason: str = ""
    wait: float = 0.0
    answer: Any = None


def _retry_after(exc: urllib.error.HTTPError) -> float:
    try:
        return max(0.0, float(exc.headers.get("Retry-After", 0)))
    except (TypeError, ValueError):
        return 0.0  # an HTTP date: fall back to our own backoff


def request(
    target: Target, url: str, body: bytes | None, method: str = "POST", timeout: float = 5.0
) -> Outcome:
    """One try of ``method url`` with ``body``, the target's headers and, if it has a secret,
    a fresh signature. Never raises."""
    headers = {"User-Agent": "foreshock-notify", **dict(target.headers)}
    if body is not None:
        headers["Content-Type"] = "application/json"
        if target.secret is not None:
            headers.update(signature_headers(target.secret, body))
    try:
        req = urllib.request.Request(url, data=body, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw = response.read(1_000_000)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        return Outcome(True, answer=answer)
    except urllib.error.HTTPError as exc:
        if exc.code != 429 and exc.code < 500:
            text = exc.read(300).decode("utf-8", "replace")
            return Outcome(False, False, f"HTTP {exc.code}: {text}")
        return Outcome(False, True, f"HTTP {exc.code}", _retry_after(exc))
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        return Outcome(False, True, str(getattr(exc, "reason", exc)))
    except Exception as exc:  # a bug here must not kill a courier
        log.exception("foreshock notify: %s failed unexpectedly", target.where)
        return Outcome(False, False, f"unexpected {type(exc).__name__}")


def backoff_delay(tries: int, base: float, cap: float, jitter: Callable[[], float]) -> float:
    """The wait after ``tries`` failed tries: ``base``·2^(tries−1), at most ``cap``, times a
    random factor in [0.5, 1) (``jitter()`` in [0, 1)) so that notifiers that failed together
    do not retry together.

    >>> [backoff_delay(n, 0.5, 4.0, lambda: 0.0) for n in (1, 2, 3, 4, 5)]
    [0.25, 0.5, 1.0, 2.0, 2.0]
    """
    return min(cap, base * 2 ** max(tries - 1, 0)) * (0.5 + jitter() / 2)
