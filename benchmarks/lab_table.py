"""The lab's raw lead times: when each monitor family leaves the healthy band, per scenario.

No detector is involved: this measures what the monitors carry before any detector is tuned.

Band rule: see :mod:`foreshock.lab.bands` (leave-one-out healthy min/max band, widened by its
width on each side, left for 5 checks in a row by default). Raw lead time = divergence step − exit
step of the family (diverged runs, exit before divergence).

Exits are counted from the fault's onset: an exit before it (or any exit of a healthy run,
scored against the other healthy runs) is a false exit, reported apart. Orthogonality matrix:
per scenario and family, the share of runs whose family exits at or after the onset and before
the divergence (or the end of the run): which family moves under which fault.

``--generate DIR`` trains the runs first (``--seeds``, ``--steps``; two processes at a time):
long. Without it the table reads recorded runs (default: the ones shipped in lab/runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from foreshock.lab.bands import FAMILIES, family_exits
from foreshock.lab.recorded import RecordedRun, load_run, seed_spans, shipped_runs
from foreshock.lab.scenarios import SCENARIOS

from ._table import emit_json, format_table


def _fmt_range(values: list[int]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} [{min(values)}–{max(values)}]"


def _end_of(run: RecordedRun) -> int | None:
    if run.divergence_step is not None:
        return run.divergence_step
    return None if run.end is None else run.end.get("last_step", 0) + 1


def _family_figures(
    group: list[RecordedRun],
    healthy: list[RecordedRun],
    min_step: int,
    consecutive: int,
    pad: float,
) -> dict[str, dict]:
    """Per family: post-onset exits, raw leads, share of runs moved, false (pre-onset) exits."""
    out = {
        f: {"exits": [], "leads": [], "moved": 0, "false_exits": 0, "directions": [], "where": []}
        for f in FAMILIES
    }
    for run in group:
        is_healthy = run.labels.get("scenario") == "healthy"
        onset = 0 if is_healthy else run.labels.get("onset") or 0
        anywhere = family_exits(run, healthy, min_step, consecutive, pad)
        after = family_exits(run, healthy, max(min_step, onset), consecutive, pad)
        end = _end_of(run)
        for family, fig in out.items():
            first, exit_ = anywhere[family], after[family]
            if first is not None and (is_healthy or first.step < onset):
                fig["false_exits"] += 1
            if is_healthy or exit_ is None:
                continue
            post = exit_.step
            fig["exits"].append(post)
            fig["directions"].append(exit_.direction)
            fig["where"].append(exit_.key)
            if end is None or post < end:
                fig["moved"] += 1
            if run.divergence_step is not None and post < run.divergence_step:
                fig["leads"].append(run.divergence_step - post)
    for fig in out.values():
        fig["moved_share"] = fig.pop("moved") / len(group)
    return out


def analyse(runs: list[RecordedRun], min_step: int, consecutive: int, pad: float) -> dict:
    healthy = [r for r in runs if r.labels.get("scenario") == "healthy"]
    by_scenario: dict[str, list[RecordedRun]] = defaultdict(list)
    for run in runs:
        by_scenario[run.labels.get("scenario", "?")].append(run)
    figures: dict[str, dict] = {}
    for scenario in sorted(by_scenario, key=_scenario_rank):
        group = by_scenario[scenario]
        divs = [r.divergence_step for r in group if r.divergence_step is not None]
        figures[scenario] = {
            "runs": len(group),
            "diverged": len(divs),
            "divergence": divs,
            "cpu_seconds": [r.end.get("cpu_seconds") for r in group if r.end],
            "families": _family_figures(group, healthy, min_step, consecutive, pad),
        }
    return figures


def _scenario_rank(scenario: str) -> tuple[int, str]:
    known = scenario in SCENARIOS
    return (SCENARIOS.index(scenario) if known else len(SCENARIOS), scenario)


def print_tables(figures: dict) -> None:
    rows = []
    for scenario, entry in figures.items():
        row = [scenario, f"{entry['diverged']}/{entry['runs']}", _fmt_range(entry["divergence"])]
        for family in FAMILIES:
            fam = entry["families"][family]
            row.append(_fmt_range(fam["exits"]))
        rows.append(row)
    print("First band exit per family at or after the onset, median [range] over runs (steps):")
    print(format_table(["scenario", "diverged", "divergence step", *FAMILIES], rows))
    print()
    rows = []
    for scenario, entry in figures.items():
        row = [scenario]
        for family in FAMILIES:
            fam = entry["families"][family]
            row.append(f"{_fmt_range(fam['leads'])}")
        rows.append(row)
    print("Raw lead time = divergence − first exit, median [range] (diverged runs only):")
    print(format_table(["scenario", *FAMILIES], rows))
    print()
    rows = [[s, *(_moved_cell(e["families"][f]) for f in FAMILIES)] for s, e in figures.items()]
    print("Orthogonality: share of runs whose family exits after onset, before divergence/end;")
    print("(n) runs whose family exited before the onset or, for healthy runs, at all (false")
    print("exits); arrows: direction of the post-onset exits (v below, ^ above the band):")
    print(format_table(["scenario", *FAMILIES], rows))


def _moved_cell(fig: dict) -> str:
    arrows = "".join(
        sorted({"below": "v", "above": "^", "null": "x"}[d] for d in fig["directions"])
    )
    return f"{fig['moved_share']:.2f} ({fig['false_exits']}) {arrows}".rstrip()


def _seed_list(text: str) -> list[int]:
    """``N`` (seeds 0…N−1) or ``FIRST-LAST[,FIRST-LAST...]`` (inclusive)."""
    if text.isdigit():
        return list(range(int(text)))
    return sorted(seed_spans(text))


def generate(
    directory: Path,
    seeds: list[int],
    steps: int,
    scenarios: list[str],
    jobs: int,
    arch: str = "gpt-moe",
) -> None:
    """Train the runs with ``foreshock lab run`` in parallel subprocesses; gzip each file."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = "" if arch == "gpt-moe" else f"{arch}-"
    commands = []
    for scenario in scenarios:
        for seed in seeds:
            out = directory / f"{prefix}{scenario}-s{seed}.jsonl"
            if (directory / f"{out.name}.gz").exists():
                continue
            commands.append(
                [
                    sys.executable,
                    "-m",
                    "foreshock.app.cli",
                    "lab",
                    "run",
                    "--quiet",
                    "--arch",
                    arch,
                    "--scenario",
                    scenario,
                    "--seed",
                    str(seed),
                    "--steps",
                    str(steps),
                    "--out",
                    str(out),
                ]
            )

    def run(command: list[str]) -> None:
        subprocess.run(command, check=True)
        out = Path(command[-1])
        subprocess.run(["gzip", "-9", "-f", str(out)], check=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(run, commands))


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the runs read with the median CPU per run,
    and the band rule (pad × width, checks in a row). The per-scenario table is
    :func:`lab_summary`'s."""
    return [
        (
            "runs read",
            f"{result['runs']} (CPU per run: median {result['cpu_seconds_median']:.0f} s)",
        ),
        (
            "band",
            f"pad {result['band']['pad']} × width, {result['band']['consecutive']} checks in a row",
        ),
    ]


