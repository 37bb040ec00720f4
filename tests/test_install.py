"""Installing foreshock: a quiet build that ships its data, lower bounds for a library, and the
project's own exact versions in constraints.txt (offline: the build uses this environment's
setuptools)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# A Python warning as Python prints it ("...: SetuptoolsDeprecationWarning: ...", "_Warning:").
WARNING = re.compile(r"\w*Warning\b")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Build output and wheel, from a copy of what the package is built from (as the
    Dockerfile copies it), so the repo gets no build/ or egg-info."""
    src = tmp_path_factory.mktemp("src")
    setuptools = PROJECT["tool"]["setuptools"]
    for name in ["pyproject.toml", PROJECT["project"]["readme"]]:
        shutil.copy(ROOT / name, src / name)
    for folder in {d.split("/")[0] for d in setuptools["package-dir"].values()}:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = src / "dist"
    code = f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (wheel,) = out.glob("*.whl")
    return done.stdout + done.stderr, wheel


def test_the_build_prints_no_setuptools_warnings(build: tuple[str, Path]) -> None:
    """A data folder with an importable name that is not a declared package (foreshock.lab.runs
    was one) makes setuptools print a screen of warnings on every install."""
    output, _ = build
    warnings = [line for line in output.splitlines() if WARNING.search(line)]
    assert not warnings, "\n".join(warnings)


def test_the_wheel_ships_every_data_file(build: tuple[str, Path]) -> None:
    _, wheel = build
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [
        *(ROOT / "lab" / "runs").rglob("*.jsonl.gz"),
        ROOT / "lab" / "runs" / "README.md",
        *(ROOT / "detectors" / "calibrated").glob("*.json"),
        ROOT / "foreshock" / "transport" / "wire-v1.schema.json",
    ]
    assert len(data) > 100
    prefix = {"lab": "foreshock/lab", "detectors": "foreshock/detectors", "foreshock": "foreshock"}
    missing = []
    for path in data:
        top, *rest = path.relative_to(ROOT).parts
        if "/".join([prefix[top], *rest]) not in names:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, missing


def requirements() -> dict[str, list[Requirement]]:
    """'' for the core dependencies, else the extra's name."""
    found = {"": [Requirement(r) for r in PROJECT["project"]["dependencies"]]}
    for extra, reqs in PROJECT["project"]["optional-dependencies"].items():
        found[extra] = [Requirement(r) for r in reqs]
    return found


def test_only_lower_bounds_for_what_a_trainer_installs_beside() -> None:
    """No exact pins outside the dev tools: an exact torch (or transformers) forces a conflict
    with the trainer's own."""
    for extra, reqs in requirements().items():
        if extra == "dev":
            continue
        for req in reqs:
            assert all(s.operator != "==" for s in req.specifier), f"[{extra}] {req}"
    (torch,) = requirements()["torch"]
    assert torch.name == "torch" and any(s.operator == ">=" for s in torch.specifier)


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[req.name] = spec.version
    return pins


def test_the_exact_versions_live_in_constraints_txt_and_satisfy_the_bounds() -> None:
    pins = constraints()
    assert "torch" in pins
    for reqs in requirements().values():
        for req in reqs:
            if req.name in pins:
                assert req.specifier.contains(pins[req.name], prereleases=True), req


def test_setup_installs_under_the_constraints() -> None:
    """scripts/setup.sh (so CI and the demo) installs with `-c constraints.txt`, and names the
    pinned torch from that file, not a copy of it."""
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r'-c constraints\.txt -e "\.\[\$\{extras\}\]"', text)
    assert constraints()["torch"] not in text
