"""Every docstring example in the package runs and pins its output (river style)."""

import doctest
import importlib
import pkgutil

import pytest
import torch

torch.set_num_threads(1)

PACKAGES = [
    "foreshock",
    "foreshock.transport",
    "foreshock.producers",
    "foreshock.detectors",
    "foreshock.storage",
    "foreshock.dashboard",
    "foreshock.lab",
]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)]
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest failures in {name}"


def test_monitor_modules_have_examples() -> None:
    """The math modules document their formulas with runnable examples."""
    for name in ["spectra", "qk_increments", "router", "records"]:
        module = importlib.import_module(f"foreshock.producers.{name}")
        assert doctest.DocTestFinder().find(module), name
