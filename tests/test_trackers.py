"""The trackers' feed without a trainer: what a run's records become for W&B, TensorBoard and
MLflow (aggregated series, warning counts, texts and tags), and that it never raises.

The detector config here is a plumbing one (a tiny threshold on one series, no warm-up to
speak of): it makes a warning open on cue, and says nothing about what detects a fault.
"""

from __future__ import annotations

import doctest
from typing import Any

from foreshock.detectors import trackers
from foreshock.detectors.config import DetectorConfig, SeriesRule
from foreshock.detectors.trackers import AGGREGATES, TrackerFeed

LAYER = "model.layers.0.self_attn"
PLUMBING = DetectorConfig(
    rules=(SeriesRule("max_logit", "attention-numerics", "up", "level"),),
    warmup_start=0,
    warmup_records=2,
    confirm=1,
    release=1,  # resolves on the first calm record
    thresholds={"max_logit": 0.1},
)


def record(step: int, logit: float, **values: Any) -> dict[str, Any]:
    other = "max_logit@model.layers.1.self_attn"
    values = {f"max_logit@{LAYER}": logit, other: 1.0, "loss": 2.0, **values}
    return {"schema": "foreshock.metrics/1", "run_id": "r", "step": step, "values": values}


def test_docstring_examples() -> None:
    assert doctest.testmod(trackers).failed == 0


def test_aggregates_follow_the_detectors_rules() -> None:
    """Toward failure: entropies by their minimum, logits and drops by their maximum, ε both."""
    assert AGGREGATES["attn.d2.entropy_mean"] == ("min",)
    assert AGGREGATES["router.token_entropy_norm"] == ("min",)
    assert AGGREGATES["max_logit"] == ("max",)
    assert AGGREGATES["router.dropped_fraction"] == ("max",)
    assert AGGREGATES["router.epsilon"] == ("min", "max")
    assert "loss" not in AGGREGATES  # the trainer logs its symptoms itself


def test_feed_opens_counts_and_clears_a_warning() -> None:
    feed = TrackerFeed(PLUMBING)
    feed.start("r", {"project": "tests"})
    updates = [feed.update(record(s, v)) for s, v in [(0, 2.0), (10, 2.0), (20, 3.0), (30, 2.0)]]
    assert all(u is not None for u in updates)
    first, _, warned, calm = updates
    assert first.scalars["foreshock/max_logit/max"] == 2.0
    assert first.scalars["foreshock/warnings_open/attention-numerics"] == 0
    assert first.events == [] and first.text() is None and first.tags() == {}

    # ln(3/2) = 0.41 > 0.1: a warning opens at step 20 on layer 0
    assert [e.event for e in warned.events] == ["opened"]
    assert warned.scalars["foreshock/warning/attention-numerics"] == 1
    assert warned.scalars["foreshock/warnings_open/attention-numerics"] == 1
    text = warned.text()
    assert text is not None
    assert "attention-numerics" in text and LAYER in text and "step 20" in text
    assert "lead unknown" in text
    tags = warned.tags()
    assert list(tags) == [f"foreshock.warning.20.attention-numerics.{LAYER}"]

    # back to the warm-up level: cleared, and the count falls back to 0
    assert [e.event for e in calm.events] == ["cleared"]
    assert calm.scalars["foreshock/warnings_open/attention-numerics"] == 0
    assert "foreshock/warning/attention-numerics" not in calm.scalars
    assert "cleared at step 30" in (calm.text() or "")
    assert feed.detector is not None and not feed.detector._rewind.records  # no records kept


def test_feed_gives_the_lead_once_the_loss_diverges() -> None:
    feed = TrackerFeed(PLUMBING)
    feed.start("r", {})
    for step, logit in [(100, 2.0), (110, 2.0), (120, 3.0), (130, 3.0)]:
        feed.update(record(step, logit))
    # a non-finite loss (after the divergence rule's 100-step warm-up): the divergence
    update = feed.update(record(140, 3.0, loss=None))
    assert update is not None
    assert {e.event for e in update.events} == {"updated"}
    assert update.scalars["foreshock/lead/attention-numerics"] == 20
    assert "lead 20 steps" in (update.text() or "")


def test_feed_without_warnings_sends_the_series_only() -> None:
    feed = TrackerFeed(warnings=False)
    feed.start("r", {})
    update = feed.update(record(0, 2.0))
    assert update is not None and update.events == []
    assert update.scalars == {"foreshock/max_logit/max": 2.0}


def test_feed_never_raises() -> None:
    feed = TrackerFeed(PLUMBING)
    feed.start("r", {})
    assert feed.update({"values": {}}) is None  # no step: not a metrics record
    feed.detector.update = None  # type: ignore[union-attr,assignment]  # a broken detector
    update = feed.update(record(0, 2.0))
    assert update is not None and update.scalars["foreshock/max_logit/max"] == 2.0
    assert feed.detector is None  # stopped, the series still flow
