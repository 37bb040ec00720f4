"""The detector configs a store has run with: every one kept, one live, each change logged.

``foreshock tune`` publishes into the store it tuned on — a local folder or object storage
(:mod:`foreshock.storage.store_files`) — so a config lives beside the history it was chosen
from::

    <store>/detector-configs/<version>.json       every config ever published (never removed)
    <store>/detector-configs/<version>.tune.json  the tune report that chose it
    <store>/detector-configs/live.json            {"version": ...}: what detectors load
    <store>/detector-configs/history.jsonl        append-only: time, version, action, note
    <store>/detector-configs/profiles/            named profiles (``foreshock calibrate --name``):
                                                  detectors started with ``--store`` judge a
                                                  run by one when its signature fits

``live.json`` is replaced atomically (locally: temporary file, fsync, ``os.replace``; on
object storage: one PUT), so a detector starting during a publish reads the old version or
the new one, never half a file. A warning
carries its config's version, and the version names a file here: any warning can be traced
to its thresholds, and any change undone.

Rolling back without a version undoes the last change that made a config live, like a stack:
after tunes A, B, C, two rollbacks give B then A, and a third fails (nothing before A). An
explicit ``rollback(root, version)`` makes that version live and pushes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from foreshock.storage.location import StoreLocation
from foreshock.storage.store_files import StoreFiles

from .config import DetectorConfig

__all__ = [
    "PROFILES",
    "REGISTRY",
    "RegistryError",
    "history",
    "live_config",
    "live_version",
    "profiles_folder",
    "publish",
    "rollback",
]

REGISTRY = "detector-configs"
PROFILES = "profiles"  # the named profiles' folder in the registry (``profiles.load_profiles``)
_LIVE, _HISTORY = "live.json", "history.jsonl"

Store = str | Path | StoreLocation


class RegistryError(RuntimeError):
    """The registry cannot do what was asked (nothing to roll back to, unknown version...)."""


def publish(
    root: Store,
    config: DetectorConfig,
    tune_report: dict[str, Any] | None = None,
    note: str = "",
) -> str:
    """Save ``config`` (and the report that chose it), make it live; returns its version."""
    files = _folder(root)
    version = config.version
    with files.lock():
        _write_json(files, f"{version}.json", {**config.to_dict(), "version": version})
        if tune_report is not None:
            _write_json(files, f"{version}.tune.json", tune_report)
        _make_live(files, version, "tune", note, undo=False)
    return version


def live_version(root: Store) -> str | None:
    """The version detectors load from this store, or None when none was published."""
    text = _folder(root).read_text(_LIVE)
    return json.loads(text)["version"] if text is not None else None


def live_config(root: Store) -> DetectorConfig | None:
    """The live config, or None. RegistryError when its file is missing or was altered (its
    content no longer hashes to its version)."""
    version = live_version(root)
    return None if version is None else _load(_folder(root), version)


def profiles_folder(root: Store) -> StoreFiles:
    """Where the store's named profiles are (``foreshock calibrate --name … --store``)."""
    return _folder(root).child(PROFILES)


def rollback(root: Store, version: str | None = None, note: str = "") -> str:
    """Make the config live before the current one (or ``version``); returns the version."""
    files = _folder(root)
    with _locked(files):
        current = live_version(root)
        if version is None:
            stack = _stack(history(root), current)
            if len(stack) < 2:
                raise RegistryError(
                    f"nothing to roll back to in {files}: "
                    + (
                        "no config was ever published"
                        if not stack
                        else f"{current} is the first live config"
                    )
                )
            target, undo = stack[-2], True
        else:
            target, undo = version, False
            if target == current:
                raise RegistryError(f"{target} is already live")
        _load(files, target)  # refuse a version that is not here, or was altered
        _make_live(files, target, "rollback", note or f"from {current}", undo=undo)
    return target


def history(root: Store) -> list[dict[str, Any]]:
    """Every change of the live config, oldest first."""
    text = _folder(root).read_text(_HISTORY) or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _stack(entries: list[dict[str, Any]], current: str | None) -> list[str]:
    """The versions made live, as a stack: a tune or an explicit rollback pushes, an undo pops.

    >>> _stack([{"version": "a", "action": "tune"}, {"version": "b", "action": "tune"},
    ...         {"version": "a", "action": "rollback", "undo": True}], "a")
    ['a']
    """
    stack: list[str] = []
    for entry in entries:
        if entry.get("undo") and stack:
            stack.pop()
        if not stack or stack[-1] != entry["version"]:
            stack.append(entry["version"])
    if current is not None and (not stack or stack[-1] != current):
        stack.append(current)  # live.json changed by hand: it is still what is live
    return stack


def _make_live(files: StoreFiles, version: str, action: str, note: str, undo: bool) -> None:
    _write_json(files, _LIVE, {"version": version})
    entry = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "version": version,
        "action": action,
        "note": note,
        "undo": undo,
    }
    files.append_line(_HISTORY, json.dumps(entry))


def _load(files: StoreFiles, version: str) -> DetectorConfig:
    text = files.read_text(f"{version}.json")
    if text is None:
        known = sorted(
            n.removesuffix(".json")
            for n in files.names()
            if n.endswith(".json") and n != _LIVE and not n.endswith(".tune.json")
        )
        raise RegistryError(f"no config {version} in {files} (known: {', '.join(known) or '-'})")
    data = json.loads(text)
    data.pop("version", None)
    config = DetectorConfig.from_dict(data)
    if config.version != version:
        raise RegistryError(
            f"{files}/{version}.json hashes to {config.version}, not {version}: it was altered"
        )
    return config


def _folder(root: Store) -> StoreFiles:
    return StoreFiles(root, REGISTRY)


@contextmanager
def _locked(files: StoreFiles) -> Iterator[None]:
    """One publish or rollback at a time (a read-modify-write of live.json and the history)."""
    if not files.exists():
        raise RegistryError(f"no detector configs in {files}: run `foreshock tune` first")
    with files.lock():
        yield


def _write_json(files: StoreFiles, name: str, data: dict[str, Any]) -> None:
    files.write_text(name, json.dumps(data, indent=1))
