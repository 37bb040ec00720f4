"""Kafka settings: topics, partitions, retention, spool, and librdkafka pass-through.

Read, later sources winning, from: defaults; a TOML file (``--config PATH`` or
``$FORESHOCK_CONFIG``); environment variables. The file::

    [kafka]
    bootstrap_servers = "kafka-1:9092,kafka-2:9092"
    metrics_topic = "foreshock.metrics"
    control_topic = "foreshock.control"
    partitions = 12
    replication_factor = 3
    retention_ms = 604800000          # 7 days

    [kafka.client]                    # any librdkafka property, passed through verbatim
    "security.protocol" = "SASL_SSL"
    "sasl.mechanism" = "SCRAM-SHA-512"
    "sasl.username" = "foreshock"
    "ssl.ca.location" = "/etc/ssl/certs/ca.pem"

Environment: ``FORESHOCK_KAFKA_BOOTSTRAP_SERVERS``, ``FORESHOCK_KAFKA_METRICS_TOPIC``, … (each
field below, upper-cased), and ``FORESHOCK_RDKAFKA_<PROPERTY>`` for librdkafka properties with
dots written as underscores (``FORESHOCK_RDKAFKA_SASL_PASSWORD`` → ``sasl.password``).

Secrets stay out of logs: ``repr(settings)`` (and so any log line or traceback that prints
the settings) shows every client property :func:`is_secret` flags as ``***``; use
:func:`redact` on any librdkafka config dict before it is printed.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

__all__ = [
    "RDKAFKA_LOG",
    "KafkaSettings",
    "SettingsError",
    "config_section",
    "env_variable",
    "is_secret",
    "load_settings",
    "redact",
]

RDKAFKA_LOG = logging.getLogger("foreshock.rdkafka")  # librdkafka's own log lines, all clients

# sasl.password, ssl.key.password, ssl.keystore.password, sasl.oauthbearer.client.secret,
# sasl.oauthbearer.config (may hold a token), ssl.key.pem (a private key, inline), ssl_key, …
_SECRET = re.compile(
    r"password|secret|token|credential|oauthbearer\.config|(^|[._])key\.pem$"
    r"|(^|[._])ssl[._]key$|private",
    re.IGNORECASE,
)
REDACTED = "***"


def is_secret(key: str) -> bool:
    """True for a client property whose value must never be printed.

    >>> [k for k in ("sasl.username", "sasl.password", "ssl.key.pem", "ssl.key.location",
    ...              "sasl.oauthbearer.client.secret", "ssl.ca.location") if is_secret(k)]
    ['sasl.password', 'ssl.key.pem', 'sasl.oauthbearer.client.secret']
    """
    return bool(_SECRET.search(str(key)))


def redact(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a librdkafka config dict that is safe to log: secret values are ``***``.

    >>> redact({"bootstrap.servers": "k:9092", "sasl.password": "hunter2"})
    {'bootstrap.servers': 'k:9092', 'sasl.password': '***'}
    """
    return {k: REDACTED if is_secret(k) else v for k, v in config.items()}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names where it was set (the environment
    variable, or the key and file), so the fix is obvious from one line."""


def _default_spool_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "foreshock" / "spool")


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = "127.0.0.1:9092"
    metrics_topic: str = "foreshock.metrics"
    warnings_topic: str = "foreshock.warnings"
    deadletter_topic: str = "foreshock.deadletter"
    # a person's requests to a running trainer (``foreshock warnings act``), keyed by run id
    control_topic: str = "foreshock.control"
    # the trainer's allowlist of approvers' public keys (a JSON file: transport.approvals);
    # empty: the trainer follows no remote request (its automatic policy still acts)
    approvers: str = ""
    partitions: int = 6
    replication_factor: int = 1
    retention_ms: int = 7 * 24 * 3600 * 1000
    spool_dir: str = field(default_factory=_default_spool_dir)
    client: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.replication_factor < 1:
            raise ValueError("partitions and replication_factor must be >= 1")
        if not self.bootstrap_servers:
            raise ValueError("bootstrap_servers is empty")

    def __repr__(self) -> str:
        """Like the dataclass's, with secret client properties as ``***``.

        >>> KafkaSettings(spool_dir="s", client={"sasl.password": "hunter2"})
        KafkaSettings(bootstrap_servers='127.0.0.1:9092', ..., client={'sasl.password': '***'})
        """
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "client"]
        parts.append(f"client={redact(self.client)!r}")
        return f"KafkaSettings({', '.join(parts)})"

    def librdkafka(
        self, defaults: dict[str, Any] | None = None, **overrides: Any
    ) -> dict[str, Any]:
        """Client config: ``defaults`` < bootstrap servers and pass-through < ``overrides``."""
        return {
            **(defaults or {}),
            "bootstrap.servers": self.bootstrap_servers,
            **self.client,
            **overrides,
        }

    def with_bootstrap(self, bootstrap_servers: str) -> KafkaSettings:
        return replace(self, bootstrap_servers=bootstrap_servers)


def config_section(path: str | Path, name: str) -> dict[str, Any]:
    """The ``[name]`` table of the settings file at ``path`` ({} if it has none)."""
    with Path(path).open("rb") as file:
        return tomllib.load(file).get(name, {})


def load_settings(
    path: str | Path | None = None, env: dict[str, str] | None = None
) -> KafkaSettings:
    """Defaults, then the TOML file, then the environment.

    >>> load_settings(env={"FORESHOCK_KAFKA_PARTITIONS": "3",
    ...                    "FORESHOCK_RDKAFKA_SASL_MECHANISM": "PLAIN"}).partitions
    3
    >>> load_settings(env={"FORESHOCK_RDKAFKA_SASL_MECHANISM": "PLAIN"}).client
    {'sasl.mechanism': 'PLAIN'}
    """
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    where: dict[str, str] = {}  # setting -> where its value came from, for error messages
    path = path or env.get("FORESHOCK_CONFIG")
    if path:
        section = config_section(path, "kafka")
        values.update({k: v for k, v in section.items() if k != "client"})
        where.update({k: f"{k} in [kafka] of {path}" for k in values})
        values["client"] = {str(k): str(v) for k, v in section.get("client", {}).items()}
    known = {f.name: f.type for f in fields(KafkaSettings) if f.name != "client"}
    unknown = set(values) - set(known) - {"client"}
    if unknown:
        raise SettingsError(f"unknown [kafka] settings in {path}: {sorted(unknown)}")
    for name in known:
        variable = env_variable(name)
        raw = env.get(variable)
        if raw is not None:
            values[name], where[name] = raw, variable
    for name in ("partitions", "replication_factor", "retention_ms"):
        if name in values:
            values[name] = _whole(values[name], where[name], least=name != "retention_ms")
    if "bootstrap_servers" in values and not str(values["bootstrap_servers"]).strip():
        raise SettingsError(f"{where['bootstrap_servers']} is empty: give host:port[,...]")
    client = dict(values.get("client", {}))
    for key, value in env.items():
        if key.startswith("FORESHOCK_RDKAFKA_"):
            client[key.removeprefix("FORESHOCK_RDKAFKA_").lower().replace("_", ".")] = value
    values["client"] = client
    return KafkaSettings(**values)


def env_variable(setting: str) -> str:
    """The environment variable of a ``[kafka]`` setting (it wins over the file).

    >>> env_variable("bootstrap_servers")
    'FORESHOCK_KAFKA_BOOTSTRAP_SERVERS'
    """
    return f"FORESHOCK_KAFKA_{setting.upper()}"


def _whole(value: Any, where: str, least: bool) -> int:
    """``value`` as an int (``least``: at least 1), else a SettingsError naming ``where``.

    >>> _whole("abc", "FORESHOCK_KAFKA_PARTITIONS", least=True)
    Traceback (most recent call last):
    ...
    foreshock.transport.settings.SettingsError: FORESHOCK_KAFKA_PARTITIONS='abc': not a whole number
    """
    try:
        number = int(value) if not isinstance(value, bool | float) else None
    except ValueError:
        number = None
    if number is None:
        raise SettingsError(f"{where}={value!r}: not a whole number")
    if least and number < 1:
        raise SettingsError(f"{where}={value!r}: must be at least 1")
    return number
