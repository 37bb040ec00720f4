"""A damaged commit named, and the log rewritten to the last good version.

A Delta table is its log: ``<table>/_delta_log/<version>.json``, one JSON action per line. A
commit file torn by a writer that died mid-write on a filesystem without atomic renames (or
cut by a copy, a sync, a full disk) makes the table unreadable: delta-rs fails with "Truncated
record whilst reading string" and no file name, every reader of the store fails with it, and
the sink can write no table at all. Deleting the file by hand leaves a gap in the versions,
which delta-rs refuses too.

:func:`damaged_commits` reads each table's log after its last checkpoint and names every
commit that does not parse (and any gap in the versions). :func:`repair` rewrites the log to
the last good version: the damaged commit and every later one are moved out of the log into
``<store>/_repair/<table>/`` (kept, never deleted), with the checkpoint pointer if it pointed
past them. What those commits added is then not in the table. Their records were not
acknowledged to the broker — the sink commits its offsets only after every table of a batch is
written, and a commit the writer died in was not — so the next sink reads them again and
stores them once. Local stores only: on object storage, copy the log down, repair, copy back.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .location import StoreLocation, load_location
from .schema import TABLES

__all__ = ["Damage", "damaged_commits", "repair"]

COMMIT = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class Damage:
    table: str
    version: int
    path: Path
    reason: str

    def sentence(self) -> str:
        return f"{self.table}: commit {self.version} ({self.path}) is damaged: {self.reason}"


def damaged_commits(location: StoreLocation | str | None) -> list[Damage]:
    """Every table's first damaged commit (or version gap) after its last checkpoint."""
    root = _local_root(load_location(location))
    found = []
    for table in TABLES:
        log = root / table / "_delta_log"
        if log.is_dir():
            damage = _first_damage(table, log)
            if damage is not None:
                found.append(damage)
    return found


def repair(location: StoreLocation | str | None) -> list[str]:
    """Rewrite each damaged table's log to its last good version (see the module docstring);
    returns what was done, a sentence each."""
    root = _local_root(load_location(location))
    done = []
    for damage in damaged_commits(location):
        log = damage.path.parent
        kept = root / "_repair" / damage.table / time.strftime("%Y%m%dT%H%M%S")
        kept.mkdir(parents=True, exist_ok=True)
        moved = [p for p in sorted(log.iterdir()) if _version(p) >= damage.version]
        for path in moved:
            shutil.move(str(path), kept / path.name)
        pointer = log / "_last_checkpoint"
        if pointer.exists() and _checkpoint_version(pointer) >= damage.version:
            shutil.move(str(pointer), kept / pointer.name)
        done.append(
            f"{damage.sentence()}; moved it and {len(moved) - 1} later file(s) to {kept}: "
            f"{damage.table} is at version {damage.version - 1}"
        )
    return done


def _first_damage(table: str, log: Path) -> Damage | None:
    pointer = log / "_last_checkpoint"
    start = _checkpoint_version(pointer) + 1 if pointer.exists() else 0
    commits = sorted(
        (int(m[1]), p) for p in log.iterdir() if (m := COMMIT.match(p.name)) and int(m[1]) >= start
    )
    expected = start if start else (commits[0][0] if commits else 0)
    for version, path in commits:
        if version != expected:
            return Damage(table, expected, log / f"{expected:020d}.json", "missing (a gap)")
        reason = _unreadable(path)
        if reason is not None:
            return Damage(table, version, path, reason)
        expected += 1
    return None


def _unreadable(path: Path) -> str | None:
    """Why a commit file does not parse as JSON lines of actions (None: it does)."""
    text = path.read_bytes()
    if not text.strip():
        return "empty"
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            action = json.loads(line)
        except ValueError as exc:
            return f"line {number} is not JSON ({exc})"
        if not isinstance(action, dict):
            return f"line {number} is not an action"
    return None


def _version(path: Path) -> int:
    m = re.match(r"^(\d{20})\.", path.name)
    return int(m[1]) if m else -1


def _checkpoint_version(pointer: Path) -> int:
    try:
        return int(json.loads(pointer.read_text())["version"])
    except (ValueError, KeyError, TypeError, OSError):
        return -1


def _local_root(location: StoreLocation) -> Path:
    if not location.is_local:
        raise ValueError(
            f"repair reads the log on a local store; {location.uri} is not one (copy its "
            "tables' _delta_log folders down, repair, copy them back)"
        )
    return Path(location.table_uri("")).resolve()
