"""Webhook signatures (the Standard Webhooks scheme): proof that a POST came from this notifier,
unaltered, and recently.

A receiver that acts on a warning (pages someone, pauses a job) must not act on one anybody
could POST. Each request to a target with a secret carries three headers:

* ``webhook-id`` — the message's id: the same on every retry of the same body, so a receiver
  can drop a repeat (``msg_`` + the body's SHA-256, truncated);
* ``webhook-timestamp`` — Unix seconds when this try was sent (a replay of an old request is
  refused by its age);
* ``webhook-signature`` — ``v1,`` + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")).

The key is the secret's UTF-8 bytes, or — for a secret in the scheme's own format,
``whsec_<base64>`` — the decoded bytes after the prefix, so the ``standardwebhooks`` libraries
verify our requests as they are. :func:`verify` is the receiver's side (standard library only:
copy it, or see the README's snippet).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = ["TOLERANCE", "key_bytes", "message_id", "sign", "signature_headers", "verify"]

TOLERANCE = 300  # seconds a receiver accepts between the timestamp and its clock


def key_bytes(secret: str) -> bytes:
    """The HMAC key of ``secret``.

    >>> key_bytes("hunter2"), key_bytes("whsec_aHVudGVyMg==")
    (b'hunter2', b'hunter2')
    """
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            pass  # not base64 after all: the text is the key
    return secret.encode()


def message_id(body: bytes) -> str:
    """The same body always has the same id (a retry is the same message)."""
    return "msg_" + hashlib.sha256(body).hexdigest()[:32]


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value.

    >>> sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
    ...      b'{"test": 2432232314}')
    'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE='
    """
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The three headers of one try of ``body``."""
    msg_id, timestamp = message_id(body), int(time.time() if now is None else now)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    tolerance: float = TOLERANCE,
    now: float | None = None,
) -> bool:
    """True if ``body`` with these request headers was signed with ``secret`` within
    ``tolerance`` seconds of ``now``. Header names are matched case-insensitively.

    >>> body = b'{"event": "cleared"}'
    >>> h = signature_headers("s3cret", body, now=1000)
    >>> verify("s3cret", h, body, now=1010), verify("s3cret", h, body + b" ", now=1010)
    (True, False)
    >>> verify("s3cret", h, body, now=2000), verify("other", h, body, now=1010)
    (False, False)
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp = lower.get("webhook-id"), lower.get("webhook-timestamp")
    if not msg_id or not stamp:
        return False
    try:
        timestamp = int(stamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = sign(secret, msg_id, timestamp, body).encode()
    return any(
        hmac.compare_digest(expected, given.encode())
        for given in lower.get("webhook-signature", "").split()
    )
