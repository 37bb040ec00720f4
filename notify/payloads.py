"""What a warning event looks like to the outside: one pure payload builder per receiver kind,
standard library only, so the shapes are testable without a network.

* ``webhook`` — the whole ``foreshock.warning/1`` event, plus its ``state`` (open, resolved,
  acknowledged, silenced: :mod:`foreshock.detectors.alerts`), ``resolved_by``,
  ``dashboard_url`` (the run's page) and a one-line ``summary``: receivers that know the schema
  need nothing else. Signed when the target has a secret (:mod:`foreshock.notify.signing`).
* ``slack`` — a Slack incoming-webhook body (``text`` + ``blocks``, mrkdwn); Mattermost and
  Rocket.Chat accept the same ``text``. One message per transition: opened, resolved (and
  why), acknowledged by whom, silenced until when.
* ``alertmanager`` — Prometheus Alertmanager's v2 API (``POST <am>/api/v2/alerts``, a list).
  An alert is identified by its labels, so these are the stable facts of a warning (family,
  module, run); ``endsAt`` is set when the warning resolved, at that time, which makes
  Alertmanager resolve it. An acknowledgement or a silence is an Alertmanager *silence*
  matching the alert's labels (:func:`alertmanager_silence`), made by whoever acted.

Which receiver gets which payload when: :mod:`foreshock.notify.receivers`; getting it there:
:mod:`foreshock.notify.delivery`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from foreshock.transport.warning import PERSON_EVENTS, WarningEvent, resolved_by

__all__ = [
    "SEVERITY",
    "STATE",
    "alertmanager_alert",
    "alertmanager_silence",
    "dashboard_link",
    "slack_payload",
    "summary",
    "webhook_payload",
]


# Alertmanager ``severity`` by role: a symptom (loss, gradient norm) means the run is already
# going; a cause is the early, attributed warning; a secondary one follows a cause already sent.
SEVERITY = {
    "symptom": "critical",
    "cause": "warning",
    "ambiguous": "warning",
    "optimizer": "warning",
    "secondary": "info",
}
# the state a warning is in once an event of each kind went out
STATE = {
    "opened": "open",
    "updated": "open",
    "cleared": "resolved",
    "acknowledged": "acknowledged",
    "silenced": "silenced",
}


def dashboard_link(dashboard_url: str, run_id: str) -> str:
    """The dashboard's page of one run (its ``run`` query parameter, quoted).

    >>> dashboard_link("http://dash:8501/", "lr high/s1&x")
    'http://dash:8501/run?run=lr%20high%2Fs1%26x'
    """
    return f"{dashboard_url.rstrip('/')}/run?run={quote(run_id, safe='')}"


def _rate(value: float | None) -> str:
    return "not calibrated" if value is None else f"≤ {value:.3g} per healthy run"


def _evidence(event: WarningEvent) -> dict[str, Any]:
    return event.evidence or {}


def _when(seconds: Any) -> str:
    """A time for people: UTC, to the minute.

    >>> _when(90.0)
    '1970-01-01 00:01 UTC'
    """
    return datetime.fromtimestamp(float(seconds), UTC).strftime("%Y-%m-%d %H:%M UTC")


_WHY = {
    "statistic": "back under its threshold",
    "run ended": "the run ended",
    "superseded": "the run resumed from an earlier step",
    "action": "the trainer acted",
}


def _why(event: WarningEvent) -> str:
    """Why a ``cleared`` event resolved its warning, for a person.

    >>> e = {"id": "a", "event": "cleared", "run_id": "r1", "family": "loss", "step": 5}
    >>> _why(WarningEvent.from_message({**e, "evidence": {"resolved_by": "superseded",
    ...     "resumed_at": 500}}))
    'the run resumed from an earlier step (500)'
    >>> _why(WarningEvent.from_message({**e, "evidence": {"resolved_by": "run ended"}}))
    'the run ended'
    >>> _why(WarningEvent.from_message({**e, "evidence": {"resolved_by": "action",
    ...     "action": {"what": "hold-lr", "step": 470, "source": "approved",
    ...                "approver": {"name": "ana", "key_id": "0b74"}}}}))
    'the trainer acted: hold-lr at step 470, approved by ana (key 0b74)'
    >>> from foreshock.transport.warning import RESOLVED_BY
    >>> sorted(_WHY) == sorted(RESOLVED_BY)  # every reason the wire allows has its words
    True
    """
    why = resolved_by(event) or "statistic"
    resumed_at = _evidence(event).get("resumed_at")
    if why == "superseded" and resumed_at is not None:
        return f"{_WHY[why]} ({resumed_at})"
    action = _evidence(event).get("action")
    if why == "action" and isinstance(action, dict):
        source = "its policy"
        if action.get("source") == "approved":
            who = action.get("approver")
            who = who if isinstance(who, dict) else {}
            name = f"{who.get('name')} (key {who.get('key_id')})" if who.get("name") else ""
            source = f"approved by {name or 'a person'}"
        return f"{_WHY[why]}: {action.get('what')} at step {action.get('step')}, {source}"
    return _WHY[why]


def summary(event: WarningEvent) -> str:
    """One line for a human: what, where, when, how trustworthy, and the lead time if known.

    >>> e = {"id": "a", "family": "router", "module": "blocks.1.moe", "run_id": "r1",
    ...      "step": 450, "role": "cause", "false_alarm_rate": 0.1429, "event": "opened",
    ...      "lead_time": None, "cleared_step": None}
    >>> summary(WarningEvent.from_message(e))
    'router warning opened on run r1 (blocks.1.moe) at step 450, cause; false-alarm rate ≤ 0.143 per healthy run'
    >>> summary(WarningEvent.from_message({**e, "event": "cleared", "cleared_step": 600,
    ...     "lead_time": 300}))
    'router warning resolved on run r1 (blocks.1.moe) at step 600 (back under its threshold), opened at step 450; lead time 300 steps'
    >>> summary(WarningEvent.from_message({**e, "event": "acknowledged",
    ...     "evidence": {"by": "ana", "at": 0, "note": "mine"}}))
    'router warning on run r1 (blocks.1.moe), opened at step 450, acknowledged by ana: mine'
    """  # noqa: E501
    where = f"run {event.run_id}" + (f" ({event.module})" if event.module else "")
    if event.rank is not None:  # per-rank mode: which GPU's stream warned
        where += f" rank {event.rank}"
    kind, family = event.event, event.family
    if kind == "cleared":
        why = _why(event)
        text = (
            f"{family} warning resolved on {where} at step {event.cleared_step} "
            f"({why}), opened at step {event.step}"
        )
    elif kind == "updated":
        text = (
            f"{family} warning on {where} (opened at step {event.step}): the "
            f"loss diverged at step {event.divergence_step}"
        )
    elif kind in PERSON_EVENTS:
        action = _evidence(event)
        text = f"{family} warning on {where}, opened at step {event.step}, {kind} by "
        text += str(action.get("by"))
        if kind == "silenced":
            text += f" until {_when(action['until'])}"
        if action.get("note"):
            text += f": {action['note']}"
        return text
    else:
        rate = _rate(event.false_alarm_rate)
        text = (
            f"{family} warning opened on {where} at step {event.step}, "
            f"{event.role}; false-alarm rate {rate}"
        )
    if event.lead_time is not None:
        text += f"; lead time {event.lead_time} steps"
    return text


def webhook_payload(event: WarningEvent, dashboard_url: str) -> dict[str, Any]:
    """The whole event (its message as it came), plus its state, the run's dashboard link and
    :func:`summary`.

    >>> p = webhook_payload(WarningEvent.from_message({"schema": "foreshock.warning/1",
    ...     "id": "a1", "run_id": "r1", "family": "router", "module": None, "step": 5,
    ...     "role": "cause", "false_alarm_rate": None, "event": "opened", "lead_time": None}),
    ...     "http://d")
    >>> p["id"], p["state"], p["dashboard_url"], p["summary"]
    ('a1', 'open', 'http://d/run?run=r1', 'router warning opened on run r1 at step 5, cause; false-alarm rate not calibrated')
    """  # noqa: E501
    return {
        **event.to_message(),
        "state": STATE[event.event],
        "resolved_by": resolved_by(event),
        "dashboard_url": dashboard_link(dashboard_url, event.run_id),
        "summary": summary(event),
    }


def _mrkdwn(text: Any) -> str:
    """Slack's three control characters escaped (a run id may hold them)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_ICON = {
    "opened": ":rotating_light:",
    "cleared": ":white_check_mark:",
    "updated": ":warning:",
    "acknowledged": ":eyes:",
    "silenced": ":mute:",
}


