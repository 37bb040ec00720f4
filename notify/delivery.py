"""One HTTP try to get a payload to a receiver: standard library only.

:func:`request` makes one try and says whether another may pass (connection errors, timeouts,
5xx, 429 — with its ``Retry-After``) or not (any other 4xx: the payload or the URL is wrong);
retrying, with backoff and jitter, is the courier's (:mod:`foreshock.notify.courier`). It
never raises, and logs say where by kind, scheme and host only (``Target.where``). What is
sent: :mod:`foreshock.notify.payloads`.

What a receiver cannot make it do:

* **follow a redirect** — anywhere: a 3xx is an answer, refused (not retried). Followed, a
  redirect once carried the bearer token and the signature to another host (and to
  ``ftp://``), and the delivery was counted as made;
* **hold a courier** — each try has a *deadline* (``timeout`` s for the whole exchange, not per
  socket read): a receiver trickling a byte every 4 s once kept a courier's thread forever,
  logging nothing; at the deadline its socket is shut and the try fails (retried);
* **write into the log** — what a receiver says (an error body, a status line) is logged as
  one line of printable text (:func:`printable`): newlines, ANSI codes and fake log lines are
  escaped.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .signing import signature_headers
from .targets import Target

__all__ = ["Outcome", "Target", "backoff_delay", "encode", "printable", "request"]

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
    deadline = _Deadline(timeout)
    try:
        req = urllib.request.Request(url, data=body, headers=headers, method=method)
        with deadline, deadline.opener.open(req, timeout=timeout) as response:
            raw = response.read(1_000_000)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        return Outcome(True, answer=answer)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            return Outcome(False, False, f"HTTP {exc.code}: a redirect, not followed")
        if exc.code != 429 and exc.code < 500:
            text = printable(exc.read(300).decode("utf-8", "replace"))
            return Outcome(False, False, f"HTTP {exc.code}: {text}")
        return Outcome(False, True, f"HTTP {exc.code}", _retry_after(exc))
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        why = "no answer within the deadline" if deadline.passed else getattr(exc, "reason", exc)
        return Outcome(False, True, printable(str(why)))
    except Exception as exc:  # a bug here must not kill a courier
        log.exception("foreshock notify: %s failed unexpectedly", target.where)
        return Outcome(False, False, f"unexpected {type(exc).__name__}")


def printable(text: str, limit: int = 300) -> str:
    """``text`` as one line of printable characters (others escaped), at most ``limit`` long.

    >>> printable("oops\\n2026-01-01 INFO all fine\\x1b[31m")
    'oops\\\\n2026-01-01 INFO all fine\\\\x1b[31m'
    """
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return escaped[:limit]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Every 3xx an answer (``HTTPError``), never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Deadline:
    """One try's deadline: the connections its opener makes are shut when it passes (a
    blocked read then fails at once), and ``passed`` says it did."""

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._connections: list[Any] = []
        track = self._track

        class Plain(urllib.request.HTTPHandler):
            def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
                return super().do_open(track(http_class), req, **kw)

        class Secure(urllib.request.HTTPSHandler):
            def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
                return super().do_open(track(http_class), req, **kw)

        self.opener = urllib.request.build_opener(Plain, Secure, _NoRedirect)
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def _track(self, http_class: Any) -> Callable[..., Any]:
        def connect(*args: Any, **kwargs: Any) -> Any:
            connection = http_class(*args, **kwargs)
            self._connections.append(connection)
            return connection

        return connect

    def _expire(self) -> None:
        self.passed = True
        for connection in self._connections:
            sock = getattr(connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def backoff_delay(tries: int, base: float, cap: float, jitter: Callable[[], float]) -> float:
    """The wait after ``tries`` failed tries: ``base``·2^(tries−1), at most ``cap``, times a
    random factor in [0.5, 1) (``jitter()`` in [0, 1)) so that notifiers that failed together
    do not retry together.

    >>> [backoff_delay(n, 0.5, 4.0, lambda: 0.0) for n in (1, 2, 3, 4, 5)]
    [0.25, 0.5, 1.0, 2.0, 2.0]
    """
    return min(cap, base * 2 ** max(tries - 1, 0)) * (0.5 + jitter() / 2)
