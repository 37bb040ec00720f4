"""Run: the loss with its divergence, the mechanism monitors with warning markers, the lead
time as a span, each warning explained (family, module, false-alarm rate, evidence), and what
the trainer did about them (its actions: what, at which step, by its policy or approved).

A run written per rank (``emit_ranks="all"``) has one series per rank: the page shows one rank
at a time (a ``rank`` picker, the lowest first) with that rank's warnings marked, and lists
every rank's warnings, each naming its rank."""

from __future__ import annotations

import streamlit as st

from foreshock.catalogue import series
from foreshock.dashboard import charts, data
from foreshock.dashboard.text import block, html_text, md_code, md_text
from foreshock.recipe import Recipe
from foreshock.storage.reader import QueryError

DEFAULT_MONITORS = [  # labels from the catalogue: a renamed label keeps the default
    series(m).label
    for m in (
        "attn.d2.entropy_mean",
        "attn.dwq.entropy",
        "router.token_entropy_norm",
        "router.epsilon",
    )
]


def _pick_run() -> str | None:
    ids = data.run_ids()
    if not ids:
        return None
    wanted = st.query_params.get("run")
    index = ids.index(wanted) if wanted in ids else 0
    run_id = st.selectbox("run", ids, index=index)
    st.query_params["run"] = run_id
    return run_id


def _pick_rank(run_id: str) -> int | None:
    """The rank to draw, when more than one wrote the run (None: the run's only one)."""
    ranks = data.run_ranks(run_id)
    if len(ranks) < 2:
        st.query_params.pop("rank", None)
        return None
    wanted = st.query_params.get("rank")
    index = next((i for i, r in enumerate(ranks) if str(r) == wanted), 0)
    rank = st.selectbox("rank", ranks, index=index, help="each rank's records are its own series")
    st.query_params["rank"] = str(rank)
    return rank


def _step(value: int | None) -> int | str:
    return "–" if value is None else value


def _header(summary: dict) -> None:
    """Status, the open warnings, the steps, and the start message's labels — as text: every
    string here is the producer's or the detectors' (see :mod:`foreshock.dashboard.text`)."""
    active = ", ".join(summary["active"])
    st.markdown(
        block(
            f"<b>status: {html_text(summary['status'])}</b>"
            + (f" · active: {html_text(active)}" if active else "")
        ),
        unsafe_allow_html=True,
    )
    cols = st.columns(4)
    cols[0].metric("last step", _step(summary["last_step"]))
    cols[1].metric("divergence step", _step(summary["divergence_step"]))
    cols[2].metric("first mechanism warning", _step(summary["first_warning_step"]))
    cols[3].metric("lead (steps)", _step(summary["lead_time"]))
    labels = {k: v for k, v in summary["labels"].items() if not isinstance(v, dict)}
    recipe = Recipe.from_labels(summary["labels"].get("recipe"))
    if recipe is not None:  # the learning-rate schedule the run declared
        labels = {"recipe": recipe.describe(), **labels}
    if labels:
        text = " · ".join(f"{html_text(k)}: {html_text(v)}" for k, v in labels.items())
        st.caption(block(text), unsafe_allow_html=True)


STATISTIC_NAMES = {
    "level": "its distance from its warm-up level (|ln ratio|, sustained)",
    "band": "its distance beyond the healthy runs' band at the same step (band widths, sustained)",
    "cusum": "its CUSUM statistic",
}


def _evidence(warning: dict) -> dict:
    return warning["evidence"] if isinstance(warning["evidence"], dict) else {}


def _statistic_name(warning: dict) -> str:
    detector = str(_evidence(warning).get("detector"))
    return STATISTIC_NAMES.get(detector, "its CUSUM statistic")


def _outcome(action: dict) -> str:
    """How an action went, in words."""
    refused = (action.get("detail") or {}).get("refused")
    if refused:
        return f"refused: {refused}"
    if action.get("error"):
        return f"failed: {action['error']}"
    if action.get("dry_run"):
        return "dry run (nothing done)"
    return "applied" if action.get("applied") else "not applied"


def _action_line(action: dict) -> str:
    """One action as HTML text: what, at which step, who decided, how it went."""
    source = "by the policy"
    if action.get("source") == "approved":
        refused = (action.get("detail") or {}).get("refused")
        source = f"{'requested' if refused else 'approved'} by {_approver(action)}"
    back = action.get("rolled_back_to")
    back = "" if back is None else f", rolled back to step {html_text(back)}"
    return (
        f"<b>Action:</b> {html_text(action.get('action'))} at step {html_text(action.get('step'))}"
        f", {source}{back}: {html_text(_outcome(action))}"
    )


def _approver(action: dict) -> str:
    """Who asked for an action: the allowlist's name and key id (a verified request); an
    unverified sender (a refused request); a person (an action stored before signing)."""
    approver = action.get("approver") or {}
    if isinstance(approver, dict) and approver.get("name"):
        return f"{approver['name']} (key {approver.get('key_id')})"
    refused = (action.get("detail") or {}).get("refused")
    return "an unverified sender" if refused else "a person"


def _actions(actions: list[dict]) -> None:
    """Every action the trainer took, as a table (its cells are plain text)."""
    if not actions:
        return
    st.subheader("Actions")
    rows = [
        {
            "step": a.get("step"),
            "action": a.get("action"),
            "warning": a.get("warning_id"),
            "family": a.get("family"),
            "module": a.get("module") or "run",
            "source": a.get("source") or "policy",
            "approver": _approver(a) if a.get("source") == "approved" else None,
            "outcome": _outcome(a),
            "rolled back to": a.get("rolled_back_to"),
            "request": a.get("request_id"),
        }
        for a in actions
    ]
    st.dataframe(rows, hide_index=True)