def slack_payload(event: WarningEvent, dashboard_url: str) -> dict[str, Any]:
    """A Slack incoming-webhook body: ``text`` (notifications, fallback) and the same in blocks.

    >>> p = slack_payload(WarningEvent.from_message({"id": "a1", "run_id": "r<1>",
    ...     "family": "router", "module": "m", "step": 5, "role": "cause",
    ...     "false_alarm_rate": 0.05, "event": "opened", "lead_time": 40,
    ...     "config_version": "v1"}), "http://d")
    >>> print(p["text"])
    :rotating_light: *router* warning opened · run `r&lt;1&gt;` · module `m` · step 5 (cause)
    calibrated false-alarm rate: ≤ 0.05 per healthy run · lead time: 40 steps
    <http://d/run?run=r%3C1%3E|open run r&lt;1&gt; in the dashboard>
    >>> [b["type"] for b in p["blocks"]]
    ['section', 'context']
    >>> print(slack_payload(WarningEvent.from_message({"id": "a1", "run_id": "r1",
    ...     "family": "router", "step": 5, "role": "cause", "event": "cleared",
    ...     "cleared_step": 9, "evidence": {"resolved_by": "run ended"}}),
    ...     "http://d")["text"].splitlines()[0])
    :white_check_mark: *router* warning resolved · run `r1` · opened at step 5 (cause), resolved at step 9: the run ended
    """  # noqa: E501
    kind = event.event
    run = _mrkdwn(event.run_id)
    label = "resolved" if kind == "cleared" else kind
    head = f"{_ICON[kind]} *{_mrkdwn(event.family)}* warning {label} · run `{run}`"
    if event.module:
        head += f" · module `{_mrkdwn(event.module)}`"
    if event.rank is not None:
        head += f" · rank {event.rank}"
    role = _mrkdwn(event.role if event.has("role") else "?")
    action = _evidence(event)
    if kind == "cleared":
        why = _why(event)
        head += (
            f" · opened at step {event.step} ({role}), resolved at step {event.cleared_step}: {why}"
        )
    elif kind in PERSON_EVENTS:
        head += f" · opened at step {event.step} ({role}) · by *{_mrkdwn(action.get('by'))}*"
        if kind == "silenced":
            head += f" until {_when(action['until'])}"
    else:
        head += f" · step {event.step} ({role})"
    facts = [f"calibrated false-alarm rate: {_rate(event.false_alarm_rate)}"]
    if kind in PERSON_EVENTS and action.get("note"):
        facts = [f"note: {_mrkdwn(action['note'])}"]
    if event.divergence_step is not None and kind == "updated":
        facts.append(f"loss diverged at step {event.divergence_step}")
    if event.lead_time is not None:
        facts.append(f"lead time: {event.lead_time} steps")
    link = f"<{dashboard_link(dashboard_url, event.run_id)}|open run {run} in the dashboard>"
    text = f"{head}\n{' · '.join(facts)}\n{link}"
    context = f"warning `{_mrkdwn(event.id)}` · detector config `{_mrkdwn(event.config_version)}`"
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
        ],
    }


