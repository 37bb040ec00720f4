"""Where warnings go: a receiver's kind and URL, the headers it wants, the secret we sign with.

A receiver that is not public wants credentials (a bearer token in front of Alertmanager, basic
auth on a webhook relay), and one that acts on what it gets wants to know it came from us: so a
:class:`Target` carries ``headers`` (sent with every request) and a signing ``secret``
(:mod:`foreshock.notify.signing`). Neither is ever printed: ``repr`` and ``where`` (what the
logs say) show the kind, scheme and host, the header *names* and whether it signs. Basic auth
written into a URL (``https://user:secret@host/``) is taken out of it into an ``Authorization``
header, so it cannot reach a log line either.

Targets come from the command line (``foreshock notify --webhook URL``) and from the settings
file's ``[notify]`` section (``--config PATH`` or ``$FORESHOCK_CONFIG``, the same file as
``[kafka]``), which is where headers and secrets belong::

    [notify]
    secret = "env:FORESHOCK_WEBHOOK_SECRET"   # signs every webhook receiver without its own

    [[notify.receivers]]
    kind = "alertmanager"                     # webhook | slack | alertmanager
    url = "https://am.example.com"
    headers = { Authorization = "env:AM_TOKEN" }

    [[notify.receivers]]
    kind = "webhook"
    url = "https://hooks.example.com/foreshock"
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

A value ``"env:NAME"`` is read from the environment variable ``NAME``, so the file can be
shared without its secrets; ``$FORESHOCK_NOTIFY_SECRET`` overrides ``[notify] secret``. A
command-line target with the URL of a receiver in the file gets that receiver's headers and
secret.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from foreshock.transport.settings import SettingsError, config_section

__all__ = ["RECEIVER_SETTINGS", "SETTINGS", "Target", "kinds", "notify_targets"]
# the [notify] section's keys, and each [[notify.receivers]] entry's (docs/operating.md)
SETTINGS = ("secret", "receivers")
RECEIVER_SETTINGS = ("kind", "url", "headers", "secret")

_AM_PATH = "/api/v2/alerts"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)


def kinds() -> tuple[str, ...]:
    """The kinds of target: the receivers registered (:data:`~.receivers.RECEIVERS`)."""
    from .receivers import RECEIVERS  # the registry imports Target: read it when asked

    return tuple(RECEIVERS)


@dataclass(frozen=True)
class Target:
    """A receiver: ``kind`` (one of :func:`kinds`), its URL, ``headers`` and signing ``secret``.

    >>> Target("alertmanager", "http://am:9093/").endpoint
    'http://am:9093/api/v2/alerts'
    >>> Target("slack", "https://hooks.slack.com/services/T0/B0/secret").where
    'slack https://hooks.slack.com'
    >>> t = Target("webhook", "https://ops:hunter2@relay.example:8443/in", secret="s3")
    >>> t.url, t
    ('https://relay.example:8443/in', Target('webhook', 'https://relay.example:8443', headers=['Authorization'], signed=True))
    >>> dict(t.headers)["Authorization"]
    'Basic b3BzOmh1bnRlcjI='
    >>> Target("webhook", "file:///etc/passwd")
    Traceback (most recent call last):
    ...
    ValueError: webhook target must be an http(s) URL, got 'file:///etc/passwd'
    """  # noqa: E501

    kind: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in kinds():
            raise ValueError(f"unknown target kind {self.kind!r} (one of {', '.join(kinds())})")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{self.kind} target must be an http(s) URL, got {_safe(self.url)!r}")
        headers = dict(self.headers.items() if isinstance(self.headers, Mapping) else self.headers)
        if parts.username is not None or parts.password is not None:
            user = unquote(parts.username or "")
            password = unquote(parts.password or "")
            basic = base64.b64encode(f"{user}:{password}".encode()).decode()
            if not any(name.lower() == "authorization" for name in headers):
                headers["Authorization"] = f"Basic {basic}"
            object.__setattr__(self, "url", urlunsplit(parts._replace(netloc=_host(parts))))
        for name, value in headers.items():
            if not isinstance(name, str) or not _TOKEN.match(name):
                raise ValueError(f"{self.where}: {name!r} is not an HTTP header name")
            if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"{self.where}: header {name} must be one line of text")
        object.__setattr__(self, "headers", tuple(headers.items()))
        if self.secret is not None and (not isinstance(self.secret, str) or not self.secret):
            raise ValueError(f"{self.where}: the signing secret must be a non-empty string")

    @property
    def endpoint(self) -> str:
        """The URL POSTed to: Alertmanager's alerts API under its base URL."""
        if self.kind != "alertmanager" or self.url.rstrip("/").endswith(_AM_PATH):
            return self.url
        return self.url.rstrip("/") + _AM_PATH

    @property
    def api(self) -> str:
        """Alertmanager's v2 API root (``…/api/v2``): silences live next to the alerts.

        >>> Target("alertmanager", "http://am:9093/api/v2/alerts").api
        'http://am:9093/api/v2'
        """
        return self.endpoint.removesuffix("/alerts")

    @property
    def where(self) -> str:
        """For logs: kind, scheme and host — never the path (a webhook's secret) or a password."""
        parts = urlsplit(self.url)
        return f"{self.kind} {parts.scheme}://{_host(parts)}"

    def __repr__(self) -> str:
        names = [name for name, _ in self.headers]
        return (
            f"Target({self.kind!r}, {self.where.split(' ', 1)[1]!r}, headers={names!r}, "
            f"signed={self.secret is not None})"
        )

    def with_auth(self, headers: Mapping[str, str], secret: str | None) -> Target:
        """This target with ``headers`` added (its own win) and ``secret`` if it has none."""
        return Target(
            self.kind,
            self.url,
            tuple({**headers, **dict(self.headers)}.items()),
            self.secret if self.secret is not None else secret,
        )


