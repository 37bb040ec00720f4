"""What a warning event looks like to the outside, and how it gets there: standard library only.

Three target kinds, one pure payload builder each, so the shapes are testable without a network:

* ``webhook`` — the whole ``foreshock.warning/1`` event, plus ``dashboard_url`` (the run's page)
  and a one-line ``summary``: receivers that know the schema need nothing else.
* ``slack`` — a Slack incoming-webhook body (``text`` + ``blocks``, mrkdwn); Mattermost and
  Rocket.Chat accept the same ``text``.
* ``alertmanager`` — Prometheus Alertmanager's v2 API (``POST <am>/api/v2/alerts``, a list).
  An alert is identified by its labels, so these are the stable facts of a warning (family,
  module, run); ``endsAt`` is set only when the warning cleared, at the clear time, which makes
  Alertmanager resolve it. Alertmanager also resolves an alert nobody re-posts within its
  ``resolve_timeout``, so the notifier re-posts open warnings (see
  :mod:`foreshock.detectors.notifier`).

:func:`send` POSTs one payload with exponential backoff on what may pass (connection errors,
5xx, 429) and none on what will not (any other 4xx: the payload or the URL is wrong). It never
raises: a notifier's loop must survive a receiver that is down or misconfigured. URLs are
logged by scheme and host only — a Slack webhook URL's path is its secret.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = [
    "KINDS",
    "SEVERITY",
    "Target",
    "alertmanager_alert",
    "check_event",
    "dashboard_link",
    "send",
    "slack_payload",
    "summary",
    "webhook_payload",
]

log = logging.getLogger(__name__)

KINDS = ("webhook", "slack", "alertmanager")

# Alertmanager ``severity`` by role: a symptom (loss, gradient norm) means the run is already
# going; a cause is the early, attributed warning; a secondary one follows a cause already sent.
SEVERITY = {"symptom": "critical", "cause": "warning", "ambiguous": "warning",
            "optimizer": "warning", "secondary": "info"}  # fmt: skip

_AM_PATH = "/api/v2/alerts"
_MAX_DELAY = 60.0


@dataclass(frozen=True)
class Target:
    """Where warnings go: ``kind`` (one of :data:`KINDS`) and its URL.

    >>> Target("alertmanager", "http://am:9093/").endpoint
    'http://am:9093/api/v2/alerts'
    >>> Target("slack", "https://hooks.slack.com/services/T0/B0/secret").where
    'slack https://hooks.slack.com'
    >>> Target("webhook", "file:///etc/passwd")
    Traceback (most recent call last):
    ...
    ValueError: webhook target must be an http(s) URL, got 'file:///etc/passwd'
    """

    kind: str
    url: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown target kind {self.kind!r} (one of {', '.join(KINDS)})")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{self.kind} target must be an http(s) URL, got {self.url!r}")

    @property
    def endpoint(self) -> str:
        """The URL POSTed to: Alertmanager's alerts API under its base URL."""
        if self.kind != "alertmanager" or self.url.rstrip("/").endswith(_AM_PATH):
            return self.url
        return self.url.rstrip("/") + _AM_PATH

    @property
    def where(self) -> str:
        """For logs: kind, scheme and host — never the path (a webhook's secret)."""
        parts = urlsplit(self.url)
        return f"{self.kind} {parts.scheme}://{parts.netloc}"


_TEXT = ("id", "event", "run_id", "family")  # required strings
_OPTIONAL_TEXT = ("module", "series", "direction", "role", "config_version")
_OPTIONAL_INT = ("divergence_step", "lead_time", "cleared_step")
_OPTIONAL_NUMBER = ("statistic", "threshold", "false_alarm_rate")


def check_event(event: Any) -> str | None:
    """Why ``event`` is not a warning event the payload builders can render; None if it is.

    >>> check_event({"schema": "foreshock.warning/1", "id": "a", "event": "opened",
    ...              "run_id": "r1", "family": "router", "step": 5})
    >>> check_event({"schema": "foreshock.warning/1", "id": ["a"], "event": "opened",
    ...              "run_id": "r1", "family": "router", "step": 5})
    "warning event whose 'id' is not a string"
    """
    if not isinstance(event, dict) or event.get("schema") != "foreshock.warning/1":
        return "not a foreshock.warning/1 event"
    missing = [k for k in (*_TEXT, "step") if event.get(k) is None]
    if missing:
        return f"warning event without {missing}"
    for name in _TEXT:
        if not isinstance(event[name], str):
            return f"warning event whose {name!r} is not a string"
    if event["event"] not in ("opened", "cleared", "updated"):
        return f"unknown warning event {event['event'][:40]!r}"
    for name in _OPTIONAL_TEXT:
        if not isinstance(event.get(name), str | None):
            return f"warning event whose {name!r} is not a string or null"
    for name in ("step", *_OPTIONAL_INT):
        value = event.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"warning event whose {name!r} is not an integer"
    for name in _OPTIONAL_NUMBER:
        value = event.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            return f"warning event whose {name!r} is not a finite number"
    return None


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float
        return False


def dashboard_link(dashboard_url: str, run_id: str) -> str:
    """The dashboard's page of one run (its ``run`` query parameter, quoted).

    >>> dashboard_link("http://dash:8501/", "lr high/s1&x")
    'http://dash:8501/run?run=lr%20high%2Fs1%26x'
    """
    return f"{dashboard_url.rstrip('/')}/run?run={quote(run_id, safe='')}"


def _rate(value: float | None) -> str:
    return "not calibrated" if value is None else f"≤ {value:.3g} per healthy run"


def summary(event: dict[str, Any]) -> str:
    """One line for a human: what, where, when, how trustworthy, and the lead time if known.

    >>> e = {"family": "router", "module": "blocks.1.moe", "run_id": "r1", "step": 450,
    ...      "role": "cause", "false_alarm_rate": 0.1429, "event": "opened",
    ...      "lead_time": None, "cleared_step": None}
    >>> summary(e)
    'router warning opened on run r1 (blocks.1.moe) at step 450, cause; false-alarm rate ≤ 0.143 per healthy run'
    >>> summary({**e, "event": "cleared", "cleared_step": 600, "lead_time": 300})
    'router warning cleared on run r1 (blocks.1.moe) at step 600, opened at step 450; lead time 300 steps'
    """  # noqa: E501
    where = f"run {event['run_id']}" + (f" ({event['module']})" if event.get("module") else "")
    kind = event["event"]
    if kind == "cleared":
        cleared = event.get("cleared_step")
        text = (f"{event['family']} warning cleared on {where} at step {cleared}, "
                f"opened at step {event['step']}")  # fmt: skip
    elif kind == "updated":
        text = (f"{event['family']} warning on {where} (opened at step {event['step']}): the "
                f"loss diverged at step {event.get('divergence_step')}")  # fmt: skip
    else:
        rate = _rate(event.get("false_alarm_rate"))
        text = (f"{event['family']} warning opened on {where} at step {event['step']}, "
                f"{event.get('role')}; false-alarm rate {rate}")  # fmt: skip
    if event.get("lead_time") is not None:
        text += f"; lead time {event['lead_time']} steps"
    return text


def webhook_payload(event: dict[str, Any], dashboard_url: str) -> dict[str, Any]:
    """The whole event, plus the run's dashboard link and :func:`summary`.

    >>> p = webhook_payload({"schema": "foreshock.warning/1", "id": "a1", "run_id": "r1",
    ...     "family": "router", "module": None, "step": 5, "role": "cause",
    ...     "false_alarm_rate": None, "event": "opened", "lead_time": None}, "http://d")
    >>> p["id"], p["dashboard_url"], p["summary"]
    ('a1', 'http://d/run?run=r1', 'router warning opened on run r1 at step 5, cause; false-alarm rate not calibrated')
    """  # noqa: E501
    return {**event, "dashboard_url": dashboard_link(dashboard_url, event["run_id"]),
            "summary": summary(event)}  # fmt: skip


def _mrkdwn(text: Any) -> str:
    """Slack's three control characters escaped (a run id may hold them)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(event: dict[str, Any], dashboard_url: str) -> dict[str, Any]:
    """A Slack incoming-webhook body: ``text`` (notifications, fallback) and the same in blocks.

    >>> p = slack_payload({"id": "a1", "run_id": "r<1>", "family": "router", "module": "m",
    ...     "step": 5, "role": "cause", "false_alarm_rate": 0.05, "event": "opened",
    ...     "lead_time": 40, "config_version": "v1"}, "http://d")
    >>> print(p["text"])
    :rotating_light: *router* warning opened · run `r&lt;1&gt;` · module `m` · step 5 (cause)
    calibrated false-alarm rate: ≤ 0.05 per healthy run · lead time: 40 steps
    <http://d/run?run=r%3C1%3E|open run r&lt;1&gt; in the dashboard>
    >>> [b["type"] for b in p["blocks"]]
    ['section', 'context']
    """
    kind = event["event"]
    icon = {"opened": ":rotating_light:", "cleared": ":white_check_mark:"}.get(kind, ":warning:")
    run = _mrkdwn(event["run_id"])
    head = f"{icon} *{_mrkdwn(event['family'])}* warning {kind} · run `{run}`"
    if event.get("module"):
        head += f" · module `{_mrkdwn(event['module'])}`"
    role = _mrkdwn(event.get("role", "?"))
    if kind == "cleared":
        cleared = event.get("cleared_step")
        head += f" · opened at step {event['step']} ({role}), cleared at {cleared}"
    else:
        head += f" · step {event['step']} ({role})"
    facts = [f"calibrated false-alarm rate: {_rate(event.get('false_alarm_rate'))}"]
    if event.get("divergence_step") is not None and kind == "updated":
        facts.append(f"loss diverged at step {event['divergence_step']}")
    if event.get("lead_time") is not None:
        facts.append(f"lead time: {event['lead_time']} steps")
    link = f"<{dashboard_link(dashboard_url, event['run_id'])}|open run {run} in the dashboard>"
    text = f"{head}\n{' · '.join(facts)}\n{link}"
    context = f"warning `{_mrkdwn(event.get('id'))}` · detector config `{_mrkdwn(event.get('config_version'))}`"  # noqa: E501
    return {"text": text, "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
    ]}  # fmt: skip


def _rfc3339(seconds: float) -> str:
    """Epoch seconds as Alertmanager's RFC 3339 time.

    >>> _rfc3339(0.25)
    '1970-01-01T00:00:00.250Z'
    """
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def alertmanager_alert(event: dict[str, Any], dashboard_url: str, starts_at: float,
                       ends_at: float | None = None) -> dict[str, Any]:  # fmt: skip
    """One Alertmanager v2 alert (POST a list of them); ``ends_at`` only for a cleared warning.

    Times are epoch seconds. Labels carry no warning id: one (run, family, module) has at most
    one open warning, and a reopened one is the same alert firing again.

    >>> a = alertmanager_alert({"id": "a1", "run_id": "r1", "family": "router", "module": "m",
    ...     "step": 5, "role": "symptom", "false_alarm_rate": 0.05, "event": "cleared",
    ...     "cleared_step": 9, "lead_time": None}, "http://d", 0.0, 60.0)
    >>> a["labels"]
    {'alertname': 'ForeshockWarning', 'family': 'router', 'module': 'm', 'run_id': 'r1', 'severity': 'critical'}
    >>> a["startsAt"], a["endsAt"], a["generatorURL"], a["annotations"]["false_alarm_rate"]
    ('1970-01-01T00:00:00.000Z', '1970-01-01T00:01:00.000Z', 'http://d/run?run=r1', '0.05')
    >>> opened = alertmanager_alert({"id": "a2", "run_id": "r1", "family": "router",
    ...     "module": None, "step": 5, "role": "cause", "false_alarm_rate": None,
    ...     "event": "opened"}, "http://d", 0.0)
    >>> sorted(opened), sorted(opened["labels"]), opened["annotations"]["false_alarm_rate"]
    (['annotations', 'generatorURL', 'labels', 'startsAt'], ['alertname', 'family', 'run_id', 'severity'], 'uncalibrated')
    """  # noqa: E501
    link = dashboard_link(dashboard_url, event["run_id"])
    labels = {"alertname": "ForeshockWarning", "family": str(event["family"])}
    if event.get("module"):  # Alertmanager treats an empty label as absent: leave it out
        labels["module"] = str(event["module"])
    labels["run_id"] = str(event["run_id"])
    labels["severity"] = SEVERITY.get(event.get("role", ""), "warning")
    rate = event.get("false_alarm_rate")
    description = (f"foreshock {event['family']} warning {event.get('id')} ({event.get('role')}), "
                   f"opened at step {event['step']}")  # fmt: skip
    if event.get("cleared_step") is not None:
        description += f", cleared at step {event['cleared_step']}"
    if event.get("lead_time") is not None:
        description += f"; the loss diverged {event['lead_time']} steps after it opened"
    alert = {
        "labels": labels,
        "annotations": {"summary": summary(event), "description": description,
                        "false_alarm_rate": "uncalibrated" if rate is None else f"{rate:g}",
                        "dashboard": link},
        "startsAt": _rfc3339(starts_at),
        "generatorURL": link,
    }  # fmt: skip
    if ends_at is not None:
        alert["endsAt"] = _rfc3339(max(ends_at, starts_at))  # an end before its start is a 400
    return alert


def _retry_after(exc: urllib.error.HTTPError) -> float:
    try:
        return float(exc.headers.get("Retry-After", 0))
    except (TypeError, ValueError):
        return 0.0  # an HTTP date: fall back to our own backoff


def send(url: str, payload: Any, retries: int = 4, backoff: float = 0.5, timeout: float = 5.0,
         where: str | None = None,
         sleep: Callable[[float], None] = time.sleep) -> bool:  # fmt: skip
    """POST ``payload`` as JSON; True once a 2xx came back. Never raises.

    Connection errors, timeouts, 5xx and 429 are retried ``retries`` times, waiting
    ``backoff``, 2·``backoff``, 4·``backoff``… (at least a 429's ``Retry-After``; at most a
    minute). Other 4xx are logged and not retried: sending the same body again cannot help.
    """
    where = where or "{0.scheme}://{0.netloc}".format(urlsplit(url))
    try:
        data = json.dumps(payload, default=str).encode()
    except (TypeError, ValueError) as exc:
        log.error("foreshock notify: payload for %s is not JSON: %s", where, exc)
        return False
    headers = {"Content-Type": "application/json", "User-Agent": "foreshock-notify"}
    delay = backoff
    for attempt in range(retries + 1):
        wait = delay
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
            return True
        except urllib.error.HTTPError as exc:
            if exc.code != 429 and exc.code < 500:
                body = exc.read(300).decode("utf-8", "replace")
                log.error("foreshock notify: %s refused the payload (HTTP %d, not retried): %s",
                          where, exc.code, body)  # fmt: skip
                return False
            reason = f"HTTP {exc.code}"
            if exc.code == 429:
                wait = max(delay, _retry_after(exc))
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
        except Exception:
            log.exception("foreshock notify: sending to %s failed unexpectedly", where)
            return False
        if attempt == retries:
            log.warning("foreshock notify: %s: %s after %d tries; giving up on this payload",
                        where, reason, retries + 1)  # fmt: skip
            return False
        log.info("foreshock notify: %s: %s; retrying in %.2g s", where, reason, wait)
        sleep(min(wait, _MAX_DELAY))
        delay *= 2
    return False
