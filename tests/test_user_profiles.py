"""A user makes a profile for their own model with the product: runs imported into a store,
``foreshock calibrate --name`` publishing a named profile beside the shipped ones, and the
detectors judging that model's runs by it (and no other model's)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from foreshock.app.cli import main
from foreshock.detectors.make_profile import MIN_HEALTHY_RUNS, ProfileError, make_profile
from foreshock.detectors.replay import replay_run
from foreshock.detectors.signatures import lab_signature
from foreshock.lab.recorded import RECORDED_DIR, load_run
from foreshock.operate.detect_commands import default_config

MIXTRAL = RECORDED_DIR / "mixtral"
FAULTS = ("fa-lowprec", "lr-high")


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_users_moe_through_the_hf_trainer_with_no_labels_gets_zero_shot_warnings(
    tmp_path, capsys
):
    """A tiny Qwen3-MoE of a size no profile knows, trained by the HF Trainer with the
    callback as documented and no labels, at a learning rate far too high for it (0.3,
    constant): the zero-shot profile judges it, warns, and the detect table says which
    profile and why. (A warm-up to a too-high peak is judged only from its peak on:
    docs/recipes.md; this test's run warmed up to 1.0 before, and was warned only after it
    diverged.)"""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from foreshock.integrations.huggingface import ForeshockCallback

    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        **{"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2},
        **{"head_dim": 12, "num_hidden_layers": 2, "intermediate_size": 32},
        **{"moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2},
        **{"vocab_size": 64, "max_position_embeddings": 64},
    )
    tokens = torch.arange(64).repeat(40)
    starts = torch.randint(0, 1000, (400 * 8,), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": tokens[s : s + 32], "labels": tokens[s : s + 32]} for s in starts]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        **{"max_steps": 400, "per_device_train_batch_size": 8, "learning_rate": 0.3},
        **{"lr_scheduler_type": "constant"},
        **{"max_grad_norm": 0.0, "save_strategy": "no", "report_to": "none"},
        **{"use_cpu": True, "seed": 0, "disable_tqdm": True, "dataloader_num_workers": 0},
    )
    path = tmp_path / "run.jsonl"
    callback = ForeshockCallback(path, run_id="users-moe", every=10)
    model = transformers.Qwen3MoeForCausalLM(config)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    trainer.train()
    run = load_run(path)
    assert not {"arch", "profile"} & set(run.labels)
    assert run.start["monitor"]["signature"]["model_type"] == "qwen3_moe"
    assert main(["detect", "--replay", str(path)]) == 0
    table = capsys.readouterr().out
    assert "users-moe: profile zero-shot (no profile was calibrated on qwen3_moe L2 d48" in table
    report = replay_run(run, default_config())
    assert report.profile == "zero-shot" and report.alerts
    assert {a.evidence["profile"] for a in report.alerts} == {"zero-shot"}


@pytest.mark.slow
def test_tune_publishes_a_named_profile_that_a_live_config_leaves_to_its_model(tmp_path, capsys):
    store = tmp_path / "store"
    mixtral = [*_healthy(range(6)), *(MIXTRAL / f"mixtral-{s}-s0.jsonl.gz" for s in FAULTS)]
    lab = [RECORDED_DIR / name for name in ("healthy-s2.jsonl.gz", "lr-high-s0.jsonl.gz")]
    for runs in (mixtral, lab):  # two models in one store
        assert (
            main(["store", "import", "--store", str(store), "--no-warnings", *map(str, runs)]) == 0
        )
    tune = ["tune", "--store", str(store), "--grid-k", "0.5", "--grid-confirm", "2"]
    tune += ["--grid-trend-beta", "0.05", "--held-out-seeds", "0-1"]
    assert main([*tune, "--name", "ours"]) == 2  # two models' runs make no one profile
    assert "pick one model's runs with --select" in capsys.readouterr().err
    assert main([*tune, "--select", "arch=mixtral", "--name", "ours"]) == 0
    assert "published, profile ours" in capsys.readouterr().out
    assert main(tune) == 0  # and a live config tuned on the whole store
    assert "published, live" in capsys.readouterr().out
    judged = {}
    for name, path in (("mixtral", MIXTRAL / "mixtral-lr-high-s0.jsonl.gz"), ("lab", lab[1])):
        run = _unlabelled(path, tmp_path / f"{name}.jsonl")
        assert main(["detect", "--store", str(store), "--replay", str(run), "--json"]) == 0
        judged[name] = json.loads(capsys.readouterr().out)["profile"]
    assert judged == {"mixtral": "ours", "lab": "live"}
