"""``foreshock tune``: tuning on a store's runs, the config registry, rollback, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from foreshock.app.cli import main
from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.registry import (
    RegistryError,
    history,
    live_config,
    live_version,
    publish,
    rollback,
)
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.store_runs import store_recorded_runs
from foreshock.operate.tune import TuneError, load_runs, replay_messages, tune
from foreshock.storage.store import DeltaStore

RUNS = (
    [f"healthy-s{s}" for s in range(10)]
    + [f"fa-lowprec-s{s}" for s in range(3)]
    + [f"lr-high-s{s}" for s in range(3)]
)
# on these runs (k 0.5, confirm 1, trend_beta 0.2) is quiet on the held-out healthy seeds
# and detects best; the confirm-2 points warn falsely on them
GRID = {"k": (0.5,), "confirm": (1, 2), "trend_beta": (0.2, 0.4)}
QUIET = {"k": 0.5, "confirm": 1, "trend_beta": 0.2}


def _paths(names: list[str]) -> list[Path]:
    paths = {p.name.split(".")[0]: p for p in shipped_runs()}
    return [paths[n] for n in names]


def _store(root: Path, names: list[str]) -> Path:
    with DeltaStore(root) as store:
        store_recorded_runs(store, _paths(names), config=None)
    return root


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only for the tests: anything published goes to a registry of the test's own."""
    return _store(tmp_path_factory.mktemp("tune") / "store", RUNS)


@pytest.fixture(scope="module")
def tuned(store: Path):
    return tune(store, GRID)


def _mechanism(report, before: int | None = None) -> list:
    return [
        a for a in report.alerts if a.family != "symptom" and (before is None or a.step < before)
    ]


def test_runs_read_back_from_the_store_replay_like_their_files(store: Path) -> None:
    runs, skipped, versions = load_runs(store)
    assert versions["steps"] >= 0
    assert sorted(r.run_id for r in runs) == sorted(RUNS)
    assert skipped == {"unfinished": [], "unlabelled": []}
    config = DetectorConfig.load(
        Path(__file__).parents[1] / "detectors" / "calibrated" / "gpt-moe.json"
    )
    for run in (r for r in runs if r.run_id in ("lr-high-s0", "fa-lowprec-s1")):
        from_store = replay_messages(run.run_id, run.start, run.records, run.end, config)
        from_file = replay_run(load_run(_paths([run.run_id])[0]), config)
        assert from_store.divergence_step == from_file.divergence_step is not None
        assert from_store.peaks == from_file.peaks
        assert [(a.family, a.module, a.step, a.role) for a in from_store.alerts] == [
            (a.family, a.module, a.step, a.role) for a in from_file.alerts
        ]
        assert from_store.alerts  # the faults do warn: the comparison is not of two nothings


def test_tune_picks_the_quiet_point_and_it_detects_every_fault(store: Path, tuned) -> None:
    config, report = tuned
    split = report["split"]
    assert sorted(split["calibration"]) == [f"healthy-s{s}" for s in (1, 2, 4, 5, 7, 8)]
    assert len(split["judged"]) == len(RUNS) - 6
    assert report["chosen"]["params"] == QUIET
    assert (config.k, config.confirm, config.trend_beta) == (0.5, 1, 0.2)
    assert config.calibration["runs"] == sorted(split["calibration"])
    assert config.version == report["chosen"]["version"]
    by_point = {tuple(p["params"].values()): p["families"] for p in report["points"]}
    noisy = [
        k for k, families in by_point.items() if sum(f["false_warnings"] for f in families) > 0
    ]
    assert noisy and (0.5, 1, 0.2) not in noisy  # the rule had something to reject
    chosen = {f["family"]: f for f in by_point[(0.5, 1, 0.2)]}
    assert chosen["attention-numerics"]["runs"] == chosen["router"]["runs"] == 3
    assert chosen["optimizer"]["false_warnings"] == 0  # no fault of its own: healthy rows only
    for family in (chosen["attention-numerics"], chosen["router"]):
        assert family["detection_rate"] == 1.0 and family["false_warnings"] == 0
        # every first warning names a right cause of its fault (the catalogue's, through
        # detectors.judge: tests/test_judge.py)
        assert family["attribution_ok"] == 1.0
        assert family["healthy_runs"] == 4 and family["lead_median"] > 0
        assert family["lead_p10"] <= family["lead_median"] <= family["lead_p90"]
    # the chosen config, replayed over the original files (the other code path)
    for name in split["judged"]:
        report_ = replay_run(load_run(_paths([name])[0]), config)
        if name.startswith("healthy"):
            assert not _mechanism(report_), name
        else:
            own = "router" if name.startswith("lr-high") else "attention-numerics"
            warned = _mechanism(report_, before=report_.divergence_step)
            assert warned and warned[0].family == own and warned[0].role == "cause", name


