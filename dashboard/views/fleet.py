"""Fleet: every run, most urgent first — which runs are in trouble, what is failing, how early
we knew. The table refreshes itself (a fragment re-runs every few seconds, not the page)."""

from __future__ import annotations

import html
import time
from urllib.parse import quote

import streamlit as st

from foreshock.dashboard import data

REFRESH_S = 5
WINDOWS = {"all time": None, "last hour": 3600.0, "last day": 86400.0, "last week": 604800.0}
BADGE = {"diverged": "#000000", "warning: attention-numerics": "#d62728",
         "warning: router": "#9467bd", "healthy": "#2ca02c", "finished": "#7f7f7f"}  # fmt: skip


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _row(r: dict) -> str:
    colour = BADGE.get(r["status"], "#7f7f7f")
    cells = [
        f'<a href="./run?run={quote(r["run_id"])}" target="_self">{html.escape(r["run_id"])}</a>',
        f'<span class="fs-status" style="background:{colour}">{html.escape(r["status"])}</span>',
        html.escape(r["scenario"] or "–"), html.escape(r["project"] or "–"),
        str(r["last_step"] if r["last_step"] is not None else "–"),
        _ago(None if r["last_received"] is None else time.time() - r["last_received"]),
        "<br>".join(html.escape(a) for a in r["active"]) or "–",
        str(r["first_warning_step"] if r["first_warning_step"] is not None else "–"),
        str(r["divergence_step"] if r["divergence_step"] is not None else "–"),
        str(r["lead_time"] if r["lead_time"] is not None else "–"),
    ]  # fmt: skip
    return (
        f'<tr data-run="{html.escape(r["run_id"])}">'
        + "".join(f"<td>{c}</td>" for c in cells)
        + "</tr>"
    )


HEADER = ["run", "status", "scenario", "project", "last step", "last data", "active warnings",
          "first warning", "divergence", "lead (steps)"]  # fmt: skip
STYLE = """<style>
.fs-fleet {border-collapse: collapse; width: 100%; font-size: 0.9rem}
.fs-fleet th, .fs-fleet td {border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left}
.fs-status {color: white; border-radius: 4px; padding: 1px 6px; white-space: nowrap}
</style>"""


def _filters() -> dict:
    cols = st.columns(4)
    projects = ["all", *data.projects()]
    project = cols[0].selectbox("project", projects)
    status = cols[1].selectbox("status", ["all", "warning", "diverged", "healthy", "finished"])
    family = cols[2].selectbox("fault family", ["all", "attention-numerics", "router"])
    window = cols[3].selectbox("last data within", list(WINDOWS))
    pick = lambda v: None if v == "all" else v  # noqa: E731
    return {"project": pick(project), "status": pick(status), "family": pick(family),
            "window_s": WINDOWS[window]}  # fmt: skip


@st.fragment(run_every=REFRESH_S)
def fleet_table(filters: dict) -> None:
    rows = data.fleet(**filters)
    counts = {k: sum(r["status"].startswith(k) for r in rows)
              for k in ("warning", "diverged", "healthy", "finished")}  # fmt: skip
    cols = st.columns(5)
    cols[0].metric("runs", len(rows))
    for col, (name, n) in zip(cols[1:], counts.items(), strict=True):
        col.metric(name, n)
    if not rows:
        st.info("No runs match these filters.")
        return
    head = "".join(f"<th>{h}</th>" for h in HEADER)
    body = "".join(_row(r) for r in rows)
    st.markdown(f'{STYLE}<table class="fs-fleet"><thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table>", unsafe_allow_html=True)  # fmt: skip
    st.caption(f"updated {time.strftime('%H:%M:%S')} · refreshes every {REFRESH_S} s")


def main() -> None:
    st.title("Fleet")
    if not data.store_exists():
        st.info(
            f"No history yet in `{data.store_path()}`. Start `foreshock sink --store "
            f"{data.store_path()}` and stream a run (`foreshock lab run --kafka`)."
        )
        return
    fleet_table(_filters())


main()
