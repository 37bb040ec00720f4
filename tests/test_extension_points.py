"""Every registered extension point is on docs/extending.md, and nothing else is there
(in the manner of datasette's ``test_plugin_hooks_are_documented``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _registered() -> dict[str, list[str]]:
    from foreshock.detectors.kinds import BUILDERS
    from foreshock.notify.receivers import RECEIVERS
    from foreshock.producers.discovery import ATTENTION_LAYOUTS
    from foreshock.remediation.remedy import REMEDY_CALLS

    return {
        "Receivers": list(RECEIVERS),
        "Rule kinds": list(BUILDERS),
        "Remedies": list(REMEDY_CALLS),
        "Attention layouts": list(ATTENTION_LAYOUTS),
    }


def _documented(section: str) -> list[str]:
    """The first column of the table under ``## section``."""
    text = PAGE.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]


@pytest.mark.parametrize("section", list(_registered()))
def test_every_extension_point_is_documented_in_its_order(section):
    assert _documented(section) == _registered()[section], (
        f"docs/extending.md's {section} table and the registry differ"
    )
