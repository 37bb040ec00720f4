"""Every docstring example in the package runs and pins its output (river style).

Every module of every package, however deep: the packages pyproject.toml declares and all that
lies below them (``foreshock.integrations`` included). Not the dashboard's pages
(``foreshock.dashboard.views.*``): Streamlit runs them as scripts, and importing one runs it.
"""

import doctest
import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

try:  # services' modules run their examples without torch; the trainer's skip, saying why
    import torch
except ImportError:
    torch = None
else:
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
PAGES = "foreshock.dashboard.views."


def _reraise(name: str) -> None:
    """walk_packages' onerror: a subpackage that fails to import is an error, not a gap."""
    raise  # the ImportError walk_packages is handling: we are called inside its except


def _modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        walked = [m.name for m in pkgutil.walk_packages(path, f"{package}.", onerror=_reraise)]
        for name in [package, *walked]:
            if name not in names and not name.startswith(PAGES):
                names.append(name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an integration whose framework is not installed
        if "pip install 'foreshock[" not in str(exc):
            raise
        pytest.skip(str(exc))
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest failures in {name}"


def test_every_module_file_is_collected() -> None:
    """The walk reaches every module file below a declared package, however deep."""
    collected = set(_modules())
    for package in PACKAGES:
        for folder in importlib.import_module(package).__path__:
            for file in Path(folder).rglob("*.py"):
                parts = file.relative_to(folder).with_suffix("").parts
                name = ".".join((package, *parts)).removesuffix(".__init__")
                assert name in collected or name.startswith(PAGES), name


def test_monitor_modules_have_examples() -> None:
    """The math modules document their formulas with runnable examples."""
    for name in [
        "producers.spectra",
        "producers.qk_increments",
        "producers.router",
        "transport.records",
    ]:
        module = importlib.import_module(f"foreshock.{name}")
        assert doctest.DocTestFinder().find(module), name
