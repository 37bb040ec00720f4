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
stores them once. The same on object storage (through :mod:`.store_files`: a move is a copy,
then a delete): there a PUT is atomic, so a dying writer tears nothing, but a copy or a sync
tool can.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from .location import StoreLocation, load_location
from .schema import TABLES
from .store_files import StoreFiles

__all__ = ["Damage", "damaged_commits", "first_damage", "repair"]

COMMIT = re.compile(r"^(\d{20})\.json$")
_POINTER = "_last_checkpoint"


@dataclass(frozen=True)
class Damage:
    table: str
    version: int
    path: str  # the commit file's path or URI
    reason: str

    def sentence(self) -> str:
        return f"{self.table}: commit {self.version} ({self.path}) is damaged: {self.reason}"


def damaged_commits(location: StoreLocation | str | None) -> list[Damage]:
    """Every table's first damaged commit (or version gap) after its last checkpoint."""
    location = load_location(location)
    found = []
    for table in TABLES:
        damage = _first_damage(table, _log(location, table))
        if damage is not None:
            found.append(damage)
    return found


def repair(location: StoreLocation | str | None) -> list[str]:
    """Rewrite each damaged table's log to its last good version (see the module docstring);
    returns what was done, a sentence each."""
    location = load_location(location)
    done = []
    for damage in damaged_commits(location):
        log = _log(location, damage.table)
        kept = StoreFiles(location, f"_repair/{damage.table}/{time.strftime('%Y%m%dT%H%M%S')}")
        moved = [name for name in log.names() if _version(name) >= damage.version]
        for name in moved:
            log.move(name, kept)
        pointer = log.read_text(_POINTER)
        if pointer is not None and _checkpoint_version(pointer) >= damage.version:
            log.move(_POINTER, kept)
        done.append(
            f"{damage.sentence()}; moved it and {len(moved) - 1} later file(s) to {kept}: "
            f"{damage.table} is at version {damage.version - 1}"
        )
    return done


def first_damage(location: StoreLocation, table: str) -> Damage | None:
    """``table``'s first damaged commit (or version gap) after its last checkpoint, if any."""
    return _first_damage(table, _log(location, table))


def _log(location: StoreLocation, table: str) -> StoreFiles:
    return StoreFiles(location, f"{table}/_delta_log")


def _first_damage(table: str, log: StoreFiles) -> Damage | None:
    names = log.names()
    pointer = log.read_text(_POINTER) if _POINTER in names else None
    start = _checkpoint_version(pointer) + 1 if pointer is not None else 0
    commits = sorted(
        (int(m[1]), name) for name in names if (m := COMMIT.match(name)) and int(m[1]) >= start
    )
    expected = start if start else (commits[0][0] if commits else 0)
    for version, name in commits:
        if version != expected:
            return Damage(table, expected, f"{log}/{expected:020d}.json", "missing (a gap)")
        reason = _unreadable(log.read_bytes(name) or b"")
        if reason is not None:
            return Damage(table, version, f"{log}/{name}", reason)
        expected += 1
    return None


def _unreadable(text: bytes) -> str | None:
    """Why a commit file does not parse as JSON lines of actions (None: it does)."""
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


def _version(name: str) -> int:
    m = re.match(r"^(\d{20})\.", name)
    return int(m[1]) if m else -1


def _checkpoint_version(pointer: str) -> int:
    try:
        return int(json.loads(pointer)["version"])
    except (ValueError, KeyError, TypeError):
        return -1
