"""Run: the loss with its divergence, the mechanism monitors with warning markers, the lead
time as a span, and each warning explained (family, module, false-alarm rate, evidence)."""

from __future__ import annotations

import streamlit as st

from foreshock.dashboard import charts, data

DEFAULT_MONITORS = ["Δ2 spectral entropy (QK increment)", "ΔW_q spectral entropy",
                    "router token entropy (normalised)", "router ε (row conditioning)"]  # fmt: skip


def _pick_run() -> str | None:
    ids = data.run_ids()
    if not ids:
        return None
    wanted = st.query_params.get("run")
    index = ids.index(wanted) if wanted in ids else 0
    run_id = st.selectbox("run", ids, index=index)
    st.query_params["run"] = run_id
    return run_id


def _header(summary: dict) -> None:
    st.markdown(f"**status: {summary['status']}**" + (
        f" · active: {', '.join(summary['active'])}" if summary["active"] else ""))  # fmt: skip
    cols = st.columns(4)
    cols[0].metric("last step", summary["last_step"])
    cols[1].metric("divergence step", summary["divergence_step"] or "–")
    cols[2].metric("first mechanism warning", summary["first_warning_step"] or "–")
    cols[3].metric("lead (steps)", summary["lead_time"] if summary["lead_time"] is not None
                   else "–")  # fmt: skip
    labels = {k: v for k, v in summary["labels"].items() if not isinstance(v, dict)}
    st.caption(" · ".join(f"{k}: {v}" for k, v in labels.items()))


STATISTIC_NAMES = {
    "level": "its distance from its warm-up level (|ln ratio|, sustained)",
    "band": "its distance beyond the healthy runs' band at the same step (band widths, sustained)",
    "cusum": "its CUSUM statistic",
}


def _statistic_name(warning: dict) -> str:
    return STATISTIC_NAMES.get((warning["evidence"] or {}).get("detector"), "its CUSUM statistic")


def _warnings(warnings: list[dict]) -> None:
    st.subheader("Warnings")
    if not warnings:
        st.write("No warning for this run.")
        return
    for w in warnings:
        lead = "" if w["lead_time"] is None else f", lead {w['lead_time']} steps"
        cleared = "" if w["cleared_step"] is None else f", cleared at {w['cleared_step']}"
        title = (f"⚠ {w['family']} · {w['module'] or 'run'} · step {w['step']} · "
                 f"{w['role']}{lead}{cleared}")  # fmt: skip
        with st.expander(title):
            st.markdown(
                f"**{w['series']}** moved **{w['direction']}**: {_statistic_name(w)} "
                f"{w['statistic']} crossed the calibrated threshold {w['threshold']}. "
                f"A healthy run warns falsely in this family with probability ≤ "
                f"**{w['false_alarm_rate']}** per run (config `{w['config_version']}`)."
            )
            if check := (w["evidence"] or {}).get("check"):
                st.markdown(f"**What to check:** {check}")
            st.json(w["evidence"] or {}, expanded=False)


def main() -> None:
    st.title("Run")
    if not data.store_exists():
        st.info(f"No history yet in `{data.store_path()}`.")
        return
    run_id = _pick_run()
    if run_id is None:
        st.info("No runs stored yet.")
        return
    cols = st.columns([3, 1])
    labels = cols[0].multiselect("monitors", list(data.MONITORS), default=DEFAULT_MONITORS)
    heads = cols[1].checkbox("per-head Δ2 detail", help="Δ2 entropy per attention head")
    metrics = tuple(data.MONITORS[label][0] for label in labels)
    page = data.run_page(run_id, metrics, heads)
    if page["summary"] is None:
        st.warning(f"Run {run_id!r} is not in the history.")
        return
    summary, warnings = page["summary"], page["warnings"]
    _header(summary)
    st.plotly_chart(charts.loss_figure(page["loss"], warnings, summary["divergence_step"]),
                    width="stretch", key="loss")  # fmt: skip
    grid = st.columns(2)
    for i, label in enumerate(labels):
        metric, family = data.MONITORS[label]
        figure = charts.monitor_figure(label, page["series"][metric], warnings, family)
        grid[i % 2].plotly_chart(figure, width="stretch", key=f"m-{metric}")
    _warnings(warnings)


main()
