"""Generate ``benchmarks/README.md`` from measured results — never typed by hand.

``python -m benchmarks.readme --run NAME [NAME ...]`` (or ``--run all``) runs each benchmark's
command, keeps its closing JSON line in ``benchmarks/results/<name>.json`` together with the
command, the time and the machine, then rewrites the README from every stored result, and the
generated parts of the docs (``docs/detectors.md``'s detection table, ``docs/benchmarks.md``'s
figures, ``docs/lab.md``'s lab table). ``python -m benchmarks.readme`` alone only rewrites them.
Each row names the command that produced it.

A benchmark's rows are its module's to render: ``benchmarks.<module>.figures(result)``, a list of
(figure, value), imported only when that benchmark's table is rendered. The docs' detection and
lab tables are :func:`benchmarks.detection_table.detection_summary` and
:func:`benchmarks.lab_table.lab_summary`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"

# The sixth clean batch started training after this commit froze its rules (lab/runs/README.md),
# and each profile's part of it is judged on its own: result name suffix -> --runs arguments.
CLEAN_CHECK_6 = "2026-12-02T00:27:19"
CLEAN_CHECK_6_PROFILES = {
    "gpt-moe": [],
    "mixtral": ["--runs", "lab/runs/mixtral"],
    "capacity": ["--runs", "lab/runs/gpt-moe+capacity-1"],
}

# the remediation tables' seeds and policies: the stored runs merged, the missing ones trained
REMEDIATION_GPT_MOE = ["--seeds", "33-39", "--healthy", "33-39"]  # every policy

# result name -> (the arguments of its command, the module that runs it and renders its rows
# with ``figures(result)``, its title): ``python -m benchmarks.<module> <arguments>``.
BENCHMARKS: dict[str, tuple[list[str], str, str]] = {
    "spectra": (["--quick"], "spectra", "Compressed-core speedup (Δ2 spectra)"),
    "overhead": ([], "overhead", "Monitor overhead per training step"),
    "randomized_spectra": (
        [],
        "randomized_spectra",
        "Randomized spectra (torch.svd_lowrank) against the exact Gram route at d = 768-4096",
    ),
    "overhead_in_step": (
        ["--spectra-in-step"],
        "overhead",
        "Monitor overhead per training step, attention spectra in the step (the lab's setting)",
    ),
    "overhead_gpt2-124m": (
        ["--model", "gpt2-124m", "--quick"],
        "overhead",
        "Monitor overhead per training step, GPT-2 small (124M)",
    ),
    "overhead_mixtral-tiny": (
        ["--model", "mixtral-tiny"],
        "overhead",
        "Monitor overhead per training step, tiny Mixtral",
    ),
    "overhead_sharded": (
        ["--sharded"],
        "overhead",
        "Monitor overhead per rank under FSDP2 (gloo, CPU) against the single process",
    ),
    "zero_shot": (
        [],
        "zero_shot",
        "Zero-shot profile, each architecture held out of its calibration",
    ),
    "flapping": (
        [],
        "flapping",
        "Warnings that don't flap: the release chosen on calibration runs, judged held out",
    ),
    "profile_size": (
        [],
        "profile_size",
        "A user's profile from N healthy runs, against the zero-shot profile",
    ),
    "sharded_equality": (
        [],
        "sharded_equality",
        "Sharded training: the one global record against the unsharded run",
    ),
    "max_logit": ([], "max_logit", "max_logit on transformers models: cost"),
    "transport": ([], "transport", "Transport: producers → embedded broker → one consumer"),
    "transport_unpaced": (
        ["--rate", "0", "--messages", "100"],
        "transport",
        "Transport, producers unpaced",
    ),
    "detectors": (
        ["--copies", "8"],
        "detectors",
        "Detector workers: metric values per second, Kafka in → warnings out",
    ),
    "detection_table": (
        [],
        "detection_table",
        "Lead time and false warnings (held-out lab runs)",
    ),
    "detection_table_mixtral": (
        ["--runs", "lab/runs/mixtral"],
        "detection_table",
        "Lead time and false warnings, transformers Mixtral (held-out lab runs)",
    ),
    "detection_table_capacity": (
        ["--runs", "lab/runs/gpt-moe+capacity-1"],
        "detection_table",
        "Lead time and false warnings, GPT-MoE with expert capacity 1.0 (held-out lab runs)",
    ),
    **{
        f"clean_check_6_{profile}": (
            [*runs, "--trained-after", CLEAN_CHECK_6],
            "detection_table",
            f"Sixth clean batch, {profile}: only the runs trained after the rules were frozen",
        )
        for profile, runs in CLEAN_CHECK_6_PROFILES.items()
    },
    "router_collapse": ([], "router_collapse", "What a router collapse costs"),
    "band_frontier": (
        [],
        "band_frontier",
        "Band rule knobs: earlier warnings against false ones",
    ),
    "false_alarms": (
        [],
        "false_alarms",
        "Calibration: false warnings on unseen healthy runs (cross-validated)",
    ),
    "lab_table": (
        [],
        "lab_table",
        "The lab's shipped runs: which family leaves the healthy band",
    ),
    "lab_reproducibility": (
        [],
        "lab_reproducibility",
        "Lab runs: do the shipped recordings retrain bit for bit here?",
    ),
    "storage": ([], "storage", "History: ingest and queries"),
    "dashboard": ([], "dashboard", "Dashboard render time"),
    "fleet": ([], "fleet", "Whole pipeline: throughput, latency, backlog"),
    "fleet_saturation": (
        ["--runs", "1000", "--workers", "1,2", "--rate", "3"],
        "fleet",
        "Whole pipeline past its knee (3 records/s per run)",
    ),
    "fleet_10000": (
        ["--runs", "10000", "--workers", "2", "--rate", "0.1", "--records", "32"],
        "fleet",
        "Whole pipeline at 10,000 live runs, a record from each every 10 s",
    ),
    "soak": ([], "soak", "Soak: memory and lag under a steady fleet at half saturation"),
    "unreachable": ([], "unreachable", "Training with the broker unreachable, records later"),
    "reliability": ([], "reliability", "Faults under a live fleet: recovery, nothing lost"),
    "remediation": (
        [*REMEDIATION_GPT_MOE, "--merge", "benchmarks/results/remediation.json"],
        "remediation",
        "Remediation: the default policy against no action and loss-triggered rollback",
    ),
    "remediation_mixtral": (
        [
            *("--arch", "mixtral", "--seeds", "36-39", "--healthy", "33-39,64-67"),
            *("--policies", "none,foreshock,foreshock-hold,stop"),
            *("--merge", "benchmarks/results/remediation_mixtral.json"),
        ],
        "remediation",
        "Remediation on a transformers Mixtral: the default policy against the baselines",
    ),
    "recipes": (
        [],
        "recipes",
        "Warnings under real recipes (warm-up, decay, 0.5-2x learning rates, 2k-10k steps)",
    ),
    "remediation_anchors": (
        [
            "--seeds",
            "33-34",
            "--scenarios",
            "fa-lowprec,lr-high",
            "--policies",
            "none,foreshock,foreshock-hold-at-warning,zclip,clip-1.0,spam",
        ],
        "remediation",
        "Remediation against the always-on anchors (ZClip, clipping at 1.0, SPAM), lab GPT-MoE",
    ),
    "hf_remediation": (
        ["--seeds", "2"],
        "hf_remediation",
        "Remediation through the HF Trainer (WSD), no labels, on architectures no profile saw",
    ),
    "unasked_actions": (
        [],
        "unasked_actions",
        "Actions unasked on the zero-shot profile, under bounds on the rules' false-alarm rates",
    ),
    "action_cost": (
        [],
        "action_cost",
        "What one false action costs a healthy run (HF Trainer, cosine, tiny Mixtral)",
    ),
    "fleet_profiles": (
        [],
        "fleet_profiles",
        "Profiles the fleet builds itself: recorded runs in fleet order, policy auto",
    ),
    "snapshot_cost": (
        ["--quick"],
        "snapshot_cost",
        "What a rollback costs: snapshot memory and time",
    ),
}


def run(name: str) -> None:
    args, module, _ = BENCHMARKS[name]
    command = [sys.executable, "-m", f"benchmarks.{module}", *args]
    print(f"running: python -m benchmarks.{module} {' '.join(args)}", flush=True)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    save(name, json.loads(out.strip().splitlines()[-1]), args)


def save(
    name: str,
    result: dict[str, Any],
    args: list[str],
    when: float | None = None,
    module: str | None = None,
) -> None:
    """Keep ``result`` as ``results/<name>.json`` with its command (``module``: by default the
    registry's for ``name``, else ``name``), the time and the machine."""
    RESULTS.mkdir(exist_ok=True)
    module = module or (BENCHMARKS[name][1] if name in BENCHMARKS else name)
    record = {
        "command": " ".join(["python -m", f"benchmarks.{module}", *args]).strip(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "result": result,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))


def render() -> str:
    """``benchmarks/README.md``: every benchmark's figures."""
    lines = [
        "# Benchmarks: the numbers",
        "",
        "Generated by `python -m benchmarks.readme` from `benchmarks/results/*.json` — do",
        "not edit by hand. Rerun a benchmark and regenerate with",
        "`python -m benchmarks.readme --run NAME`.",
        "",
    ]
    return "\n".join(lines) + "\n" + results_section("##")


def results_section(level: str = "###") -> str:
    """One section per benchmark, headed at ``level``: the body of ``benchmarks/README.md``
    and of the docs' benchmarks page (between :data:`RESULTS_MARKERS`)."""
    lines: list[str] = []
    for name, (_, _, title) in BENCHMARKS.items():
        lines += [f"{level} {title}", "", figure_table(name), ""]
    return "\n".join(lines)


def figure_table(name: str) -> str:
    """One benchmark's figures as a table, with its command and when it was measured."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return f"Not measured yet: `python -m benchmarks.readme --run {name}`."
    record = json.loads(path.read_text())
    figures = importlib.import_module(f"benchmarks.{BENCHMARKS[name][1]}").figures
    lines = ["| figure | value | command |", "|---|---|---|"]
    lines += [
        f"| {figure} | {value} | `{record['command']}` |"
        for figure, value in figures(record["result"])
    ]
    lines += ["", f"Measured {record['measured_at']} on {record['machine']}."]
    return "\n".join(lines)


# Any docs page may show one benchmark's figures between these two lines (NAME: its result).
FIGURES = re.compile(r"<!-- figures: (?P<name>[\w-]+) -->\n.*?<!-- /figures -->", re.S)


def with_figure_tables(text: str) -> str:
    """``text`` with every ``<!-- figures: NAME -->`` … ``<!-- /figures -->`` regenerated."""
    return FIGURES.sub(
        lambda m: f"<!-- figures: {m['name']} -->\n{figure_table(m['name'])}\n<!-- /figures -->",
        text,
    )


DETECTION_MARKERS = ("<!-- detection-table -->", "<!-- /detection-table -->")
RESULTS_MARKERS = ("<!-- benchmark-results -->", "<!-- /benchmark-results -->")
DOCS = HERE.parent / "docs"
DETECTION_PAGE = DOCS / "detectors.md"  # detection_table.detection_summary(), between these
LAB_MARKERS = ("<!-- lab-table -->", "<!-- /lab-table -->")
LAB_PAGE = DOCS / "lab.md"  # lab_table.lab_summary(), between LAB_MARKERS
RESULTS_PAGE = DOCS / "benchmarks.md"  # results_section(), between RESULTS_MARKERS


def with_section(text: str, markers: tuple[str, str], body: str) -> str:
    """``text`` with what lies between ``markers`` replaced by ``body``."""
    start, end = markers
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def between(text: str, markers: tuple[str, str]) -> str:
    """What lies between ``markers`` in ``text``, stripped."""
    start, end = markers
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def write_docs() -> None:
    """Regenerate the generated parts of ``benchmarks/README.md`` and the docs pages."""
    from .detection_table import detection_summary
    from .lab_table import lab_summary

    (HERE / "README.md").write_text(render())
    detection = with_section(DETECTION_PAGE.read_text(), DETECTION_MARKERS, detection_summary())
    DETECTION_PAGE.write_text(detection)
    LAB_PAGE.write_text(with_section(LAB_PAGE.read_text(), LAB_MARKERS, lab_summary()))
    for page in DOCS.glob("*.md"):
        page.write_text(with_figure_tables(page.read_text()))
    RESULTS_PAGE.write_text(
        with_section(RESULTS_PAGE.read_text(), RESULTS_MARKERS, results_section())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", nargs="*", default=[], help="benchmarks to (re)run, or all")
    parser.add_argument(
        "--from-output",
        nargs=2,
        metavar=("NAME", "FILE"),
        help="store the JSON last line of a saved output instead",
    )
    args = parser.parse_args()
    names = list(BENCHMARKS) if args.run == ["all"] else args.run
    for name in names:
        run(name)
    if args.from_output:
        name, file = args.from_output
        text = Path(file).read_text().strip().splitlines()[-1]
        save(name, json.loads(text), BENCHMARKS[name][0], when=Path(file).stat().st_mtime)
    write_docs()
    print(f"wrote {HERE / 'README.md'}, {DETECTION_PAGE}, {LAB_PAGE} and {RESULTS_PAGE}")


if __name__ == "__main__":
    main()
