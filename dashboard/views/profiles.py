"""Profiles: each model in the store, its runs, the profile that judges it and where that
profile came from (calibrated from which runs, when, by whom), its stated and measured
false-warning rates, and the rules that can fire on it."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import streamlit as st

from foreshock.dashboard import data
from foreshock.dashboard.text import md_code, md_text
from foreshock.table import format_table

WHAT_FIRES = {  # what a rule's h is measured in (foreshock.detectors.reach says it per run)
    "band": "band widths outside the healthy band at the same step",
    "level": "nats of log ratio to the run's warm-up level",
    "cusum": "warm-up σ of drift beyond k·σ a record",
}


def main() -> None:
    st.title("Profiles")
    found = data.profiles()
    st.caption(
        f"policy: {md_text(found['policy'])} — a model with 10 healthy runs and no profile gets "
        f"one {'published at once' if found['policy'] == 'auto' else 'to approve'} "
        f"({md_code('foreshock profiles policy auto|approve|off')})"
    )
    if found["pending"]:
        names = ", ".join(found["pending"])
        st.warning(
            f"awaiting approval: {md_text(names)} — "
            f"{md_code('foreshock profiles approve NAME')} publishes one"
        )
    if not found["models"]:
        st.info("No run with an architecture signature in the store yet.")
    for model in found["models"]:
        _model(model)


def _model(model: dict) -> None:
    st.subheader(md_text(model["model"]))
    origin = "shipped" if model["shipped"] else "built from this store"
    if model["profile"] in ("zero-shot", "live"):
        origin = "no profile of this model yet"
    st.markdown(
        f"profile in force: {md_code(model['profile'])} ({origin}) · runs: {len(model['runs'])}"
        f" · healthy: {model['healthy']} · faults: {model['faults']}"
    )
    lineage = model["lineage"]
    if lineage is not None:
        when = datetime.fromtimestamp(lineage["time"], UTC).strftime("%Y-%m-%d %H:%M UTC")
        st.markdown(
            f"published {md_text(when)} by {md_code(lineage['by'])} · version "
            f"{md_code(lineage['version'])} · calibrated from {len(lineage['runs'])} runs: "
            f"{md_text(', '.join(lineage['runs']))}"
        )
    if model["switched"]:
        st.markdown(
            f"live runs switched to it while training: {len(model['switched'])} "
            f"({md_text(', '.join(model['switched']))})"
        )
    st.code(format_table(["family", "stated", "measured"], _rates(model)), language="text")
    st.code(format_table(["rule", "family", "kind", "h", "fires when"], _rules(model)), "text")
    with st.expander(f"runs of {model['model']}"):
        st.code(format_table(["run", "counts as"], model["runs"]), language="text")


def _rates(model: dict) -> list[list[object]]:
    """Per family, the stated false-warning rate (the conformal bound) and, for a profile
    built here, the measured one (leave-one-out on its healthy runs)."""
    measured = (model["lineage"] or {}).get("judged", {}).get("measured_false_warning_rate", {})
    families = sorted(set(model["stated"]) | set(measured))
    return [[f, model["stated"].get(f, "-"), measured.get(f, "-")] for f in families]


def _rules(model: dict) -> list[list[object]]:
    rows = []
    for metric, family, kind, h in model["rules"]:
        fires = "cannot fire (no threshold)"
        if h is not None and math.isfinite(h):
            fires = f"beyond {h:.3g} {WHAT_FIRES.get(kind, '')}".rstrip()
        rows.append([metric, family, kind, "-" if h is None else h, fires])
    return rows


main()
