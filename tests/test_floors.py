"""Which room of the house may import which: a ratchet on the arrows between folders.

Rooms are the product folders, read by folder: ``foreshock/`` is the ground floor (the
catalogue, tables, logs, memory, telemetry: imported by everyone, importing no room) and
``app/`` the roof (the CLI, the demo, the replay harness, the services list: importing every
room, imported by none). Every ``import`` of another room counts,
lazy ones inside functions too.

``ARROWS`` is the floor plan: a room imports only rooms below it, so there is no cycle. The
test fails when an import adds an arrow the plan does not have, and when an arrow of the plan
is no longer used (the plan is then tightened: it always says what is true). Moving a module
to the room its imports allow is the way to satisfy it; ``app/cli.py`` (the roof) wires
what crosses rooms, such as ``store import`` (storage's command, the detectors' replay).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (
    "app",
    "delivery",
    "producers",
    "remediation",
    "integrations",
    "transport",
    "detectors",
    "operate",
    "notify",
    "storage",
    "dashboard",
    "lab",
)

ARROWS = {  # the floor plan, bottom up: no cycle (test_the_floor_plan_has_no_cycle)
    "ground": set(),
    "transport": {"ground"},  # the wire, the record format, run files, the consumer
    "notify": {"transport"},
    "delivery": {"ground", "transport"},  # the Kafka sink, its spool: torch-free
    "storage": {"ground", "transport"},
    "detectors": {"ground", "transport", "storage"},  # profiles and the registry in the store
    # commands (``warnings act`` lists the remedies), tuning, the profile builder
    "operate": {"ground", "transport", "storage", "detectors", "remediation"},
    "producers": {"ground", "transport", "detectors"},  # monitors, sink; the divergence rule
    # the remedies act on what the monitors found; a plain loop's feed runs the detectors
    "remediation": {"transport", "producers", "detectors"},
    # the framework callbacks: monitor, detectors in the process, remedies
    "integrations": {"ground", "transport", "producers", "detectors", "remediation"},
    "lab": {"ground", "transport", "producers", "detectors", "remediation"},
    "dashboard": {"ground", "storage", "detectors", "operate"},
    "app": {
        "ground",
        "transport",
        "delivery",
        "notify",
        "remediation",
        "operate",
        "storage",
        "lab",
        "dashboard",
    },
}


def _room_of(module: str) -> str | None:
    """The room a ``foreshock.…`` module lives in (None: not foreshock's)."""
    parts = module.split(".")
    if parts[0] != "foreshock":
        return None
    if len(parts) > 1 and parts[1] in FOLDERS:
        return parts[1]
    return "ground"


def _imported(tree: ast.AST, top_level_package: bool) -> set[str]:
    """Absolute foreshock modules a file imports (relative ones stay in its own room, but in
    ``foreshock/`` itself, the ground floor, a package of its own modules)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "foreshock":
                found.update(f"foreshock.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and top_level_package and node.level == 1:
            found.add(f"foreshock.{node.module}" if node.module else "foreshock")
    return found


def _files() -> list[tuple[str, Path]]:
    rooms = [(folder, path) for folder in FOLDERS for path in (ROOT / folder).rglob("*.py")]
    rooms += [("ground", path) for path in (ROOT / "foreshock").glob("*.py")]
    return rooms


def arrows() -> dict[str, dict[str, list[str]]]:
    """room -> {room it imports: [file: module, ...]}."""
    out: dict[str, dict[str, list[str]]] = {room: {} for room in ARROWS}
    for room, path in _files():
        tree = ast.parse(path.read_text(), str(path))
        for module in _imported(tree, path.parent.name == "foreshock"):
            target = _room_of(module)
            if target is not None and target != room:
                where = f"{path.relative_to(ROOT)}: {module}"
                out[room].setdefault(target, []).append(where)
    return out


def test_no_room_imports_a_room_it_may_not():
    found = arrows()
    added = {
        f"{room} -> {target}": where
        for room, targets in found.items()
        for target, where in targets.items()
        if target not in ARROWS[room]
    }
    assert not added, f"imports against the floor plan (tests/test_floors.py): {added}"


def test_the_floor_plan_lists_only_arrows_that_exist():
    found = arrows()
    gone = [
        f"{room} -> {target}"
        for room, targets in ARROWS.items()
        for target in targets
        if target not in found[room]
    ]
    assert not gone, f"no longer imported: take these out of ARROWS: {gone}"


def test_the_ground_floor_imports_no_room():
    assert ARROWS["ground"] == set() and not arrows()["ground"]


def test_the_floor_plan_has_no_cycle():
    def below(room: str, seen: frozenset[str] = frozenset()) -> set[str]:
        assert room not in seen, f"a cycle through {room}"
        return set().union(*(below(r, seen | {room}) | {r} for r in ARROWS[room]))

    for room in ARROWS:
        assert room not in below(room)


RAW_CLIENTS = {"Producer", "Consumer", "AdminClient"}


def test_no_raw_kafka_client_outside_transport():
    """Kafka clients are built in one place (``transport/clients.py``; the admin client in
    ``transport/topics.py``): a room that imports ``confluent_kafka``'s clients fails here."""
    raw = []
    for room, path in _files():
        if room == "transport":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("confluent_"):
                raw += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names]
    assert [r for r in raw if r.split(": ")[1] in RAW_CLIENTS] == []


def test_no_product_module_is_over_400_lines_and_the_monitors_room_stays_small():
    """Small modules that each own one idea (a module over 400 lines is two ideas, or a
    docstring that says too much); the monitors' room under 6,000 lines (it once held the
    Kafka sink, the remediation and the framework callbacks too: 10,000)."""
    sizes = {path: len(path.read_text().splitlines()) for _, path in _files()}
    long = {str(p.relative_to(ROOT)): n for p, n in sizes.items() if n > 400}
    assert not long, f"modules over 400 lines: {long}"
    producers = sum(n for p, n in sizes.items() if p.is_relative_to(ROOT / "producers"))
    assert producers < 6_000, f"producers/ has {producers} lines"


def _sub_room(module: str) -> str | None:
    """A module's room with each sub-package its own (``remediation.remedies``)."""
    room = _room_of(module)
    parts = module.split(".")
    if room in FOLDERS and len(parts) > 2 and (ROOT / parts[1] / parts[2] / "__init__.py").exists():
        return f"{room}.{parts[2]}"
    return room


def test_read_with_every_sub_package_a_room_there_is_no_cycle():
    """Each sub-package is a room too (lazy and type-only imports included): a sub-package
    imports its parent's modules or is imported by them, never both."""
    graph: dict[str, set[str]] = {}
    for room, path in _files():
        rel = path.relative_to(ROOT).with_suffix("")
        module = (
            ".".join(("foreshock", *rel.parts)) if room != "ground" else f"foreshock.{rel.name}"
        )
        here = _sub_room(module.removesuffix(".__init__"))
        for target in map(_sub_room, _imported(ast.parse(path.read_text()), room == "ground")):
            if target is not None and target != here:
                graph.setdefault(here, set()).add(target)

    def reach(room: str, path: tuple[str, ...] = ()) -> None:
        assert room not in path, f"a cycle: {' -> '.join((*path, room))}"
        for target in graph.get(room, ()):
            reach(target, (*path, room))

    for room in graph:
        reach(room)
