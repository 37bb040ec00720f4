"""Where the history lives: a URI (a local folder, ``s3://``, ``gs://``, ``az://``) and the
storage options delta-rs needs to reach it.

Read, later sources winning, from: the ``[store]`` section of the settings file (``--config
PATH`` or ``$FORESHOCK_CONFIG``, the same file as ``[kafka]``); the environment; a command's
``--store`` argument::

    [store]
    uri = "s3://ml-fleet/foreshock"

    [store.options]                  # passed to delta-rs verbatim
    aws_endpoint_url = "http://minio:9000"
    aws_region = "us-east-1"
    aws_access_key_id = "foreshock"
    aws_secret_access_key = "…"       # better: the environment, below
    aws_allow_http = "true"

Environment: ``FORESHOCK_STORE`` (the URI) and ``FORESHOCK_STORE_OPTION_<KEY>`` for an option
(``FORESHOCK_STORE_OPTION_AWS_SECRET_ACCESS_KEY`` → ``aws_secret_access_key``); delta-rs also
reads the standard ``AWS_*``/``GOOGLE_*``/``AZURE_*`` variables by itself. ``repr`` shows
secret options as ``***`` (:func:`foreshock.transport.settings.is_secret`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foreshock.transport.settings import REDACTED, config_section, is_secret

__all__ = ["DEFAULT_STORE", "RETAIN_HOURS", "SETTINGS", "StoreLocation", "load_location"]

DEFAULT_STORE = "foreshock-history"
SETTINGS = ("uri", "options")  # the [store] section's keys (docs/storage.md lists them)
RETAIN_HOURS = 168.0  # vacuum keeps a week of versions readable (Delta's own default)
REMOTE_SCHEMES = (
    "s3://",
    "s3a://",
    "gs://",
    "gcs://",
    "az://",
    "abfs://",
    "abfss://",
    "azure://",
    "memory://",
)


@dataclass(frozen=True)
class StoreLocation:
    """A store's root URI and storage options; each table is the Delta table ``<uri>/<name>``.

    >>> StoreLocation("s3://b/h", {"aws_secret_access_key": "x"}).table_uri("steps")
    's3://b/h/steps'
    >>> StoreLocation("s3://b/h", {"aws_secret_access_key": "x"})
    StoreLocation(uri='s3://b/h', options={'aws_secret_access_key': '***'})
    """

    uri: str = DEFAULT_STORE
    options: dict[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return not self.uri.startswith(REMOTE_SCHEMES)

    def table_uri(self, table: str) -> str:
        if self.is_local:
            return str(Path(self.uri.removeprefix("file://")).absolute() / table)
        return f"{self.uri.rstrip('/')}/{table}"

    def __repr__(self) -> str:
        shown = {k: REDACTED if is_secret(k) else v for k, v in self.options.items()}
        return f"StoreLocation(uri={self.uri!r}, options={shown!r})"


def load_location(
    uri: str | Path | StoreLocation | None = None,
    config: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> StoreLocation:
    """The store to use: ``uri`` if given, else the settings file's, else the environment's,
    else ``foreshock-history`` in the working folder; options from the file and environment.

    >>> load_location(env={"FORESHOCK_STORE": "gs://b/h",
    ...                    "FORESHOCK_STORE_OPTION_GOOGLE_SERVICE_ACCOUNT": "/k.json"})
    StoreLocation(uri='gs://b/h', options={'google_service_account': '/k.json'})
    """
    if isinstance(uri, StoreLocation):
        return uri
    env = dict(os.environ) if env is None else env
    section: dict[str, Any] = {}
    path = config or env.get("FORESHOCK_CONFIG")
    if path:
        section = config_section(path, "store")
        unknown = set(section) - set(SETTINGS)
        if unknown:
            raise ValueError(f"unknown [store] settings in {path}: {sorted(unknown)}")
    options = {str(k): str(v) for k, v in section.get("options", {}).items()}
    for key, value in env.items():
        if key.startswith("FORESHOCK_STORE_OPTION_"):
            options[key.removeprefix("FORESHOCK_STORE_OPTION_").lower()] = value
    chosen = uri or env.get("FORESHOCK_STORE") or section.get("uri") or DEFAULT_STORE
    return StoreLocation(str(chosen), options)
