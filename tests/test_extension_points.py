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
    from foreshock.remediation.remedies import REMEDIES

    return {
        "Receivers": list(RECEIVERS),
        "Rule kinds": list(BUILDERS),
        "Remedies": list(REMEDIES),
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


def test_a_remedy_is_one_module_found_by_its_package(tmp_path, monkeypatch):
    """Adding a remedy is one module: dropped beside the others it is found, offered and
    applied through the same dispatch (here a module on an extra path of the package)."""
    import sys

    from foreshock.remediation import remedies
    from foreshock.remediation.decision import decision_for, opened
    from foreshock.remediation.remedy import Remediator, RemedyPolicy

    (tmp_path / "extra_remedy.py").write_text(
        "from foreshock.remediation.remedies import Remedy, ask\n"
        "REMEDY = Remedy('extra-remedy', 'clear the optimizer moments',\n"
        "                lambda trainer, d: ask(trainer, 'reset_moments'))\n"
    )
    before = list(remedies.REMEDIES)
    monkeypatch.setattr(remedies, "__path__", [*remedies.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, f"{remedies.__name__}.extra_remedy", raising=False)
    found = remedies._found()
    monkeypatch.setattr(remedies, "REMEDIES", found)
    monkeypatch.setattr("foreshock.remediation.remedy.REMEDIES", found)
    assert list(found) == sorted([*before, "extra-remedy"])

    class Trainer:
        reset = 0

        def reset_moments(self) -> None:
            self.reset += 1

    trainer = Trainer()
    policy = RemedyPolicy(actions={"optimizer": "hold-lr"})
    decision = decision_for("extra-remedy", opened("optimizer", None, [400]), 401, policy)
    action = Remediator(policy, trainer).apply(decision)
    assert action.applied and trainer.reset == 1
    monkeypatch.delitem(sys.modules, f"{remedies.__name__}.extra_remedy", raising=False)
