"""The remediation page's prose quotes the stored results (``benchmarks/results``): each figure
it types is computed here from them, so a re-run that moves one fails until the prose follows
(the tables themselves are generated: ``tests/test_docs.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.remediation import HEALTHY, needs_saving, saved

ROOT = Path(__file__).resolve().parents[1]
PAGE = " ".join((ROOT / "docs" / "remediation.md").read_text().split())  # one line


def result(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())["result"]


GPT, MIXTRAL = result("remediation"), result("remediation_mixtral")


def needing(res: dict, scenarios: tuple[str, ...]) -> set[tuple[str, int]]:
    """The (scenario, seed) pairs whose run with no action needed saving."""
    return {
        (r["scenario"], r["seed"])
        for r in res["runs"]
        if r["policy"] == "none" and r["scenario"] in scenarios and needs_saving(r, res["routes"])
    }


def judged(res: dict, policy: str, scenarios: tuple[str, ...]) -> list[dict]:
    """The runs of ``policy`` on the pairs that needed saving."""
    wanted = needing(res, scenarios)
    return [
        r for r in res["runs"] if r["policy"] == policy and (r["scenario"], r["seed"]) in wanted
    ]


def span(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def rescued(res: dict, runs: list[dict]) -> list[dict]:
    return [r for r in runs if saved(r, res["band"], res["routes"])]


DIVERGING = ("fa-lowprec", "lr-high")


def test_the_diverging_runs_saved_are_the_stored_counts() -> None:
    gpt, mix = judged(GPT, "foreshock", DIVERGING), judged(MIXTRAL, "foreshock", DIVERGING)
    n_gpt, n_mix = len(rescued(GPT, gpt)), len(rescued(MIXTRAL, mix))
    assert f"GPT-MoE {n_gpt} of the {len(gpt)} fa-lowprec and lr-high runs" in PAGE
    assert f"On Mixtral all {len(mix)} of seeds 36–39" in PAGE and n_mix == len(mix)
    total = len(gpt) + len(mix)
    assert f"Together {n_gpt + n_mix} of {total} ({100 * (n_gpt + n_mix) / total:.1f} %)" in PAGE


def test_the_loss_triggered_figures_are_the_stored_ones() -> None:
    left_on = judged(GPT, "loss-rollback", DIVERGING)
    assert f"saves none of the {len(left_on)} on GPT-MoE" in PAGE and not rescued(GPT, left_on)
    redone = [r["steps_redone"] for r in left_on if r["steps_redone"]]
    assert f"{min(redone)}–{max(redone)} steps re-done a run" in PAGE
    fixed = judged(GPT, "loss-rollback+fix", DIVERGING)
    kept = rescued(GPT, fixed)
    assert f"it saves {len(kept)} of {len(fixed)}" in PAGE
    missed = [r["final_loss"] for r in fixed if r not in kept]
    assert f"the four it misses end at {span(missed)} nats" in PAGE and len(missed) == 4


@pytest.mark.parametrize(
    ("res", "policy", "quoted"),
    [
        (GPT, "foreshock", "final token entropy {} nats against a floor of {:.3f}"),
        (GPT, "none", "{} with no action"),
        (MIXTRAL, "foreshock", "Mixtral 4 of 4 (seeds 36–39; {} against a floor of {:.3f})"),
        (MIXTRAL, "foreshock-hold", "Mixtral 0 of 4 ({})"),
    ],
)
def test_the_router_figures_are_the_stored_ones(res: dict, policy: str, quoted: str) -> None:
    runs = judged(res, policy, ("router-collapse",))
    entropies = [r["token_entropy"] for r in runs]
    assert quoted.format(span(entropies), res["routes"]["token_entropy"][0]) in PAGE


def test_the_router_rollbacks_and_false_actions_are_the_stored_ones() -> None:
    runs = judged(GPT, "foreshock", ("router-collapse",))
    runs += judged(MIXTRAL, "foreshock", ("router-collapse",))
    redone = [r["steps_redone"] for r in runs]
    assert f"at {min(redone)}–{max(redone)} steps re-done" in PAGE
    for res, name in ((GPT, "GPT-MoE"), (MIXTRAL, "Mixtral")):
        controls = [r for r in res["runs"] if r["scenario"] in HEALTHY]
        assert not any(r["actions"] or r["rollbacks"] for r in controls)
        assert f"{len(controls)} {name}" in PAGE
