"""How ``benchmarks.remediation`` judges a run saved: the rules its docs table is built on."""

from __future__ import annotations

import pytest

from benchmarks.remediation import _subset, needs_saving, saved, summarise

BAND = (1.50, 1.60)
ROUTES = {"token_entropy": (1.10, 1.30), "dropped": (0.0, 0.05)}


def run(scenario: str, seed: int, policy: str, **values) -> dict:
    base = {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "status": "finished",
        "divergence_step": None,
        "final_loss": 1.55,
        "last_step": 1599,
        "actions": [],
        "rollbacks": 0,
        "steps_redone": 0,
        "token_entropy": 1.2,
        "dropped": 0.0,
    }
    return base | values


def test_only_runs_that_diverge_with_no_action_need_saving() -> None:
    assert needs_saving(run("lr-high", 1, "none", divergence_step=900), ROUTES)
    assert not needs_saving(run("lr-high", 1, "none"), ROUTES)
    assert not needs_saving(run("healthy", 1, "none", divergence_step=900), ROUTES)
    # router-collapse does not diverge: its routing ending below the healthy floor is the harm
    assert needs_saving(run("router-collapse", 1, "none", token_entropy=0.9), ROUTES)
    assert not needs_saving(run("router-collapse", 1, "none", token_entropy=1.4), ROUTES)


def test_saved_means_the_horizon_finished_inside_the_healthy_band() -> None:
    assert saved(run("fa-lowprec", 1, "foreshock"), BAND, ROUTES)
    assert not saved(run("fa-lowprec", 1, "foreshock", final_loss=1.6001), BAND, ROUTES)
    assert not saved(run("fa-lowprec", 1, "stop", status="stopped"), BAND, ROUTES)
    assert not saved(run("router-collapse", 1, "foreshock", dropped=0.2), BAND, ROUTES)


def test_the_table_judges_a_policy_only_on_the_seeds_that_needed_saving() -> None:
    results = [
        run("lr-high", 1, "none", divergence_step=800, final_loss=None, status="diverged"),
        run("lr-high", 2, "none"),  # did not diverge: not judged
        run("lr-high", 1, "foreshock", actions=["hold-lr"]),
        run("lr-high", 2, "foreshock", final_loss=1.7),
        run("healthy", 1, "foreshock", actions=["hold-lr"]),
    ]
    rows = {(r["scenario"], r["policy"]): r for r in summarise(results, BAND, ROUTES)}
    assert rows["lr-high", "foreshock"]["saved"] == "1/1"
    assert rows["lr-high", "none"]["saved"] == "0/1"
    assert rows["healthy", "foreshock"]["runs with an action"] == 1
    assert rows["healthy", "foreshock"]["saved"] == "-"


def test_a_misspelled_policy_or_scenario_is_refused_by_name() -> None:
    assert _subset("none, foreshock", ("none", "foreshock", "stop")) == ("none", "foreshock")
    with pytest.raises(SystemExit, match="forshock"):
        _subset("forshock", ("none", "foreshock"))


def test_a_merged_result_keeps_only_runs_todays_profiles_and_policy_would_repeat(
    tmp_path,
) -> None:
    import json

    from benchmarks.remediation import merged_runs, policy_stamp, profile_versions

    runs = [run("lr-high", 1, "none"), run("lr-high", 1, "foreshock"), run("lr-high", 1, "stop")]
    stale = {"arch": "mixtral", "profiles": {"mixtral": "0" * 12}, "runs": runs}
    (tmp_path / "stale.json").write_text(json.dumps({"result": stale}))
    assert [r["policy"] for r in merged_runs(tmp_path / "stale.json", "mixtral")] == ["none"]
    old_policy = {**stale, "profiles": profile_versions("mixtral"), "policy": {"rollback": False}}
    (tmp_path / "old_policy.json").write_text(json.dumps(old_policy))
    assert [r["policy"] for r in merged_runs(tmp_path / "old_policy.json", "mixtral")] == ["none"]
    current = {**old_policy, "policy": policy_stamp()}
    (tmp_path / "current.json").write_text(json.dumps(current))
    assert len(merged_runs(tmp_path / "current.json", "mixtral")) == 3
    with pytest.raises(SystemExit, match="not gpt-moe"):
        merged_runs(tmp_path / "current.json", "gpt-moe")


def test_a_seed_with_a_job_left_to_train_is_trained_anew_under_every_policy() -> None:
    from benchmarks.remediation import reusable

    merged = [run("lr-high", 1, "none"), run("lr-high", 2, "none"), run("lr-high", 2, "foreshock")]
    jobs = [("lr-high", 1, "none"), ("lr-high", 1, "foreshock"), ("lr-high", 2, "foreshock")]
    assert set(reusable(jobs, merged)) == {("lr-high", 2, "none"), ("lr-high", 2, "foreshock")}
