"""River's estimator contract, over every detector and standardizer in ``foreshock.detectors``.

river checks each of its estimators against one suite (``river.checks``): constructor
arguments stored as attributes of the same name, so that ``repr()`` can show them and
``clone()`` can rebuild a fresh estimator from them; a clone shares no state with its original.
A class that breaks this fails late and far from its cause: ``repr()`` and ``clone()`` of a
``OneSidedCUSUM`` raised AttributeError: 'confirm' in whatever logged or copied one, and no test
noticed. These are river's checks, written for our two ``update`` shapes:
``update(x)`` then a flag (the drift detectors) and ``update(step, x)`` returning a value (the
standardizers, the loss divergence rule). A new class with an ``update`` must get a
:class:`Spec` here (``test_every_detector_class_has_a_spec``).
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import foreshock.detectors
from foreshock.detectors.bands import BandStandardizer
from foreshock.detectors.cusum import OneSidedCUSUM
from foreshock.detectors.divergence import LossDivergence
from foreshock.detectors.kinds import BUILDERS
from foreshock.detectors.level import SustainedLevel
from foreshock.detectors.standardize import (
    LogRatioStandardizer,
    LogTrendStandardizer,
    TrailingLogTrendStandardizer,
    TrendStandardizer,
    WarmupStandardizer,
)


@dataclass(frozen=True)
class Spec:
    """How to exercise one class: non-default parameters (every one of the signature's), one
    other valid value per parameter, an input stream, and when its signal first goes up."""

    cls: type
    params: dict[str, Any]
    others: dict[str, Any]
    stream: list[tuple]  # the arguments of each update
    signal: Callable[[Any, Any], bool]  # (instance, what update returned) -> fired?
    fires_at: int  # index in ``stream`` of the first update that raises the signal

    def __repr__(self) -> str:  # failure messages name the class, not the whole stream
        return f"Spec({self.cls.__name__})"

    def new(self) -> Any:
        return self.cls(**self.params)

    def feed(self, obj: Any, stream: list[tuple] | None = None) -> list[tuple[Any, bool]]:
        """Update ``obj`` with each input; (returned value, signal) after each."""
        seen = []
        for args in self.stream if stream is None else stream:
            out = obj.update(*args)
            seen.append((out, self.signal(obj, out)))
        return seen


def _drift(obj: Any, _: Any) -> bool:
    return obj.drift_detected


def _ready(obj: Any, _: Any) -> bool:
    return obj.ready


def _beyond_band(_: Any, z: float | None) -> bool:
    return z is not None and z != 0.0


def _diverged(obj: Any, _: Any) -> bool:
    return obj.divergence_step is not None


SPECS = [
    Spec(
        OneSidedCUSUM,
        params={"direction": "up", "k": 0.5, "h": 2.0, "confirm": 2},
        others={"direction": "down", "k": 0.25, "h": 3.0, "confirm": 3},
        stream=[(x,) for x in [0.0, 1.0, 2.0, 2.0, 2.0, 0.0, -9.0, 3.0]],
        signal=_drift,
        fires_at=4,  # S = 0, .5, 2, 3.5, 5: min of the last two crosses 2 at the fifth
    ),
    Spec(
        SustainedLevel,
        params={"direction": "down", "h": 0.5, "confirm": 2},
        others={"direction": "up", "h": 1.0, "confirm": 3},
        stream=[(x,) for x in [-0.1, -0.7, -0.2, -0.6, -0.8, 0.0]],
        signal=_drift,
        fires_at=4,
    ),
    Spec(
        WarmupStandardizer,
        params={"start": 10, "records": 3, "rel_floor": 0.02, "abs_floor": 1e-3},
        others={"start": 20, "records": 4, "rel_floor": 0.05, "abs_floor": 1e-2},
        stream=[(0, 9.0), (10, 1.0), (20, 1.2), (30, 0.8), (40, 0.6), (50, 1.0)],
        signal=_ready,
        fires_at=3,  # the third record at a step >= start completes the warm-up
    ),
    Spec(
        TrendStandardizer,
        params={"start": 5, "records": 4, "beta": 0.5, "rel_floor": 0.02, "abs_floor": 1e-3},
        others={"start": 6, "records": 5, "beta": 0.3, "rel_floor": 0.05, "abs_floor": 1e-2},
        stream=[(0, 5.0), (5, 1.0), (6, 1.1), (7, 0.9), (8, 1.0), (9, 1.1), (10, 0.2)],
        signal=_ready,
        fires_at=4,
    ),
    Spec(
        LogRatioStandardizer,
        params={"start": 10, "records": 2, "abs_floor": 1e-9},
        others={"start": 20, "records": 3, "abs_floor": 1e-6},
        stream=[(0, 9.0), (10, 0.9), (20, 1.1), (30, 0.5), (40, 2.0)],
        signal=_ready,
        fires_at=2,
    ),
    Spec(
        LogTrendStandardizer,
        params={"start": 10, "records": 2},
        others={"start": 20, "records": 3},
        stream=[(0, 9.0), (10, 1.0), (20, 1.1), (30, 1.2), (40, 2.0)],
        signal=_ready,
        fires_at=2,
    ),
    Spec(
        TrailingLogTrendStandardizer,
        params={"start": 10, "records": 2, "gap": 1},
        others={"start": 20, "records": 3, "gap": 2},
        stream=[(0, 9.0), (10, 1.0), (20, 1.1), (30, 1.2), (40, 2.0)],
        signal=_ready,
        fires_at=3,  # ready with its first line: the record after the two it is fitted on
    ),
    Spec(
        BandStandardizer,
        params={"band": {"steps": [100, 200], "lo": [1.0, 2.0], "hi": [2.0, 4.0]}, "start": 100},
        others={"band": {"steps": [0], "lo": [0.0], "hi": [1.0]}, "start": 150},
        stream=[(50, 9.0), (100, 1.5), (100, 3.0), (250, 1.0)],
        signal=_beyond_band,
        fires_at=2,
    ),
    Spec(
        LossDivergence,
        params={"margin": 0.4, "patience": 50, "ema": 0.1, "warmup": 100},
        others={"margin": 1.0, "patience": 100, "ema": 0.2, "warmup": 200},
        stream=[(s, 2.0 if s < 500 else 4.0) for s in range(0, 1000, 50)],
        signal=_diverged,
        fires_at=10,  # step 500: one record 50 steps long, `patience` 50
    ),
]

# Classes in foreshock.detectors with an ``update`` that are not detectors in river's sense.
NOT_DETECTORS = {
    "RunDetector": "a whole run's engine over a config, tested in test_detectors",
    "RunStreams": "a run's RunDetectors, one per rank, tested in test_per_rank",
    "ScheduleClock": "where a run's learning-rate schedule stands, tested in test_recipes",
    "Detector": "the protocol every kind's detector meets (kinds.py), checked per kind below",
    "InProcessDetector": "a RunDetector in the trainer's process, tested in test_trackers",
    "TrackerFeed": "the trackers' feed of a RunDetector, tested in test_trackers",
}

# Not a river ``base.Base`` yet, so no clone() and the default repr(); strict, so the
# checks below fail as soon as it is one (then delete the entry).
WITHOUT_BASE: dict[str, str] = {}  # class name -> why it is not a river base.Base yet


def _ids(specs: list[Spec]) -> list[str]:
    return [s.cls.__name__ for s in specs]


def _river(specs: list[Spec]) -> list:
    """``specs`` for the checks that need river's clone() and repr()."""
    params = []
    for s in specs:
        reason = WITHOUT_BASE.get(s.cls.__name__)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        params.append(pytest.param(s, id=s.cls.__name__, marks=marks))
    return params


def _state(obj: Any) -> dict[str, Any]:
    """Everything an instance holds: parameters and what its updates built."""
    return {name: list(v) if hasattr(v, "maxlen") else v for name, v in vars(obj).items()}


def _parameters(cls: type) -> list[str]:
    return [p for p in inspect.signature(cls).parameters if p != "self"]


def test_every_detector_class_has_a_spec() -> None:
    found = set()
    for info in pkgutil.iter_modules(foreshock.detectors.__path__):
        module = importlib.import_module(f"foreshock.detectors.{info.name}")
        for name, c in vars(module).items():
            if inspect.isclass(c) and c.__module__ == module.__name__ and hasattr(c, "update"):
                found.add(name)
    assert found - set(NOT_DETECTORS) == set(_ids(SPECS))


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_constructor_arguments_are_attributes_of_the_same_name(spec: Spec) -> None:
    assert set(spec.params) == set(spec.others) == set(_parameters(spec.cls))
    obj = spec.new()
    for name, value in spec.params.items():
        assert getattr(obj, name) == value, name
    for name, value in spec.others.items():  # each other value is valid, and kept as given
        assert getattr(spec.cls(**{**spec.params, name: value}), name) == value, name


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_defaults_are_immutable(spec: Spec) -> None:
    """A mutable default would be shared by every instance built without that argument."""
    for p in inspect.signature(spec.cls).parameters.values():
        assert p.default is p.empty or isinstance(p.default, (type(None), bool, int, float, str))


@pytest.mark.parametrize("spec", _river(SPECS))
def test_repr_names_every_parameter_and_its_value(spec: Spec) -> None:
    obj = spec.new()
    text = repr(obj)
    assert text.startswith(f"{spec.cls.__name__} (")
    for name in spec.params:
        assert f"\n  {name}=" in text, name
    assert repr(obj.clone()) == text
    for name, value in spec.others.items():
        assert repr(obj.clone({name: value})) != text, name


@pytest.mark.parametrize("spec", _river(SPECS))
def test_clone_has_the_parameters_and_none_of_the_state(spec: Spec) -> None:
    obj = spec.new()
    spec.feed(obj)
    clone = obj.clone()
    assert type(clone) is spec.cls and clone is not obj
    assert clone._get_params() == obj._get_params() == spec.params
    assert _state(clone) == _state(spec.new())
    for name, value in spec.params.items():
        if not isinstance(value, (bool, int, float, str)):
            assert getattr(clone, name) is not getattr(obj, name), f"{name} is shared"


@pytest.mark.parametrize("spec", _river(SPECS))
def test_clone_with_new_parameters_applies_them(spec: Spec) -> None:
    obj = spec.new()
    for name, value in spec.others.items():
        clone = obj.clone({name: value})
        assert clone._get_params() == {**spec.params, name: value}, name
        assert obj._get_params() == spec.params


@pytest.mark.parametrize("spec", _river(SPECS))
def test_updating_a_clone_leaves_the_original_alone(spec: Spec) -> None:
    """And the other way round: the original fed after cloning leaves the clone alone."""
    half = len(spec.stream) // 2
    obj = spec.new()
    spec.feed(obj, spec.stream[:half])
    before, clone = pickle.dumps(obj), obj.clone()
    spec.feed(clone)
    assert pickle.dumps(obj) == before
    clone = obj.clone()
    before = pickle.dumps(clone)
    spec.feed(obj, spec.stream[half:])
    assert pickle.dumps(clone) == before


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_update_then_read_the_signal(spec: Spec) -> None:
    """Silent before any input, up first where the stream says; the same parameters on the
    same stream give the same outputs (no state outside the instance)."""
    obj = spec.new()
    assert not spec.signal(obj, None)
    seen = spec.feed(obj)
    assert [fired for _, fired in seen].index(True) == spec.fires_at
    assert spec.feed(spec.new()) == seen


RESETTABLE = [s for s in SPECS if hasattr(s.cls, "_reset")]


@pytest.mark.parametrize("spec", RESETTABLE, ids=_ids(RESETTABLE))
def test_reset_is_a_fresh_instance(spec: Spec) -> None:
    """river's ``_reset``: what was learnt goes, the parameters stay, and the stream replays."""
    obj = spec.new()
    seen = spec.feed(obj)
    obj._reset()
    assert _state(obj) == _state(spec.new())
    assert spec.feed(obj) == seen


def test_the_drift_detectors_have_a_reset() -> None:
    assert {OneSidedCUSUM, SustainedLevel} <= {s.cls for s in RESETTABLE}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_rule_kind_builds_a_detector_the_engine_can_read(kind):
    """The engine reads a kind's detector only through the ``Detector`` protocol."""
    from foreshock.detectors.config import DetectorConfig, SeriesRule
    from foreshock.detectors.kinds import Detector

    rule = SeriesRule("router.epsilon", "router", "down", kind=kind)
    detector = BUILDERS[kind].detector(DetectorConfig(), rule, "down", 1.0)
    assert isinstance(detector, Detector)
    detector.update(-5.0)
    assert isinstance(detector.drift_detected, bool) and detector.statistic >= 0