def _host(parts: Any) -> str:
    """``host[:port]`` of a split URL, without any user info (IPv6 in brackets)."""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return host if parts.port is None else f"{host}:{parts.port}"


def _safe(url: str) -> str:
    """A URL for an error message: user info dropped (it may hold a password)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=_host(parts))) if parts.hostname else url[:40]


def _value(raw: Any, env: Mapping[str, str], where: str) -> str:
    """A setting's text; ``env:NAME`` is the environment variable ``NAME``."""
    text = str(raw)
    if not text.startswith("env:"):
        return text
    name = text.removeprefix("env:")
    if name not in env:
        raise SettingsError(f"{where}: environment variable {name} is not set")
    return env[name]


def _receivers(section: dict[str, Any], env: Mapping[str, str], path: Any) -> list[Target]:
    out = []
    for i, entry in enumerate(section.get("receivers", [])):
        where = f"[[notify.receivers]] #{i + 1} of {path}"
        if not isinstance(entry, dict):
            raise SettingsError(f"{where} is not a table")
        unknown = set(entry) - set(RECEIVER_SETTINGS)
        if unknown:
            raise SettingsError(f"{where}: unknown keys {sorted(unknown)}")
        if "kind" not in entry or "url" not in entry:
            raise SettingsError(f"{where} needs a kind and a url")
        headers = entry.get("headers") or {}
        if not isinstance(headers, dict):
            raise SettingsError(f"{where}: headers must be a table")
        headers = {str(k): _value(v, env, f"header {k} in {where}") for k, v in headers.items()}
        secret = entry.get("secret")
        try:
            out.append(
                Target(
                    str(entry["kind"]),
                    _value(entry["url"], env, f"url in {where}"),
                    tuple(headers.items()),
                    None if secret is None else _value(secret, env, f"secret in {where}"),
                )
            )
        except SettingsError:
            raise
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from None
    return out


def notify_targets(
    targets: Iterable[Target] = (),
    config: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Target]:
    """The command line's ``targets`` and the settings file's receivers, with their auth.

    A command-line target with the kind and URL of a receiver in the file is that receiver
    (one target, the file's headers and secret); a webhook without a secret gets the default
    one (``[notify] secret`` or ``$FORESHOCK_NOTIFY_SECRET``). A setting that cannot be used
    is a :class:`~foreshock.transport.settings.SettingsError` naming it.

    >>> notify_targets([Target("webhook", "http://h/in")], env={"FORESHOCK_NOTIFY_SECRET": "s"})
    [Target('webhook', 'http://h', headers=[], signed=True)]
    """
    env = dict(os.environ) if env is None else env
    path = config or env.get("FORESHOCK_CONFIG")
    section: dict[str, Any] = {}
    if path:
        section = config_section(path, "notify")
        unknown = set(section) - set(SETTINGS)
        if unknown:
            raise SettingsError(f"unknown [notify] settings in {path}: {sorted(unknown)}")
    default = env.get("FORESHOCK_NOTIFY_SECRET") or None
    if default is None and section.get("secret") is not None:
        default = _value(section["secret"], env, f"secret in [notify] of {path}") or None
    chosen: dict[tuple[str, str], Target] = {}
    for target in _receivers(section, env, path):
        chosen[(target.kind, target.url)] = target
    for target in targets:
        known = chosen.get((target.kind, target.url))
        chosen[(target.kind, target.url)] = (
            target if known is None else target.with_auth(dict(known.headers), known.secret)
        )
    return [t.with_auth({}, default) if t.kind == "webhook" else t for t in chosen.values()]
