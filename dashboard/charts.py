"""Plotly figures for the pages: loss with divergence and lead span, monitors with warning
markers, runs overlaid, the tuning trade-off. Pure functions of plain rows (testable).

Every string from the history (run ids, module names, warning fields, tuning parameters) goes
through :func:`~foreshock.dashboard.text.plot_text` before plotly sees it: plotly renders a
subset of HTML (links, bold, line breaks) in names, titles, hover text and annotations."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go

from foreshock.catalogue import FAMILY_COLOURS, MECHANISMS

from .text import plot_text

__all__ = ["FAMILY_COLOURS", "compare_figure", "loss_figure", "monitor_figure", "tradeoff_figure"]

_LAYOUT = {
    "height": 320,
    "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
    "legend": {"orientation": "h", "y": -0.25},
    "hovermode": "x unified",
}


def _first_mechanism(warnings: list[dict[str, Any]], before: int | None) -> dict | None:
    hits = [
        w for w in warnings if w["family"] in MECHANISMS and (before is None or w["step"] < before)
    ]
    return min(hits, key=lambda w: w["step"], default=None)


def restart_steps(attempts: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(restart number, step it resumed at) for each attempt after the first (rank 0's).

    >>> restart_steps([{"rank": 0, "number": 1, "first_step": 0},
    ...                {"rank": 0, "number": 2, "first_step": 30}])
    [(1, 30)]
    """
    return [
        (a["number"] - 1, a["first_step"]) for a in attempts if a["rank"] == 0 and a["number"] > 1
    ]