def _rfc3339(seconds: float) -> str:
    """Epoch seconds as Alertmanager's RFC 3339 time.

    >>> _rfc3339(0.25)
    '1970-01-01T00:00:00.250Z'
    """
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _labels(event: WarningEvent) -> dict[str, str]:
    """An alert's identity: the stable facts of its warning (no id: see below)."""
    labels = {"alertname": "ForeshockWarning", "family": str(event.family)}
    if event.module:  # Alertmanager treats an empty label as absent: leave it out
        labels["module"] = str(event.module)
    labels["run_id"] = str(event.run_id)
    if event.rank is not None:  # per-rank mode: two ranks' warnings are two alerts
        labels["rank"] = str(event.rank)
    labels["severity"] = SEVERITY.get(event.role or "", "warning")
    return labels


def alertmanager_alert(
    event: WarningEvent, dashboard_url: str, starts_at: float, ends_at: float | None = None
) -> dict[str, Any]:
    """One Alertmanager v2 alert (POST a list of them); ``ends_at`` only for a resolved warning.

    Times are epoch seconds. Labels carry no warning id: one (run, family, module) has at most
    one open warning, and a reopened one is the same alert firing again.

    >>> a = alertmanager_alert(WarningEvent.from_message({"id": "a1", "run_id": "r1",
    ...     "family": "router", "module": "m", "step": 5, "role": "symptom",
    ...     "false_alarm_rate": 0.05, "event": "cleared", "cleared_step": 9, "lead_time": None}),
    ...     "http://d", 0.0, 60.0)
    >>> a["labels"]
    {'alertname': 'ForeshockWarning', 'family': 'router', 'module': 'm', 'run_id': 'r1', 'severity': 'critical'}
    >>> a["startsAt"], a["endsAt"], a["generatorURL"], a["annotations"]["false_alarm_rate"]
    ('1970-01-01T00:00:00.000Z', '1970-01-01T00:01:00.000Z', 'http://d/run?run=r1', '0.05')
    >>> opened = alertmanager_alert(WarningEvent.from_message({"id": "a2", "run_id": "r1",
    ...     "family": "router", "module": None, "step": 5, "role": "cause",
    ...     "false_alarm_rate": None, "event": "opened"}), "http://d", 0.0)
    >>> sorted(opened), sorted(opened["labels"]), opened["annotations"]["false_alarm_rate"]
    (['annotations', 'generatorURL', 'labels', 'startsAt'], ['alertname', 'family', 'run_id', 'severity'], 'uncalibrated')
    """  # noqa: E501
    link = dashboard_link(dashboard_url, event.run_id)
    rate = event.false_alarm_rate
    description = (
        f"foreshock {event.family} warning {event.id} ({event.role}), opened at step {event.step}"
    )
    if event.cleared_step is not None:
        description += f", resolved at step {event.cleared_step}"
        if event.event == "cleared":
            description += f" ({_why(event)})"
    if event.lead_time is not None:
        description += f"; the loss diverged {event.lead_time} steps after it opened"
    alert = {
        "labels": _labels(event),
        "annotations": {
            "summary": summary(event),
            "description": description,
            "false_alarm_rate": "uncalibrated" if rate is None else f"{rate:g}",
            "dashboard": link,
        },
        "startsAt": _rfc3339(starts_at),
        "generatorURL": link,
    }
    if ends_at is not None:
        alert["endsAt"] = _rfc3339(max(ends_at, starts_at))  # an end before its start is a 400
    return alert