@pytest.mark.slow
def test_held_out_seed_range_and_progress(store: Path) -> None:
    calls = []
    _, report = tune(
        store,
        {"k": (0.5,), "confirm": (1,), "trend_beta": (0.2,)},
        held_out=range(0, 3),
        progress=lambda d, t: calls.append((d, t)),
    )
    assert sorted(report["split"]["calibration"]) == [f"healthy-s{s}" for s in range(3, 10)]
    assert report["split"]["held_out_seeds"] == "0-2"
    total = len(RUNS) * 2  # one load and one replay per run
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == list(range(1, total + 1))
    with pytest.raises(TuneError, match="0 healthy runs left to calibrate"):
        tune(store, GRID, held_out=range(0, 10))


def test_publish_makes_live_and_detect_store_loads_it(tmp_path: Path, tuned, capsys) -> None:
    config, report = tuned
    assert live_config(tmp_path) is None
    version = publish(tmp_path, config, report, note="first")
    assert live_config(tmp_path) == config and live_version(tmp_path) == version
    folder = tmp_path / "detector-configs"
    assert json.loads((folder / f"{version}.tune.json").read_text())["chosen"]["version"] == version
    assert [(e["version"], e["action"], e["note"]) for e in history(tmp_path)] == [
        (version, "tune", "first")
    ]
    run = str(_paths(["lr-high-s0"])[0])
    assert main(["detect", "--store", str(tmp_path), "--replay", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config_version"] == version
    assert main(["detect", "--store", str(tmp_path / "none"), "--replay", run, "--json"]) == 0
    out, err = capsys.readouterr()
    assert "no live config" in err and json.loads(out)["config_version"] != version


def test_rollback_walks_back_and_refuses_at_the_start(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="run `foreshock tune` first"):
        rollback(tmp_path)
    a, b, c = (publish(tmp_path, DetectorConfig(k=k)) for k in (0.25, 0.5, 1.0))
    assert rollback(tmp_path) == b and live_config(tmp_path) == DetectorConfig(k=0.5)
    assert rollback(tmp_path) == a
    with pytest.raises(RegistryError, match=r"nothing to roll back to.*first live config"):
        rollback(tmp_path)
    assert live_version(tmp_path) == a
    assert rollback(tmp_path, c) == c  # an explicit version is pushed...
    assert rollback(tmp_path) == a  # ...so rolling back undoes it
    with pytest.raises(RegistryError, match="no config 0123456789ab"):
        rollback(tmp_path, "0123456789ab")
    with pytest.raises(RegistryError, match="already live"):
        rollback(tmp_path, a)
    assert [e["action"] for e in history(tmp_path)] == ["tune"] * 3 + ["rollback"] * 4


def test_an_altered_config_file_is_refused(tmp_path: Path) -> None:
    version = publish(tmp_path, DetectorConfig())
    path = tmp_path / "detector-configs" / f"{version}.json"
    path.write_text(path.read_text().replace('"k": 0.5', '"k": 0.1'))
    with pytest.raises(RegistryError, match="altered"):
        live_config(tmp_path)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["fa-lowprec-s0", "lr-high-s0"], "no healthy runs"),
        (["healthy-s0", "healthy-s1", "healthy-s2", "fa-noise-s0"], "no labelled faulty runs"),
    ],
)
def test_tune_refuses_a_store_it_cannot_judge(tmp_path: Path, names, message, capsys) -> None:
    root = _store(tmp_path / "store", names)
    with pytest.raises(TuneError, match=message):
        tune(root, GRID)
    assert main(["tune", "--store", str(root)]) == 2
    assert message in capsys.readouterr().err
    assert not (root / "detector-configs").exists()


@pytest.mark.slow
def test_cli_dry_run_prints_the_report_as_json(store: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "foreshock.app.cli",
        "tune",
        "--store",
        str(store),
        "--dry-run",
        "--json",
        "--grid-k",
        "0.5",
        "--grid-confirm",
        "1",
        "2",
        "--grid-trend-beta",
        "0.2",
        "0.4",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["published"] is None and result["chosen"]["params"] == QUIET
    assert DetectorConfig.from_dict(result["config"]).version == result["chosen"]["version"]
    assert len(result["points"]) == 4
    assert not (store / "detector-configs").exists()
