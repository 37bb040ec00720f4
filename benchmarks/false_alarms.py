"""False warnings on healthy runs the thresholds never saw: the calibration method, cross-validated.

The shipped healthy lab runs are split into ``--folds`` parts (shuffled, ``--repeats`` times);
each part in turn is held out while the others calibrate (:mod:`foreshock.detectors.calibrate`:
the largest healthy maximum plus a leave-one-out margin, at least ``least``). A held-out run
whose largest statistic of any metric of a family crosses that metric's threshold would have
raised a false warning of that family. Per least margin: the share of held-out runs with a
false warning, per mechanism family — the number the false-alarm budget (≤ 1 per 100 healthy
runs per family) is about. Only healthy runs are read: nothing here looks at a faulty run.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from foreshock.detectors.calibrate import MARGINS, calibrate, leave_one_out_margin, uncalibrated
from foreshock.detectors.config import MECHANISMS, DetectorConfig
from foreshock.detectors.replay import RunReport, replay
from foreshock.lab.recorded import shipped_runs

from ._table import emit_json, format_table

LEAST = (0.1, 0.25, 0.5, 1.0)
GRID = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0)  # the margins leave-one-out may choose from


def false_warnings(
    healthy: list[RunReport], config: DetectorConfig, least: float, folds: int, repeats: int
) -> dict[str, int]:
    """Held-out runs with a false warning per family, over ``repeats`` shuffled k-fold splits."""
    margins = tuple(m for m in GRID if m >= least)
    counts = dict.fromkeys(MECHANISMS, 0)
    for repeat in range(repeats):
        order = list(range(len(healthy)))
        random.Random(repeat).shuffle(order)
        for fold in range(folds):
            held = set(order[fold::folds])
            fit = [healthy[i] for i in order if i not in held]
            calibrated = calibrate(
                fit, config, margin=leave_one_out_margin(fit, config, margins=margins)
            )
            for i in held:
                for family in MECHANISMS:
                    counts[family] += any(
                        healthy[i].peaks.get(r.metric, 0.0) > calibrated.thresholds[r.metric]
                        for r in config.rules
                        if r.family == family
                    )
    return counts


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per least margin (the shipped one
    marked): the share of unseen healthy runs with a false warning, per family."""
    rows = []
    for least, rates in result["false_warning_rate"].items():
        shipped = " (shipped)" if float(least) == result["shipped_least_margin"] else ""
        rows.append(
            (
                f"unseen healthy runs with a false warning, least margin "
                f"{float(least):.0%}{shipped}",
                ", ".join(f"{f} {v:.1%}" for f, v in rates.items()),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="one repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    config = DetectorConfig()
    paths = [p for p in shipped_runs() if p.name.startswith("healthy-s")]
    healthy = replay(paths, uncalibrated(config))
    trials = len(healthy) * repeats
    rows, figures = [], {}
    for least in LEAST:
        counts = false_warnings(healthy, config, least, args.folds, repeats)
        rates = {f: counts[f] / trials for f in MECHANISMS}
        figures[str(least)] = rates
        rows.append(
            [f"{least:.0%}", *(f"{counts[f]}/{trials} = {rates[f]:.1%}" for f in MECHANISMS)]
        )
    print(
        f"{len(healthy)} healthy runs, {args.folds}-fold × {repeats}; calibrated on "
        f"{len(healthy) - len(healthy) // args.folds} or so per fold"
    )
    print(format_table(["least margin", *(f"false warnings: {f}" for f in MECHANISMS)], rows))
    emit_json(
        {
            "healthy_runs": len(healthy),
            "folds": args.folds,
            "repeats": repeats,
            "false_warning_rate": figures,
            "shipped_least_margin": min(MARGINS),
        }
    )


if __name__ == "__main__":
    main()
