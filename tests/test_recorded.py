"""Recorded runs load without torch, and the lab table's band rule scores them as documented."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from foreshock.lab.bands import band_exit
from foreshock.lab.recorded import load_run, shipped_runs


def _write_run(path: Path, run_id: str, scenario: str, values: list[float], onset=None) -> Path:
    lines = [
        {
            "schema": "foreshock.run/1",
            "kind": "start",
            "run_id": run_id,
            "labels": {"scenario": scenario, "onset": onset},
        }
    ]
    lines += [
        {
            "schema": "foreshock.metrics/1",
            "run_id": run_id,
            "step": 10 * i,
            "values": {"attn.d2.entropy_mean@h.0.attn": v, "loss": 2.0},
        }
        for i, v in enumerate(values)
    ]
    lines.append(
        {
            "schema": "foreshock.run/1",
            "kind": "end",
            "run_id": run_id,
            "divergence_step": None,
            "last_step": 10 * len(values),
        }
    )
    with gzip.open(path, "wt") as file:
        file.writelines(json.dumps(line) + "\n" for line in reversed(lines))
    return path


def test_load_run_orders_records_and_reads_labels(tmp_path: Path) -> None:
    run = load_run(_write_run(tmp_path / "a.jsonl.gz", "a", "healthy", [0.3, 0.4, 0.5]))
    assert run.run_id == "a" and run.labels["scenario"] == "healthy"
    assert run.series("attn.d2.entropy_mean@h.0.attn") == ([0, 10, 20], [0.3, 0.4, 0.5])
    assert run.divergence_step is None and run.end["last_step"] == 30
    assert shipped_runs(tmp_path) == [tmp_path / "a.jsonl.gz"]


def test_load_run_rejects_a_file_without_start(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"step": 1, "values": {}}\n')
    with pytest.raises(ValueError, match="no start record"):
        load_run(path)


def test_band_exit_rule(tmp_path: Path) -> None:
    key = "attn.d2.entropy_mean@h.0.attn"
    healthy = [
        load_run(
            _write_run(tmp_path / f"h{i}.jsonl.gz", f"h{i}", "healthy", [0.30 + 0.01 * i] * 40)
        )
        for i in range(3)
    ]  # band: [0.30, 0.32] padded by its width 0.02 -> [0.28, 0.34]
    dip = [0.31] * 20 + [0.25] + [0.31] * 4 + [0.2] * 15  # one-check dip, then a collapse at 250
    faulty = load_run(_write_run(tmp_path / "f.jsonl.gz", "f", "fa-lowprec", dip, onset=100))
    assert band_exit(faulty, key, healthy, min_step=0, consecutive=3) == (250, "below", key)
    assert band_exit(faulty, key, healthy, min_step=0, consecutive=1).step == 200
    assert band_exit(healthy[1], key, healthy, min_step=0, consecutive=1) is None


def test_recorded_runs_need_no_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from foreshock.lab.bands import band_exit\n"
        "from foreshock.lab.recorded import load_run, shipped_runs\n"
        "print(len(shipped_runs()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_shipped_runs_meet_the_lab_acceptance() -> None:
    """The recorded runs that ship: healthy and fa-noise never diverge; the faults do, all but
    a few fa-lowprec seeds (5 of 50) that had not diverged by the 1,600-step horizon: in four
    the attention logits never ran away (the fault had not taken hold); in s49 they were
    running away at the horizon (layer 1: 44 → 252 over its last 300 steps), the loss not yet
    diverged."""
    runs = [load_run(p) for p in shipped_runs()]
    by_scenario: dict[str, list] = {}
    for run in runs:
        assert run.end is not None, run.run_id
        assert {"scenario", "seed", "onset", "magnitude"} <= set(run.labels), run.run_id
        by_scenario.setdefault(run.labels["scenario"], []).append(run)
    for scenario in ("healthy", "fa-lowprec", "lr-high"):
        assert len(by_scenario[scenario]) >= 5, scenario
    for scenario in ("healthy", "fa-noise"):
        assert all(r.divergence_step is None for r in by_scenario[scenario]), scenario
    for scenario in ("fa-lowprec", "lr-high"):
        diverged = [r for r in by_scenario[scenario] if r.divergence_step is not None]
        assert len(diverged) >= 0.9 * len(by_scenario[scenario]), scenario
        for run in diverged:
            assert run.divergence_step > run.labels["onset"], run.run_id
    assert all(r.divergence_step is not None for r in by_scenario["lr-high"])
    for run in by_scenario["fa-lowprec"]:
        if run.divergence_step is None:  # diverged runs reach thousands
            assert _max_logit(run) < 100 or _running_away(run), run.run_id


def _max_logit(run) -> float:
    series = [k for k in run.keys() if k.startswith("max_logit@")]  # noqa: SIM118 (a list)
    peaks = [max(v for v in run.series(k)[1] if v is not None) for k in series]
    return max(peaks)


def _running_away(run, records: int = 12, factor: float = 3.0) -> bool:
    """Some layer's largest logit grew by ``factor`` over the run's last ``records`` records."""
    for key in (k for k in run.keys() if k.startswith("max_logit@")):  # noqa: SIM118 (a list)
        values = [v for v in run.series(key)[1] if v is not None]
        if len(values) > records and values[-1] >= factor * values[-1 - records]:
            return True
    return False