def _warnings(warnings: list[dict], actions: list[dict]) -> None:
    st.subheader("Warnings")
    if not warnings:
        st.write("No warning for this run.")
        return
    for w in warnings:
        lead = "" if w["lead_time"] is None else f", lead {w['lead_time']} steps"
        cleared = "" if w["cleared_step"] is None else f", cleared at {w['cleared_step']}"
        rank = "" if w.get("rank") is None else f" · rank {w['rank']}"
        title = (
            f"⚠ {md_text(w['family'])} · {md_text(w['module'] or 'run')}{rank} · step "
            f"{w['step']} · {md_text(w['role'])}{lead}{cleared}"
        )
        t = {
            k: html_text(w[k])
            for k in (
                "series",
                "direction",
                "statistic",
                "threshold",
                "false_alarm_rate",
                "config_version",
            )
        }
        with st.expander(title):
            st.markdown(
                block(
                    f"<b>{t['series']}</b> moved <b>{t['direction']}</b>: {_statistic_name(w)} "
                    f"{t['statistic']} crossed the calibrated threshold {t['threshold']}. "
                    f"A healthy run warns falsely in this family with probability ≤ "
                    f"<b>{t['false_alarm_rate']}</b> per run (config "
                    f"<code>{t['config_version']}</code>{_profile(w)})."
                ),
                unsafe_allow_html=True,
            )
            if check := _evidence(w).get("check"):
                st.markdown(
                    block(f"<b>What to check:</b> {html_text(check)}"), unsafe_allow_html=True
                )
            for action in (a for a in actions if a.get("warning_id") == w["id"]):
                st.markdown(block(_action_line(action)), unsafe_allow_html=True)
            st.json(w["evidence"] or {}, expanded=False)  # a JSON viewer: its strings are text


def _profile(warning: dict) -> str:
    """ ", profile <name> (why)" where the warning says which profile judged the run and why
    (as HTML): a run whose recipe is not its model's profile's is told so here."""
    profile, why = _evidence(warning).get("profile"), _evidence(warning).get("profile_reason")
    reason = f" ({html_text(why)})" if why else ""
    return "" if not profile else f", profile <b>{html_text(profile)}</b>{reason}"


def _attempts(attempts: list[dict]) -> None:
    """A resumed run's restarts, and a collision (two jobs under one run id) as an error."""
    restarts = charts.restart_steps(attempts)
    if restarts:
        where = ", ".join(f"step {step}" for _, step in restarts)
        st.caption(f"Resumed {len(restarts)} time(s) from a checkpoint, at {where}.")
    if any(a["overlaps"] for a in attempts):
        st.error(
            "Two jobs sent under this run id at the same time (attempts overlap); their "
            "data are kept apart, and the sink stored a dead letter for the collision."
        )


def main() -> None:
    st.title("Run")
    if not data.store_exists():
        st.info(f"No history yet in {md_code(data.store_path())}.")
        return
    for note in data.damage():  # read at the last readable version: said, never a traceback
        st.warning(f"{md_text(note)}; shown as of the last good commit (foreshock store repair)")
    run_id = _pick_run()
    if run_id is None:
        st.info("No runs stored yet.")
        return
    rank = _pick_rank(run_id)
    cols = st.columns([3, 1])
    labels = cols[0].multiselect("monitors", list(data.MONITORS), default=DEFAULT_MONITORS)
    heads = cols[1].checkbox("per-head Δ2 detail", help="Δ2 entropy per attention head")
    metrics = tuple(data.MONITORS[label][0] for label in labels)
    try:
        page = data.run_page(run_id, metrics, heads, rank=rank)
    except QueryError as exc:  # a value the queries cannot handle: say so, no traceback
        st.error(
            f"This run's history cannot be drawn: the store's query failed "
            f"({md_text(type(exc).__name__)}: {md_text(exc)})."
        )
        return
    if page["summary"] is None:
        st.warning(f"Run {md_text(run_id)} is not in the history.")
        return
    summary, warnings = page["summary"], page["warnings"]
    # on the charts, the warnings of the rank drawn
    marked = warnings if rank is None else [w for w in warnings if w.get("rank") in (None, rank)]
    _header(summary)
    _attempts(page["attempts"])
    st.plotly_chart(
        charts.loss_figure(page["loss"], marked, summary["divergence_step"], page["attempts"]),
        width="stretch",
        key="loss",
    )
    grid = st.columns(2)
    for i, label in enumerate(labels):
        metric, family = data.MONITORS[label]
        figure = charts.monitor_figure(label, page["series"][metric], marked, family)
        grid[i % 2].plotly_chart(figure, width="stretch", key=f"m-{metric}")
    _warnings(warnings, page.get("actions", []))
    _actions(page.get("actions", []))
    _reach(run_id)


def _reach(run_id: str) -> None:
    """What each rule of the run's profile takes to fire on it, in its own units: a rule
    that cannot fire at this run's scale shows it here (a factor no series will reach)."""
    profile, reach = data.rule_reach(run_id)
    if not reach:
        return
    with st.expander(f"What each rule takes to fire on this run (profile {md_text(profile)})"):
        for metric, what in reach.items():
            st.markdown(f"- {md_code(metric)}: {md_text(what)}")


main()
