"""Logging for every ``foreshock`` command: one line format, one level, set in one place.

Without this, Python prints only WARNING and above, as the bare message: a service's retries
(logged at INFO) are invisible, and nothing says when a line was written or by which part. The
CLI calls :func:`configure` once per command, so every service — ``detect``, ``sink``,
``notify``, ``topics``, the broker — logs the same way::

    2026-03-01T12:00:00.123Z INFO foreshock.notify.delivery: foreshock notify: ...

Times are UTC (one clock across a fleet's machines and containers), with milliseconds. The
level comes from ``--log-level`` (anywhere on the command line), else ``FORESHOCK_LOG_LEVEL``,
else INFO. It is the root logger's level, so foreshock's loggers (librdkafka's lines included,
as ``foreshock.rdkafka``) and other libraries' follow it alike.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping

__all__ = ["DEFAULT_LEVEL", "ENV", "LEVELS", "configure", "parse_level"]

ENV = "FORESHOCK_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LEVEL = "INFO"
FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


def parse_level(value: str, source: str | None = ENV) -> str:
    """A level name (any case) as logging spells it; a bad one names ``source``, where it
    came from (None: the caller says where).

    >>> parse_level("debug")
    'DEBUG'
    >>> parse_level("loud")
    Traceback (most recent call last):
    ...
    ValueError: FORESHOCK_LOG_LEVEL='loud': not a log level (DEBUG, INFO, WARNING, ERROR, CRITICAL)
    """
    name = value.strip().upper()
    if name not in LEVELS:
        where = f"{source}={value!r}" if source else repr(value)
        raise ValueError(f"{where}: not a log level ({', '.join(LEVELS)})")
    return name


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (not at set-up), so a
    redirected or captured stderr — a test's, a notebook's — gets the lines."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure(level: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Send every log record at ``level`` or above to stderr as one timestamped line.

    ``level`` None: ``FORESHOCK_LOG_LEVEL`` from ``env`` (default ``os.environ``), else INFO.
    Calling it again replaces its own handler (never another's) and sets the level anew.
    Returns the level name; raises ValueError, naming the variable, for a bad one.
    """
    source = os.environ if env is None else env
    if level is None:
        raw = source.get(ENV)
        name = parse_level(raw) if raw else DEFAULT_LEVEL
    else:
        name = parse_level(level, "--log-level")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(handler)
    handler = _Stderr()
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(name)
    return name
