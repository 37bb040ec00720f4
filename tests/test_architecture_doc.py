"""docs/architecture.md cannot drift: every ``foreshock.…`` name it cites resolves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

PAGE = Path(__file__).parent.parent / "docs" / "architecture.md"


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def test_every_name_on_the_architecture_page_resolves():
    names = set(re.findall(r"`(foreshock\.[\w.]+)`", PAGE.read_text()))
    assert len(names) >= 30  # three paths, hop by hop
    missing = []
    for name in sorted(names):
        if name in ("foreshock.metrics", "foreshock.warnings", "foreshock.control"):
            continue  # topics, not code
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}: {exc!r}")
    assert missing == []
