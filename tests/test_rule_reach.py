"""Zero-shot says what it can see: each rule's firing point in the run's own units."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from foreshock.detectors.profiles import shipped_profiles
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import RECORDED_DIR, load_run, shipped_runs


def _qwen_run():
    return load_run(shipped_runs(RECORDED_DIR / "qwen3-moe")[0])


def test_a_level_rule_fires_at_its_warm_up_level_times_e_to_the_h():
    """The largest logit's rule, zero-shot: its firing point is the warm-up level × e^h, the
    factor shown (×190: what a user needs to see to know it will not fire on their model)."""
    profiles = shipped_profiles()
    report = replay_run(_qwen_run(), profiles)
    assert report.profile == "zero-shot"
    h = profiles.configs["zero-shot"].thresholds["max_logit"]
    text = report.reach["max_logit"]
    at, factor, level = (float(x) for x in re.findall(r"[\d.]+(?:e[+-]?\d+)?", text)[:3])
    assert factor == pytest.approx(math.exp(h), rel=1e-2)
    assert at == pytest.approx(level * math.exp(h), rel=1e-3)
    assert "fires after a drift of" in report.reach["attn.dwq.entropy"]
    assert "weight norm leads its warm-up trend by" in report.reach["optimizer-test"]


def test_foreshock_detect_prints_what_each_rule_takes():
    path = shipped_runs(RECORDED_DIR / "qwen3-moe")[0]
    done = subprocess.run(
        [sys.executable, "-m", "foreshock.app.cli", "detect", "--replay", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "what each rule takes to fire on this run" in done.stdout
    assert re.search(r"max_logit: fires at ≥ [\d.]+ \(×190 up", done.stdout)
