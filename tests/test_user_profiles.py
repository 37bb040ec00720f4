"""A user makes a profile for their own model with the product: runs imported into a store,
``foreshock calibrate --name`` publishing a named profile beside the shipped ones, and the
detectors judging that model's runs by it (and no other model's)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from foreshock.cli import main
from foreshock.detectors.make_profile import MIN_HEALTHY_RUNS, ProfileError, make_profile
from foreshock.detectors.replay import replay_run
from foreshock.detectors.signatures import lab_signature
from foreshock.lab.recorded import RECORDED_DIR, load_run

MIXTRAL = RECORDED_DIR / "mixtral"


def _healthy(seeds: range) -> list[Path]:
    return [MIXTRAL / f"mixtral-healthy-s{seed}.jsonl.gz" for seed in seeds]


def _unlabelled(path: Path, out: Path) -> Path:
    """The run as a user's producer would send it: no labels, the signature in ``start``."""
    with gzip.open(path, "rt") as file:
        lines = file.read().splitlines()
    start = json.loads(lines[0])
    start["monitor"]["signature"] = {**lab_signature(start["labels"]), "dispatch": None}
    start["labels"] = {}
    out.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    return out


def test_a_store_import_refuses_a_run_id_it_already_holds(tmp_path, capsys):
    store = str(tmp_path / "store")
    assert main(["store", "import", "--store", store, *map(str, _healthy(range(2)))]) == 0
    again = _healthy(range(1, 3))  # s1 is stored already: nothing of this import is written
    assert main(["store", "import", "--store", store, *map(str, again)]) == 1
    assert "already in the store: mixtral-healthy-s1" in capsys.readouterr().err
    twice = [str(_healthy(range(3, 4))[0])] * 2
    assert main(["store", "import", "--store", store, *twice]) == 1
    assert "in two files: mixtral-healthy-s3" in capsys.readouterr().err
    assert main(["store", "import", "--store", store, str(_healthy(range(2, 3))[0])]) == 0


def test_calibrate_refuses_too_few_healthy_runs_unless_asked_and_then_says_so(tmp_path, capsys):
    few = [str(p) for p in _healthy(range(3))]
    args = ["calibrate", "--healthy", *few, "--name", "mine", "--profiles", str(tmp_path)]
    assert main(args) == 2
    assert f"a profile needs {MIN_HEALTHY_RUNS}" in capsys.readouterr().err
    assert main([*args, "--allow-few"]) == 0
    assert "WARNING: only 3 healthy runs" in capsys.readouterr().err
    made = json.loads((tmp_path / "mine.json").read_text())
    assert made["calibration"]["too_few_runs"] and made["bands"]


def test_a_profile_is_made_of_one_model_only():
    runs = [load_run(p) for p in _healthy(range(2))]
    other = load_run(RECORDED_DIR / "healthy-s0.jsonl.gz")  # the lab's GPT-MoE
    with pytest.raises(ProfileError, match="different models"):
        make_profile([*runs, other], replay_run, allow_few=True)


def test_a_published_profile_judges_its_models_runs_from_the_store(tmp_path, capsys):
    store = tmp_path / "store"
    runs = [str(p) for p in _healthy(range(MIN_HEALTHY_RUNS))]
    assert main(["store", "import", "--store", str(store), "--no-warnings", *runs]) == 0
    assert (
        main(["calibrate", "--from-store", str(store), "--name", "ours", "--store", str(store)])
        == 0
    )
    capsys.readouterr()
    fault = _unlabelled(MIXTRAL / "mixtral-lr-high-s0.jsonl.gz", tmp_path / "fault.jsonl")
    assert main(["detect", "--store", str(store), "--replay", str(fault), "--json"]) == 0
    judged = json.loads(capsys.readouterr().out)
    assert (
        judged["profile"] == "ours" and "calibrated on mixtral L2 d128" in judged["profile_reason"]
    )
    assert all(w["evidence"]["profile"] == "ours" for w in judged["warnings"])
    other = _unlabelled(RECORDED_DIR / "lr-high-s0.jsonl.gz", tmp_path / "other.jsonl")
    assert main(["detect", "--store", str(store), "--replay", str(other), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "gpt-moe"  # not ours: the lab's
