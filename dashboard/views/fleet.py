"""Fleet: every run, most urgent first — which runs are in trouble, what is failing, how early
we knew. The table refreshes itself (a fragment re-runs every few seconds, not the page)."""

from __future__ import annotations

import time
from urllib.parse import quote

import streamlit as st

from foreshock.catalogue import MECHANISMS
from foreshock.dashboard import data
from foreshock.dashboard.text import html_text, md_code, md_text

REFRESH_S = 5
WINDOWS = {"all time": None, "last hour": 3600.0, "last day": 86400.0, "last week": 604800.0}
BADGE = {
    "diverged": "#000000",
    "warning: attention-numerics": "#d62728",
    "warning: router": "#9467bd",
    "healthy": "#2ca02c",
    "finished": "#7f7f7f",
}


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _or_dash(value: object) -> str:
    return "–" if value is None or value == "" else html_text(value)


def _collision(count: int) -> str:
    """A badge beside the status: another job wrote under the run id (stored apart)."""
    if not count:
        return ""
    title = f"{count} other job(s) wrote under this run id: stored apart, not followed"
    return f' <span class="fs-badge fs-collision" title="{title}">collision</span>'


def _row(r: dict) -> str:
    """One table row; every text from the history through :func:`html_text` (entities only:
    no tag, no line break that would end the HTML block and let Markdown render the rest)."""
    colour = BADGE.get(r["status"], "#7f7f7f")
    run = html_text(r["run_id"])
    cells = [
        f'<a href="./run?run={quote(r["run_id"], safe="")}" target="_self">{run}</a>',
        f'<span class="fs-status" style="background:{colour}">{html_text(r["status"])}</span>'
        + _collision(r.get("collisions") or 0),
        _or_dash(r["scenario"]),
        _or_dash(r["project"]),
        _or_dash(r["last_step"]),
        _ago(None if r["last_received"] is None else time.time() - r["last_received"]),
        "<br>".join(html_text(a) for a in r["active"]) or "–",
        _or_dash(r["first_warning_step"]),
        _or_dash(r["divergence_step"]),
        _or_dash(r["lead_time"]),
    ]
    return f'<tr data-run="{run}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


HEADER = [
    "run",
    "status",
    "scenario",
    "project",
    "last step",
    "last data",
    "active warnings",
    "first warning",
    "divergence",
    "lead (steps)",
]
STYLE = """<style>
.fs-fleet {border-collapse: collapse; width: 100%; font-size: 0.9rem}
.fs-fleet th, .fs-fleet td {border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left}
.fs-fleet td {white-space: pre-wrap}
.fs-status {color: white; border-radius: 4px; padding: 1px 6px; white-space: nowrap}
.fs-badge {color: white; border-radius: 4px; padding: 1px 6px; white-space: nowrap}
.fs-collision {background: #17becf}
</style>"""


def _filters() -> dict:
    cols = st.columns(4)
    projects = ["all", *data.projects()]
    project = cols[0].selectbox("project", projects)
    status = cols[1].selectbox("status", ["all", "warning", "diverged", "healthy", "finished"])
    family = cols[2].selectbox("fault family", ["all", *MECHANISMS])
    window = cols[3].selectbox("last data within", list(WINDOWS))
    pick = lambda v: None if v == "all" else v  # noqa: E731
    return {
        "project": pick(project),
        "status": pick(status),
        "family": pick(family),
        "window_s": WINDOWS[window],
    }


@st.fragment(run_every=REFRESH_S)
def fleet_table(filters: dict) -> None:
    rows = data.fleet(**filters)
    counts = {
        k: sum(r["status"].startswith(k) for r in rows)
        for k in ("warning", "diverged", "healthy", "finished")
    }
    cols = st.columns(5)
    cols[0].metric("runs", len(rows))
    for col, (name, n) in zip(cols[1:], counts.items(), strict=True):
        col.metric(name, n)
    if not rows:
        st.info("No runs match these filters.")
        return
    head = "".join(f"<th>{h}</th>" for h in HEADER)
    body = "".join(_row(r) for r in rows)
    # one HTML block: STYLE's closing line carries the whole table (html_text left no line
    # break in it), so CommonMark parses nothing of the table as Markdown
    st.markdown(
        f'{STYLE}<table class="fs-fleet"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>",
        unsafe_allow_html=True,
    )
    st.caption(f"updated {time.strftime('%H:%M:%S')} · refreshes every {REFRESH_S} s")


def main() -> None:
    st.title("Fleet")
    if not data.store_exists():
        path = data.store_path()
        st.info(
            f"No history yet in {md_code(path)}. Start "
            f"{md_code(f'foreshock sink --store {path}')} and stream a run "
            "(`foreshock lab run --kafka`)."
        )
        return
    for note in data.damage():  # read at the last readable version: said, never a traceback
        st.warning(f"{md_text(note)}; shown as of the last good commit (foreshock store repair)")
    fleet_table(_filters())


main()
