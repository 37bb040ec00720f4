"""The detector configs a store has run with: every one kept, one live, each change logged.

``foreshock tune`` publishes into the store folder it tuned on, so a config lives beside the
history it was chosen from::

    <store>/detector-configs/<version>.json       every config ever published (never removed)
    <store>/detector-configs/<version>.tune.json  the tune report that chose it
    <store>/detector-configs/live.json            {"version": ...}: what detectors load
    <store>/detector-configs/history.jsonl        append-only: time, version, action, note
    <store>/detector-configs/profiles/            named profiles (``foreshock calibrate --name``):
                                                  detectors started with ``--store`` judge a
                                                  run by one when its signature fits

``live.json`` is replaced atomically (temporary file, fsync, ``os.replace``), so a detector
starting during a publish reads the old version or the new one, never half a file. A warning
carries its config's version, and the version names a file here: any warning can be traced
to its thresholds, and any change undone.

Rolling back without a version undoes the last change that made a config live, like a stack:
after tunes A, B, C, two rollbacks give B then A, and a third fails (nothing before A). An
explicit ``rollback(root, version)`` makes that version live and pushes it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import DetectorConfig

__all__ = [
    "PROFILES",
    "REGISTRY",
    "RegistryError",
    "history",
    "live_config",
    "live_version",
    "publish",
    "rollback",
]

REGISTRY = "detector-configs"
PROFILES = "profiles"  # the named profiles' folder in the registry (``profiles.load_profiles``)
_LIVE, _HISTORY, _LOCK = "live.json", "history.jsonl", ".lock"


class RegistryError(RuntimeError):
    """The registry cannot do what was asked (nothing to roll back to, unknown version...)."""


def publish(
    root: str | Path,
    config: DetectorConfig,
    tune_report: dict[str, Any] | None = None,
    note: str = "",
) -> str:
    """Save ``config`` (and the report that chose it), make it live; returns its version."""
    folder = _folder(root, create=True)
    version = config.version
    with _locked(folder):
        _write_atomic(folder / f"{version}.json", {**config.to_dict(), "version": version})
        if tune_report is not None:
            _write_atomic(folder / f"{version}.tune.json", tune_report)
        _make_live(folder, version, "tune", note, undo=False)
    return version


def live_version(root: str | Path) -> str | None:
    """The version detectors load from this store, or None when none was published."""
    path = _folder(root) / _LIVE
    return json.loads(path.read_text())["version"] if path.exists() else None


def live_config(root: str | Path) -> DetectorConfig | None:
    """The live config, or None. RegistryError when its file is missing or was altered (its
    content no longer hashes to its version)."""
    version = live_version(root)
    return None if version is None else _load(_folder(root), version)


def rollback(root: str | Path, version: str | None = None, note: str = "") -> str:
    """Make the config live before the current one (or ``version``); returns the version."""
    folder = _folder(root)
    with _locked(folder):
        current = live_version(root)
        if version is None:
            stack = _stack(history(root), current)
            if len(stack) < 2:
                raise RegistryError(
                    f"nothing to roll back to in {folder}: "
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
        _load(folder, target)  # refuse a version that is not here, or was altered
        _make_live(folder, target, "rollback", note or f"from {current}", undo=undo)
    return target


def history(root: str | Path) -> list[dict[str, Any]]:
    """Every change of the live config, oldest first."""
    path = _folder(root) / _HISTORY
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def _make_live(folder: Path, version: str, action: str, note: str, undo: bool) -> None:
    _write_atomic(folder / _LIVE, {"version": version})
    entry = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "version": version,
        "action": action,
        "note": note,
        "undo": undo,
    }
    with (folder / _HISTORY).open("a") as file:
        file.write(json.dumps(entry) + "\n")


def _load(folder: Path, version: str) -> DetectorConfig:
    path = folder / f"{version}.json"
    if not path.exists():
        known = sorted(
            p.stem
            for p in folder.glob("*.json")
            if p.name != _LIVE and not p.name.endswith(".tune.json")
        )
        raise RegistryError(f"no config {version} in {folder} (known: {', '.join(known) or '-'})")
    config = DetectorConfig.load(path)
    if config.version != version:
        raise RegistryError(f"{path} hashes to {config.version}, not {version}: it was altered")
    return config


def _folder(root: str | Path, create: bool = False) -> Path:
    folder = Path(root) / REGISTRY
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One publish or rollback at a time (a read-modify-write of live.json and the history)."""
    if not folder.exists():
        raise RegistryError(f"no detector configs in {folder.parent}: run `foreshock tune` first")
    with (folder / _LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as file:
        json.dump(data, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