RESULTS = Path(__file__).parent / "results"  # where benchmarks.readme stores each result
LAB_FAMILIES = {  # lab_table's family -> its column in the docs' lab table
    "d2_entropy": "Δ2 entropy",
    "dw_entropy": "ΔW entropy",
    "router_entropy": "router entropy",
    "load_entropy": "load entropy",
    "epsilon": "ε",
    "loss": "loss",
    "grad_norm": "grad norm",
}
ARROWS = {"below": "↓", "above": "↑", "null": "∅"}  # an exit's direction in the docs' lab table


def lab_summary() -> str:
    """The docs' lab table (``docs/lab.md``): per scenario, the divergence step and each
    family's first exit from the healthy band (median step, direction, runs with an exit,
    median raw lead), from the stored lab_table result."""
    r = json.loads((RESULTS / "lab_table.json").read_text())["result"]
    head = ["scenario", "diverged", "divergence step", *LAB_FAMILIES.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in r["scenarios"].items():
        div = s["divergence"]
        when = f"{statistics.median(div):g} [{min(div)}–{max(div)}]" if div else "–"
        cells = [f"{name} ({s['runs']})", f"{s['diverged']}/{s['runs']}", when]
        cells += [_lab_cell(s["families"][f], s["runs"]) for f in LAB_FAMILIES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _lab_cell(fig: dict, runs: int) -> str:
    """One family's cell of :func:`lab_summary`: median exit step, the commonest direction,
    runs with an exit, median raw lead."""
    if not fig["exits"]:
        return "–"
    arrow = ARROWS[max(set(fig["directions"]), key=fig["directions"].count)]
    lead = f"; lead {statistics.median(fig['leads']):g}" if fig["leads"] else ""
    return f"{statistics.median(fig['exits']):g} {arrow} ({len(fig['exits'])}/{runs}{lead})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="at most 3 runs per scenario")
    parser.add_argument("--runs", type=Path, help="directory of recorded runs")
    parser.add_argument("--generate", type=Path, help="train runs into this directory first")
    parser.add_argument("--seeds", default="5", help="N (seeds 0..N-1) or FIRST-LAST[,...]")
    parser.add_argument("--arch", default="gpt-moe", choices=("gpt-moe", "mixtral"))
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--min-step", type=int, default=100)
    parser.add_argument("--consecutive", type=int, default=5)
    parser.add_argument("--pad", type=float, default=1.0, help="band widening, × its width")
    args = parser.parse_args()
    directory = args.generate or args.runs
    if args.generate:
        generate(
            args.generate,
            _seed_list(args.seeds),
            args.steps,
            args.scenarios.split(","),
            args.jobs,
            args.arch,
        )
    runs = [load_run(p) for p in shipped_runs(directory)]
    unfinished = [r.run_id for r in runs if r.end is None]
    if unfinished:
        print(f"skipping runs without an end record: {unfinished}", file=sys.stderr)
    runs = [r for r in runs if r.end is not None]
    if args.quick:
        kept: dict[str, int] = defaultdict(int)
        quick = []
        for run in runs:
            scenario = run.labels.get("scenario")
            if kept[scenario] < 3:
                kept[scenario] += 1
                quick.append(run)
        runs = quick
    if not runs:
        raise SystemExit("no recorded runs found; use --generate DIR")
    figures = analyse(runs, args.min_step, args.consecutive, args.pad)
    print_tables(figures)
    cpu = [r.end["cpu_seconds"] for r in runs if r.end and "cpu_seconds" in r.end]
    print(
        f"\nruns: {len(runs)}; CPU per run: median {statistics.median(cpu):.0f} s "
        f"[{min(cpu):.0f}–{max(cpu):.0f}]"
        if cpu
        else ""
    )
    emit_json(
        {
            "runs": len(runs),
            "cpu_seconds_median": statistics.median(cpu) if cpu else None,
            "band": {"pad": args.pad, "consecutive": args.consecutive, "min_step": args.min_step},
            "scenarios": figures,
        }
    )


if __name__ == "__main__":
    main()
