"""One judge (``foreshock.detectors.judge``): its answers, and tune and the detection benchmark
giving the same verdict on shipped runs (before, tune called every lr-high run's optimizer
attribution wrong while the benchmark called it right)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.detection_table import _judge as table_judge
from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.judge import UNKNOWN, judge
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.tune import StoredRun
from foreshock.operate.tune_score import verdicts

CALIBRATED = Path(__file__).parents[1] / "detectors" / "calibrated" / "gpt-moe.json"


def warning(family: str, step: int, cause: str | None = None, role: str = "cause"):
    evidence = {"cause": cause if family != "symptom" else None}
    return SimpleNamespace(family=family, step=step, role=role, evidence=evidence)


def test_attribution_reads_the_catalogues_right_causes() -> None:
    optimizer = [warning("router", 600, "optimizer", role="optimizer")]
    assert judge("lr-high", 1200, optimizer).attribution == "correct"
    assert judge("combined", 1200, optimizer).attribution == "correct"
    assert judge("gbs-small", 1200, optimizer).attribution == "wrong"
    router = [warning("router", 600, "router")]
    assert judge("fa-lowprec", 1200, router).attribution == "wrong"
    assert judge("fa-lowprec", 1200, router).attribution_ok is False
    both = [warning("attention-numerics", 600, "ambiguous", role="ambiguous")]
    assert judge("fa-lowprec", 1200, both).attribution == "ambiguous"
    assert judge("fa-lowprec", 1200, []).attribution == "none"
    assert judge("fa-lowprec", 1200, []).attribution_ok is None


def test_only_warnings_before_divergence_detect_and_lead() -> None:
    late = [warning("router", 700, "router"), warning("symptom", 650)]
    verdict = judge("lr-high", 650, late)
    assert not verdict.detected and verdict.first is None and verdict.lead() is None
    assert verdict.attribution == "none"
    never = judge("lr-high", None, late)  # did not diverge: every warning counts, no lead
    assert never.detected and never.lead("router") is None
    assert not never.own_before_symptom  # the symptom (650) came before the router (700)


def test_the_first_warning_is_the_earliest_step_over_ranks() -> None:
    ranks = [warning("router", 500, "router"), warning("attention-numerics", 300, "optimizer")]
    verdict = judge("combined", 1000, ranks)  # rank 0's list, then rank 1's
    assert verdict.first.step == 300 and verdict.cause == "optimizer"
    assert verdict.family_leads == {
        "attention-numerics": 700,
        "router": 500,
        "optimizer": None,
        "symptom": None,
    }


def test_quiet_and_unknown_scenarios() -> None:
    warnings = [warning("router", 300, "router"), warning("router", 900, "router")]
    healthy = judge("healthy", None, warnings)
    assert not healthy.faulty and healthy.detected  # a false alarm
    assert healthy.false_warnings == {"attention-numerics": 0, "router": 2, "optimizer": 0}
    assert healthy.attribution == "wrong"  # there was no fault to name
    bespoke = judge("my-own-fault", 1000, warnings)
    assert bespoke.faulty and bespoke.families == (UNKNOWN,)
    assert bespoke.detected_by(UNKNOWN) and bespoke.lead(UNKNOWN) == 700
    assert bespoke.attribution == "unjudged" and bespoke.attribution_ok is None


@pytest.mark.parametrize("seed", [0, 1, 3, 9])  # first warning: attention (0), router (others)
def test_tune_and_the_detection_table_agree_on_lr_high_runs(seed: int) -> None:
    (path,) = [p for p in shipped_runs() if p.name == f"lr-high-s{seed}.jsonl.gz"]
    run = load_run(path)
    report = replay_run(run, DetectorConfig.load(CALIBRATED))
    table = table_judge(report, "lr-high")
    stored = StoredRun(run.run_id, "lr-high", seed, run.start, run.records, run.end or {})
    (row,) = verdicts(report, stored.run_id, stored.scenario)  # judged on its family, the router
    assert table["divergence"] == report.divergence_step is not None
    assert table["attribution"] == "correct" and table["cause"] == "optimizer"
    assert row["attribution_ok"] is True  # was False: the role is "optimizer", not "cause"
    assert row["detected"] is table["detected"] is True
    assert row["lead"] == table["family_leads"]["router"]
