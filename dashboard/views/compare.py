"""Compare: one monitor overlaid across runs (healthy vs faulty seeds), with their leads."""

from __future__ import annotations

import streamlit as st

from foreshock.dashboard import charts, data
from foreshock.dashboard.text import md_code, md_text
from foreshock.storage.reader import QueryError
from foreshock.table import format_table


def main() -> None:
    st.title("Compare")
    ids = data.run_ids() if data.store_exists() else []
    if not ids:
        st.info(f"No runs stored yet in {md_code(data.store_path())}.")
        return
    label = st.selectbox("monitor", list(data.MONITORS))
    chosen = st.multiselect("runs", ids, default=ids[: min(4, len(ids))])
    if not chosen:
        st.info("Pick runs to compare.")
        return
    metric = data.MONITORS[label][0]
    try:
        result = data.compare(tuple(chosen), metric)
    except QueryError as exc:  # a value the queries cannot handle: say so, no traceback
        st.error(
            f"These runs cannot be compared: the store's query failed "
            f"({md_text(type(exc).__name__)}: {md_text(exc)})."
        )
        return
    st.plotly_chart(
        charts.compare_figure(label, result["lines"], result["leads"]),
        width="stretch",
        key="compare",
    )
    rows = [
        [
            r["run_id"],
            r["scenario"],
            r["first_mechanism"],
            r["mechanism_step"],
            r["divergence_step"],
            r["mechanism_lead"],
            r["symptom_lead"],
        ]
        for r in result["leads"]
    ]
    st.subheader("Lead times")
    header = [
        "run",
        "scenario",
        "first mechanism warning",
        "at step",
        "divergence",
        "lead: mechanism",
        "lead: symptom",
    ]
    st.code(format_table(header, rows), language="text")


main()
