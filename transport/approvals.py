"""Signed approvals: only a listed approver's request steers a run.

A trainer acts on a person's remedy request (:mod:`foreshock.transport.control`): stop, hold
the learning rate, roll back. Anyone who can write to the broker could send one, so a request
carries its approver's **Ed25519 signature** over its canonical JSON (every field but
``signature``, keys sorted, no spaces), the ``key_id`` of the key that signed it, its issue
``time`` and its ``expires`` (Unix seconds). A trainer holds an **allowlist** of approvers'
public keys (a JSON file, ``FORESHOCK_KAFKA_APPROVERS``); it follows a request only if:

* an allowlist is configured (with none, no remote request is followed: the automatic policy
  still acts);
* the request is signed by a listed key, and the signature verifies;
* it is not future-dated (``time`` at most ``MAX_SKEW`` s ahead of the trainer's clock), not
  expired (``expires`` > now) and valid for at most ``MAX_LIFETIME`` s.

What it refuses it records (an ``action`` record with ``detail.refused``), and the approver's
name is the allowlist's, never the sender's ``by``. Keys: ``foreshock approvers keygen NAME``
writes the private key (a JSON file, mode 0600) and prints the public entry for the allowlist;
``foreshock approvers allow ENTRY... --allowlist FILE`` adds entries.

>>> key, entry = generate_key("ana")
>>> request = {"request_id": "r1", "run_id": "run", "time": 100.0, "expires": 400.0}
>>> signed = sign(request, key)
>>> approvers = Allowlist([entry])
>>> approvers.verify(signed, now=200.0) == (entry["name"], None)
True
>>> approvers.verify({**signed, "run_id": "other"}, now=200.0)[1]
'bad signature'
>>> approvers.verify(signed, now=500.0)[1]
'expired'
>>> Allowlist([]).verify(signed, now=200.0)[1]
'no approvers configured on this trainer'
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_LIFETIME",
    "MAX_SKEW",
    "Allowlist",
    "ApprovalError",
    "canonical",
    "generate_key",
    "load_key",
    "sign",
]

MAX_SKEW = 60.0  # s: how far ahead of the trainer's clock a request's time may be
MAX_LIFETIME = 86_400.0  # s: the longest a signed request stays valid
DEFAULT_LIFETIME = 3_600.0  # s: what ``warnings act`` signs for unless told


class ApprovalError(ValueError):
    """A key or allowlist that cannot be read; the text says which and why."""


def canonical(request: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: every field but ``signature``, keys sorted, compact."""
    body = {k: v for k, v in request.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def generate_key(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """A new approver key: (the private key file's content, the allowlist entry)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not name or not name.isprintable() or len(name) > 100:
        raise ApprovalError(f"an approver's name is 1-100 printable characters, got {name!r:.80}")
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    entry = {"key_id": _key_id(raw), "name": name, "public_key": base64.b64encode(raw).decode()}
    return {"name": name, "key_id": entry["key_id"], "private_key": pem}, entry


def load_key(path: str | Path) -> dict[str, str]:
    """An approver's private key file (``generate_key``'s first part, as JSON)."""
    try:
        data = json.loads(Path(path).read_text())
        if not all(isinstance(data.get(k), str) for k in ("name", "key_id", "private_key")):
            raise ValueError("needs name, key_id and private_key")
    except (OSError, ValueError) as exc:
        raise ApprovalError(f"{path}: not an approver key file: {exc}") from None
    return data


def sign(request: Mapping[str, Any], key: Mapping[str, str]) -> dict[str, Any]:
    """``request`` signed by ``key`` (a key file's content): ``key_id`` and ``by`` set from
    the key, ``signature`` over the canonical bytes."""
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key["private_key"].encode(), password=None)
    body = {**request, "key_id": key["key_id"], "by": key["name"]}
    body.pop("signature", None)
    signature = private.sign(canonical(body))  # type: ignore[call-arg, union-attr]
    return {**body, "signature": base64.b64encode(signature).decode()}


class Allowlist:
    """The approvers a trainer follows: ``verify(request, now)`` → (approver name, None) or
    (None, why it is refused)."""

    def __init__(self, entries: Iterable[Mapping[str, Any]]) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        self._keys: dict[str, tuple[str, Any]] = {}
        for entry in entries:
            try:
                raw = base64.b64decode(str(entry["public_key"]), validate=True)
                key = Ed25519PublicKey.from_public_bytes(raw)
                name = str(entry["name"])
            except Exception as exc:
                raise ApprovalError(f"not an approver entry: {exc!r:.200}") from None
            self._keys[_key_id(raw)] = (name, key)

    def __len__(self) -> int:
        return len(self._keys)

    def names(self) -> dict[str, str]:
        """key id → approver name."""
        return {key_id: name for key_id, (name, _) in self._keys.items()}

    @classmethod
    def load(cls, path: str | Path | None) -> Allowlist:
        """The allowlist file at ``path`` (``{"approvers": [entry, ...]}`` or a list); none
        given (None or ""): an empty list, which follows no request."""
        if not path:
            return cls([])
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ApprovalError(f"approvers allowlist {path}: {exc}") from None
        entries = data.get("approvers") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise ApprovalError(f"approvers allowlist {path}: needs a list of approvers")
        return cls(entries)

    def verify(self, request: Mapping[str, Any], now: float) -> tuple[str | None, str | None]:
        if not self._keys:
            return None, "no approvers configured on this trainer"
        key_id, signature = request.get("key_id"), request.get("signature")
        if not isinstance(key_id, str) or not isinstance(signature, str):
            return None, "unsigned"
        if key_id not in self._keys:
            return None, "unknown key"
        name, key = self._keys[key_id]
        try:
            key.verify(base64.b64decode(signature, validate=True), canonical(request))
        except Exception:
            return None, "bad signature"
        return (name, None) if (why := _timing(request, now)) is None else (None, why)


def _timing(request: Mapping[str, Any], now: float) -> str | None:
    """Why a verified request is not valid now (future-dated, expired, too long), or None."""
    issued, expires = request.get("time"), request.get("expires")
    if not isinstance(issued, int | float) or not isinstance(expires, int | float):
        return "no issue time or expiry"
    if issued > now + MAX_SKEW:
        return "future-dated"
    if expires <= now:
        return "expired"
    if expires - issued > MAX_LIFETIME:
        return f"valid for more than {MAX_LIFETIME:.0f} s"
    return None