def loss_figure(
    loss: list[dict[str, Any]],
    warnings: list[dict[str, Any]],
    divergence_step: int | None,
    attempts: list[dict[str, Any]] | None = None,
) -> go.Figure:
    """The loss (bucket mean, with its min–max band), the divergence step as a line, the lead
    time as a shaded span from the first mechanism warning to the divergence, and each
    restart (a run resumed from a checkpoint) as a dotted line where it resumed: the line
    shows the latest attempt's values for the steps it re-did."""
    fig = go.Figure()
    steps = [p["step"] for p in loss]
    fig.add_trace(
        go.Scatter(
            x=steps + steps[::-1],
            y=[p["high"] for p in loss] + [p["low"] for p in loss][::-1],
            fill="toself",
            line={"width": 0},
            fillcolor="rgba(31,119,180,0.15)",
            name="min–max",
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        go.Scatter(x=steps, y=[p["value"] for p in loss], name="loss", line={"color": "#1f77b4"})
    )
    first = _first_mechanism(warnings, divergence_step)
    if divergence_step is not None:
        fig.add_vline(
            x=divergence_step,
            line={"color": "black", "dash": "dash"},
            annotation_text=f"divergence @ {divergence_step}",
        )
        if first is not None:
            fig.add_vrect(
                x0=first["step"],
                x1=divergence_step,
                opacity=0.15,
                line_width=0,
                fillcolor=FAMILY_COLOURS.get(first["family"], "grey"),
                annotation_text=f"lead {divergence_step - first['step']} steps",
                annotation_position="top left",
            )
    for number, step in restart_steps(attempts or []):
        fig.add_vline(
            x=step,
            line={"color": "grey", "dash": "dot"},
            annotation_text=f"restart {number} @ {step}",
        )
    mechanisms = [w for w in warnings if w["family"] in MECHANISMS]
    _warning_markers(fig, mechanisms, _floor(loss, "low"))
    fig.update_layout(title="loss", xaxis_title="step", **_LAYOUT)
    return fig


def _warning_markers(fig: go.Figure, warnings: list[dict[str, Any]], y: float) -> None:
    """A dotted line per warning, coloured by family, and a ▲ at height ``y`` that names it
    on hover (module, step, role) — labels on the lines would overlap."""
    for w in warnings:
        fig.add_vline(
            x=w["step"],
            line={"color": FAMILY_COLOURS.get(w["family"], "grey"), "dash": "dot", "width": 2},
        )
    for family in sorted({w["family"] for w in warnings}):
        mine = [w for w in warnings if w["family"] == family]
        fig.add_trace(
            go.Scatter(
                x=[w["step"] for w in mine],
                y=[y] * len(mine),
                mode="markers",
                marker={
                    "symbol": "triangle-up",
                    "size": 12,
                    "color": FAMILY_COLOURS.get(family, "grey"),
                },
                name=plot_text(f"⚠ {family}"),
                hovertext=[
                    plot_text(f"{family} @ {w['module'] or 'run'}, step {w['step']} ({w['role']})")
                    for w in mine
                ],
                hoverinfo="text",
            )
        )


def _floor(points: list[dict[str, Any]], key: str = "value") -> float:
    values = [p[key] for p in points if p.get(key) is not None]
    return min(values) if values else 0.0


def monitor_figure(
    title: str, points: list[dict[str, Any]], warnings: list[dict[str, Any]], family: str
) -> go.Figure:
    """One monitor, a line per module (or per head), with this family's warnings marked."""
    fig = go.Figure()
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        name = p["module"] or "run"
        lines[name if p["head"] is None else f"{name} head {p['head']}"].append(p)
    for name, pts in sorted(lines.items()):
        fig.add_trace(
            go.Scatter(
                x=[p["step"] for p in pts],
                y=[p["value"] for p in pts],
                name=plot_text(name),
                mode="lines",
            )
        )
    _warning_markers(fig, [w for w in warnings if w["family"] == family], _floor(points))
    fig.update_layout(title=plot_text(title), xaxis_title="step", **_LAYOUT)
    return fig


def compare_figure(
    metric: str, lines: list[dict[str, Any]], leads: list[dict[str, Any]]
) -> go.Figure:
    """The same monitor across runs; each run's divergence marked on its own line."""
    fig = go.Figure()
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in lines:
        by_run[p["run_id"]].append(p)
    divergence = {r["run_id"]: r["divergence_step"] for r in leads}
    for run_id, pts in sorted(by_run.items()):
        fig.add_trace(
            go.Scatter(
                x=[p["step"] for p in pts],
                y=[p["value"] for p in pts],
                name=plot_text(run_id),
                mode="lines",
            )
        )
        if divergence.get(run_id) is not None:
            fig.add_vline(
                x=divergence[run_id],
                line={"dash": "dash", "width": 1},
                annotation_text=plot_text(f"{run_id} diverges"),
                annotation_font_size=9,
            )
    fig.update_layout(title=plot_text(metric), xaxis_title="step", **{**_LAYOUT, "height": 420})
    return fig


def tradeoff_figure(points: list[dict[str, Any]], chosen: int | None) -> go.Figure:
    """Each grid point's detection rate against its false warnings per healthy run, one
    marker per family; the marker size is the median lead."""
    fig = go.Figure()
    for family, colour in FAMILY_COLOURS.items():
        xs, ys, sizes, text = [], [], [], []
        for i, point in enumerate(points):
            for f in point["families"]:
                if f["family"] != family:
                    continue
                xs.append(f["false_warnings_per_run"])
                ys.append(f["detection_rate"])
                sizes.append(8 + (f["lead_median"] or 0) / 25)
                params = ", ".join(f"{k}={v}" for k, v in point["params"].items())
                text.append(plot_text(("★ chosen: " if i == chosen else "") + params))
        if xs:
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="markers",
                    name=family,
                    text=text,
                    marker={"color": colour, "size": sizes, "opacity": 0.7},
                )
            )
    fig.update_layout(
        title="detection vs false warnings (size: median lead)",
        xaxis_title="false warnings per held-out healthy run",
        yaxis_title="faulty runs warned before divergence",
        **_LAYOUT,
    )
    return fig
