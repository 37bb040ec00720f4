"""Tuning: the detection / false-warning / lead-time trade-off that `foreshock tune` measured,
per family, and which detector config is live."""

from __future__ import annotations

import streamlit as st

from foreshock.dashboard import charts, data
from foreshock.dashboard.text import md_code, md_text
from foreshock.table import format_table


def main() -> None:
    st.title("Tuning")
    live, history = data.live_config()
    st.metric("live detector config", md_text(live) if live else "shipped default (none published)")
    reports = data.tune_reports()
    if not reports:
        st.info(
            f"No tune report yet: run {md_code(f'foreshock tune --store {data.store_path()}')}"
            " to search detector parameters on past runs."
        )
        return
    version = st.selectbox(
        "tune report of config",
        list(reports),
        index=list(reports).index(live) if live in reports else 0,
    )
    report = reports[version]
    st.caption(f"rule: {md_text(report['rule'])}")
    chosen = report["chosen"]["index"] if report.get("chosen") else None
    st.plotly_chart(
        charts.tradeoff_figure(report["points"], chosen), width="stretch", key="tradeoff"
    )
    rows = []
    for i, point in enumerate(report["points"]):
        for f in point["families"]:
            rows.append(
                [
                    "★" if i == chosen else "",
                    *point["params"].values(),
                    f["family"],
                    f"{f['detected']}/{f['runs']}",
                    f["false_warnings_per_run"],
                    f["lead_median"],
                    f["lead_p10"],
                    f["lead_p90"],
                ]
            )
    params = list(report["points"][0]["params"]) if report["points"] else []
    st.code(
        format_table(
            ["", *params, "family", "warned", "false / healthy run", "lead median", "p10", "p90"],
            rows,
        ),
        language="text",
    )
    st.subheader("Registry history")
    st.code(
        format_table(
            ["time", "action", "version", "note"],
            [
                [
                    str(h.get("time", ""))[:16].replace("T", " "),
                    h.get("action"),
                    h.get("version"),
                    h.get("note", ""),
                ]
                for h in history
            ],
        ),
        language="text",
    )


main()