def alertmanager_silence(
    event: WarningEvent,
    dashboard_url: str,
    ends_at: float,
    starts_at: float,
    silence_id: str | None = None,
) -> dict[str, Any]:
    """An Alertmanager v2 silence (``POST <am>/api/v2/silences``) of the alert of ``event``'s
    warning, made by the person who acknowledged or silenced it; ``silence_id`` updates one.

    Its matchers are the alert's labels, each exactly, and ``module=""`` for a warning without
    a module (so it matches no alert that has one).

    >>> s = alertmanager_silence(WarningEvent.from_message({"id": "a1", "run_id": "r1",
    ...     "family": "loss", "step": 5, "role": "symptom", "event": "acknowledged",
    ...     "evidence": {"by": "ana", "at": 0.0, "note": None}}), "http://d", 3600.0, 0.0)
    >>> [(m["name"], m["value"]) for m in s["matchers"]]
    [('alertname', 'ForeshockWarning'), ('family', 'loss'), ('run_id', 'r1'), ('severity', 'critical'), ('module', '')]
    >>> s["createdBy"], s["endsAt"], s["comment"]
    ('ana', '1970-01-01T01:00:00.000Z', 'acknowledged in foreshock: warning a1 (http://d/run?run=r1)')
    """  # noqa: E501
    labels = _labels(event)
    if "module" not in labels:
        labels["module"] = ""
    action = _evidence(event)
    comment = f"{event.event} in foreshock: warning {event.id}"
    if action.get("note"):
        comment += f": {action['note']}"
    silence = {
        "matchers": [
            {"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in labels.items()
        ],
        "startsAt": _rfc3339(starts_at),
        "endsAt": _rfc3339(max(ends_at, starts_at + 60)),
        "createdBy": str(action.get("by") or "foreshock"),
        "comment": f"{comment} ({dashboard_link(dashboard_url, event.run_id)})",
    }
    if silence_id is not None:
        silence["id"] = silence_id
    return silence
