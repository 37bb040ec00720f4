"""The envelope lead: exits and leads on hand-made runs whose answers are known."""

from pathlib import Path

from foreshock.lab.envelope import (
    envelope_exit,
    envelope_leads,
    exit_floor,
    healthy_envelope,
    scenario_envelope,
)
from foreshock.lab.recorded import RecordedRun

KEY = "attn.d2.entropy_mean@h.0.attn"
OTHER = "router.token_entropy_norm@h.0.mlp.gate"
EVERY = 25


def _run(values, divergence=None, onset=300, key=KEY, extra=None, name="r") -> RecordedRun:
    """One value per monitoring step (every 25 steps from 0); None is a null value."""
    records = []
    for i, value in enumerate(values):
        record = {key: value, **({} if extra is None else {OTHER: extra[i]})}
        records.append({"step": EVERY * i, "values": record})
    start = {"run_id": name, "labels": {"scenario": "x", "seed": 0, "onset": onset}}
    return RecordedRun(Path(name), start, records, {"divergence_step": divergence})


def _healthy(n_steps: int = 40) -> list[RecordedRun]:
    """Three healthy runs: the band is [0.30, 0.32] at every step."""
    return [_run([0.30 + 0.01 * i] * n_steps, onset=None, name=f"h{i}") for i in range(3)]


def test_band_is_min_and_max_of_healthy_runs() -> None:
    envelope = healthy_envelope(_healthy())
    lo, hi = envelope[KEY][500]
    assert abs(lo - 0.30) < 1e-12 and abs(hi - 0.32) < 1e-12
    assert set(envelope[KEY]) == {EVERY * i for i in range(40)}


def test_steps_with_fewer_than_two_healthy_values_have_no_band() -> None:
    short = _run([0.3] * 10, onset=None, name="short")
    long = _run([0.3] * 20, onset=None, name="long")
    nulls = _run([None] * 20, onset=None, name="nulls")
    envelope = healthy_envelope([short, long, nulls])
    assert max(envelope[KEY]) == EVERY * 9  # only `long` has values after step 225


def test_per_head_keys_are_left_out() -> None:
    runs = [_run([0.3] * 5, key="attn.d2.entropy@h.0.attn#h1", name=f"h{i}") for i in range(2)]
    assert healthy_envelope(runs) == {}


def test_exit_and_lead_when_a_run_leaves_and_stays_out() -> None:
    envelope = healthy_envelope(_healthy())
    values = [0.31] * 20 + [0.2] * 20  # out from step 500 on
    run = _run(values, divergence=800)
    assert envelope_exit(run, envelope, min_step=300) == {KEY: 500}
    assert envelope_leads(run, envelope) == {KEY: 300}


def test_a_run_that_goes_out_and_comes_back_exits_at_the_later_step() -> None:
    envelope = healthy_envelope(_healthy())
    values = [0.31] * 14 + [0.5] * 4 + [0.31] * 2 + [0.5] * 20  # out at 350, back at 450, out 500
    run = _run(values, divergence=900)
    assert envelope_exit(run, envelope, min_step=300) == {KEY: 500}
    assert envelope_leads(run, envelope) == {KEY: 400}


def test_only_steps_before_divergence_count() -> None:
    envelope = healthy_envelope(_healthy())
    values = [0.31] * 20 + [0.2] * 8 + [0.31] * 12  # back inside at 700, after divergence at 700
    assert envelope_leads(_run(values, divergence=700), envelope) == {KEY: 200}
    assert envelope_leads(_run(values, divergence=725), envelope) == {}  # inside at 700


def test_null_values_count_as_outside() -> None:
    envelope = healthy_envelope(_healthy())
    values = [0.31] * 20 + [0.2] * 4 + [None] * 16  # below from 500, then null
    assert envelope_leads(_run(values, divergence=800), envelope) == {KEY: 300}
    values = [0.31] * 24 + [None] * 16  # null from 600 on
    assert envelope_leads(_run(values, divergence=800), envelope) == {KEY: 200}


def test_exit_is_not_before_the_onset_nor_step_100() -> None:
    envelope = healthy_envelope(_healthy())
    always_out = [0.9] * 40
    assert envelope_leads(_run(always_out, divergence=800, onset=300), envelope) == {KEY: 500}
    assert envelope_leads(_run(always_out, divergence=800, onset=None), envelope) == {KEY: 700}
    assert exit_floor(_run(always_out, onset=50)) == 100


def test_healthy_runs_never_leave_their_own_envelope() -> None:
    healthy = _healthy()
    envelope = healthy_envelope(healthy)
    assert all(envelope_exit(run, envelope, min_step=100) == {} for run in healthy)


def test_no_divergence_no_lead() -> None:
    envelope = healthy_envelope(_healthy())
    run = _run([0.31] * 20 + [0.2] * 20, divergence=None)
    assert envelope_exit(run, envelope, min_step=300) == {KEY: 500}  # out to the run's end
    assert envelope_leads(run, envelope) == {}


def test_scenario_summary_per_family() -> None:
    inside = [0.5] * 40
    healthy = [
        _run([0.30 + 0.01 * i] * 40, onset=None, extra=inside, name=f"h{i}") for i in range(3)
    ]
    envelope = healthy_envelope(healthy)
    out_at = [500, 600, 700]  # KEY's exit per run; OTHER's exit is 200 steps later in each
    runs = [
        _run(
            [0.31] * (s // EVERY) + [0.2] * (40 - s // EVERY),
            divergence=900,
            extra=[0.5] * (s // EVERY + 8) + [0.9] * (32 - s // EVERY),
            name=f"f{s}",
        )
        for s in out_at
    ]
    runs.append(_run([0.2] * 40, divergence=None, extra=[0.9] * 40, name="not-diverged"))
    summary = scenario_envelope(runs, envelope, family_of=lambda key: "fam")
    fam = summary["fam"]
    assert fam["per_series"][KEY] == {"median": 300, "n": 3}  # leads 400, 300, 200
    assert fam["per_series"][OTHER] == {"median": 150, "n": 2}  # 200, 100; 3rd exits at 900
    assert (fam["best_series"], fam["best_series_median"]) == (KEY, 300)
    assert (fam["family_best_median"], fam["runs"], fam["diverged"]) == (300, 3, 3)
    split = scenario_envelope(runs, envelope, family_of=lambda k: None if k == KEY else "router")
    assert set(split) == {"router"} and split["router"]["best_series"] == OTHER
