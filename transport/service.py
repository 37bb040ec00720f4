"""The command side of a consumer service (``foreshock detect``, ``notify``, ``sink``): its
config from the flags, then build it, stop it on SIGTERM/SIGINT, say where its metrics are
served, run it, say what it did.

The services themselves share :mod:`foreshock.transport.checkpoint` (replay and commit); this
is the rest of their skeleton, so the three commands differ only in what they build and print.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["as_config", "config_from_args", "serve", "stop_on_signals"]

Config = TypeVar("Config")
FLAGS = {"group_id": "group", "refresh": "am_refresh"}  # config field -> its flag's dest


def config_from_args(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """The config dataclass ``cls`` from ``given`` values and the flags named like its fields
    (:data:`FLAGS` where the flag's name differs); a field without either keeps its default.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Config:
    ...     root: str
    ...     group_id: str = "g"
    ...     batch: int = 50
    >>> config_from_args(Config, argparse.Namespace(group="mine", json=True), root="/s")
    Config(root='/s', group_id='mine', batch=50)
    """
    values = dict(given)
    for field in fields(cls):
        flag = FLAGS.get(field.name, field.name)
        if field.name not in values and hasattr(args, flag):
            values[field.name] = getattr(args, flag)
    return cls(**values)


def as_config(cls: type[Config], config: Any, options: dict[str, Any]) -> Config:
    """``config`` if it is a ``cls`` already, else ``cls(config, **options)``: a service also
    takes its config's first field and the rest as keywords (the callers written before the
    config dataclasses).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Config:
    ...     root: str
    ...     batch: int = 50
    >>> as_config(Config, "/s", {"batch": 5}), as_config(Config, Config("/t"), {})
    (Config(root='/s', batch=5), Config(root='/t', batch=50))
    """
    if not isinstance(config, cls):
        return cls(config, **options)  # type: ignore[call-arg]  # a config class: its fields
    if options:
        raise TypeError(f"options beside a {cls.__name__}: {sorted(options)}")
    return config


class ServiceRefusedError(RuntimeError):
    """A service refuses to start, for a reason its text gives (``serve``: exit 2)."""


class ServiceUnavailableError(RuntimeError):
    """A service cannot start *yet* (its store is away): ``serve`` waits and tries again,
    as the service itself waits for the store mid-run, until it starts or is stopped."""


def serve(
    name: str,
    service: Callable[[Any, Any], Any],
    config: Any,
    args: argparse.Namespace,
    started: Callable[[Any], str],
    finished: Callable[[Any], str],
) -> int:
    """Run ``service(settings, config)`` (the settings from ``--config``) until a signal, or
    ``--idle-exit`` idle seconds; exit status 2 if its metrics port is taken. ``started`` and
    ``finished``: its first and last line."""
    from foreshock.telemetry import MetricsPortError

    from .settings import load_settings

    stop, delay = stop_on_signals(), 1.0
    while True:
        try:
            running = service(load_settings(args.config), config)
            break
        except (MetricsPortError, ServiceRefusedError) as exc:
            print(f"foreshock {name}: {exc}", file=sys.stderr)
            return 2
        except ServiceUnavailableError as exc:  # e.g. the store is away: wait, as mid-run
            print(f"foreshock {name}: {exc}; retrying in {delay:.0f} s", file=sys.stderr)
            if stop.wait(delay):
                print(f"foreshock {name}: stopped before it could start", flush=True)
                return 0
            delay = min(delay * 2, 30.0)
    print(f"foreshock {name}: {started(running)}", flush=True)
    telemetry = getattr(running, "telemetry", None)
    if telemetry is not None:
        print(f"foreshock {name}: metrics at {telemetry.url}", flush=True)
    running.run(stop, idle_exit=args.idle_exit)
    print(f"foreshock {name}: {finished(running)}", flush=True)
    return 0


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: a service loop's ``stop``, for a clean exit that
    commits its offsets and closes its files (instead of dying mid-batch)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop
