"""Receivers: what each kind of target is sent for a warning event, behind one protocol.

Why: the notifier (:mod:`foreshock.notify.notifier`) owns the consumer, the ledger and the
couriers; what a receiver *gets* is the receiver's own business. A webhook and Slack get one
POST per event (their payloads: :mod:`foreshock.notify.delivery`); Alertmanager gets alerts
that must be re-posted while open, and silences that it keeps ids for, renews and expires. So
a new kind is one new class here, registered in :data:`RECEIVERS` with what its flag says, and
nothing else changes: ``foreshock notify --<kind> URL``, the settings file's ``kind`` and the
target check read the registry (docs/extending.md lists the kinds; a test checks).

Every receiver answers two questions with courier jobs (:class:`~foreshock.notify.courier.Job`):
``jobs`` — what to send for one new event — and ``refresh`` — what to re-send now for the
warnings still open (the ``refresh`` interval of :class:`~foreshock.notify.notifier.NotifyConfig`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote

from foreshock.transport.warning import PERSON_EVENTS, WarningEvent

from .courier import Job
from .delivery import Target, encode
from .known_silences import read_silences
from .payloads import alertmanager_alert, alertmanager_silence, slack_payload, webhook_payload

__all__ = [
    "RECEIVERS",
    "AlertmanagerReceiver",
    "PostReceiver",
    "Receiver",
    "ReceiverKind",
    "receiver_for",
]

Event = WarningEvent


class Receiver(Protocol):
    """One target's view of the warnings (see the module docstring)."""

    target: Target

    def jobs(self, event: Event, started: float, at: float, muted: bool, open_: bool) -> list[Job]:
        """What to send for ``event`` (first seen at ``at``; its warning opened at
        ``started``; ``muted``: acknowledged or silenced; ``open_``: not resolved)."""
        ...

    def refresh(
        self, open_events: dict[str, tuple[Event, float]], acked: dict[str, Event]
    ) -> list[Job]:
        """What to re-send now: ``open_events`` by warning id (event, opened at),
        ``acked`` the acknowledgements by warning id."""
        ...


class PostReceiver:
    """One POST per event, of ``payload(event, dashboard_url)`` (a webhook, Slack). An
    ``updated`` event is not sent while the warning is muted; nothing is re-sent."""

    def __init__(
        self, target: Target, payload: Callable[[Event, str], Any], dashboard: str
    ) -> None:
        self.target, self.payload, self.dashboard = target, payload, dashboard

    def jobs(self, event: Event, started: float, at: float, muted: bool, open_: bool) -> list[Job]:
        if event.event == "updated" and muted:
            return []
        body = encode(self.payload(event, self.dashboard))
        return [Job(self.target.endpoint, body, what=_what(event))]

    def refresh(
        self, open_events: dict[str, tuple[Event, float]], acked: dict[str, Event]
    ) -> list[Job]:
        return []


class AlertmanagerReceiver:
    """Alerts, re-posted while open; a person's acknowledgement or silence as an Alertmanager
    silence, renewed by the re-posts while the warning is open (an acknowledgement lasts
    ``ack_horizon`` s) and expired when it resolves. ``submit`` sends a job later (a silence
    made after its warning resolved is expired at once). ``recover`` reads back the silences an
    earlier notifier made, so they are extended, not duplicated."""

    def __init__(
        self, target: Target, dashboard: str, ack_horizon: float, submit: Callable[[Job], Any]
    ) -> None:
        self.target, self.dashboard, self.ack_horizon = target, dashboard, ack_horizon
        self.submit = submit
        # (warning id, event kind) -> (silence id once made, ends at)
        self.silences: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._lock = threading.Lock()  # couriers report made silences from their threads
        self._reposting = False  # a re-post of the open alerts is queued
        self.reposts = 0  # re-posts queued

    def recover(self, timeout: float) -> None:
        with self._lock:
            self.silences.update(read_silences(self.target, timeout))

    def jobs(self, event: Event, started: float, at: float, muted: bool, open_: bool) -> list[Job]:
        kind = event.event
        if kind == "updated" and not open_:
            return []  # resolved in Alertmanager already; a re-post would fire it again
        if kind in PERSON_EVENTS:
            until = (event.evidence or {}).get("until")
            return [self._silence(event, until or at + self.ack_horizon, at)]
        ends = at if kind == "cleared" else None
        alert = [alertmanager_alert(event, self.dashboard, started, ends)]
        jobs = [Job(self.target.endpoint, encode(alert), what=_what(event))]
        if kind == "cleared":
            jobs += self._expire_all(event.id)
        return jobs

    def refresh(
        self, open_events: dict[str, tuple[Event, float]], acked: dict[str, Event]
    ) -> list[Job]:
        now = time.time()
        jobs = []
        for wid, ack in acked.items():
            with self._lock:
                _, ends = self.silences.get((wid, "acknowledged"), (None, 0.0))
            if wid in open_events and ends - now < self.ack_horizon / 2:
                jobs.append(self._silence(ack, now + self.ack_horizon, now))
        alerts = [alertmanager_alert(e, self.dashboard, s) for e, s in open_events.values()]
        if alerts and not self._reposting:
            self._reposting, self.reposts = True, self.reposts + 1
            jobs.append(
                Job(
                    self.target.endpoint,
                    encode(alerts),
                    what=f"re-post of {len(alerts)} alerts",
                    done=self._reposted,
                )
            )
        return jobs

    def _reposted(self, delivered: bool, answer: Any) -> None:
        self._reposting = False

    def _silence(self, event: Event, ends: float, now: float) -> Job:
        """Make (or extend) the silence of ``event`` (an acknowledgement or a silence)."""
        key: tuple[str, str] = (event.id, event.event)
        with self._lock:
            known, _ = self.silences.get(key, (None, 0.0))
            self.silences[key] = (known, ends)
        body = alertmanager_silence(event, self.dashboard, ends, now, known)

        def made(delivered: bool, answer: Any) -> None:
            made_id = answer.get("silenceID") if isinstance(answer, dict) else None
            if not delivered or not isinstance(made_id, str):
                return
            with self._lock:
                live = key in self.silences  # else the warning resolved meanwhile
                if live:
                    self.silences[key] = (made_id, ends)
            if not live:
                self.submit(self._expire(made_id, event.id))

        what = f"silence of warning {event.id}"
        return Job(f"{self.target.api}/silences", encode(body), done=made, what=what)

    def _expire_all(self, wid: str) -> list[Job]:
        """The resolved warning's silences this notifier made, expired (DELETE)."""
        jobs = []
        with self._lock:
            for key in [k for k in self.silences if k[0] == wid]:
                silence_id, _ = self.silences.pop(key)
                if silence_id is not None:
                    jobs.append(self._expire(silence_id, wid))
        return jobs

    def _expire(self, silence_id: str, wid: str) -> Job:
        return Job(
            f"{self.target.api}/silence/{quote(silence_id, safe='')}",
            None,
            "DELETE",
            what=f"silence of warning {wid}",
        )


def _what(event: Event) -> str:
    return f"{event.event} event of warning {event.id}"


def _webhook(target: Target, dashboard: str, ack_horizon: float, submit: Any) -> Receiver:
    return PostReceiver(target, webhook_payload, dashboard)


def _slack(target: Target, dashboard: str, ack_horizon: float, submit: Any) -> Receiver:
    return PostReceiver(target, slack_payload, dashboard)


class ReceiverKind(NamedTuple):
    """A kind of target: how its receiver is built (target, dashboard URL, acknowledgement
    horizon, submit), and what its ``--<kind> URL`` flag says."""

    build: Callable[[Target, str, float, Callable[[Job], Any]], Receiver]
    help: str


# every kind of target, by name: the one place a receiver is registered
RECEIVERS: dict[str, ReceiverKind] = {
    "webhook": ReceiverKind(_webhook, "POST each warning event as JSON to URL"),
    "slack": ReceiverKind(_slack, "a Slack(-compatible) incoming-webhook URL"),
    "alertmanager": ReceiverKind(AlertmanagerReceiver, "an Alertmanager base URL (v2 API)"),
}


def receiver_for(
    target: Target, dashboard: str, ack_horizon: float, submit: Callable[[Job], Any]
) -> Receiver:
    """The receiver of ``target``'s kind."""
    return RECEIVERS[target.kind].build(target, dashboard, ack_horizon, submit)
