"""Warning delivery against a local HTTP receiver and the real broker: each opened and each
cleared warning reaches every target once (generic JSON, Slack, Alertmanager), through
duplicates, a restart in the same group, a receiver answering 503 and one refusing with 400."""

from __future__ import annotations

import doctest
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from _kafka import service_env
from confluent_kafka import Producer

from foreshock.cli import main
from foreshock.detectors import delivery, notifier
from foreshock.detectors.delivery import Target, send
from foreshock.detectors.engine import Alert, alert_id
from foreshock.detectors.notifier import Notifier
from foreshock.transport.topics import ensure_topics

DASH = "http://dash.example:8501"
RUN = "lr high/s1"  # quoted in links: space and slash
LINK = "http://dash.example:8501/run?run=lr%20high%2Fs1"


class Receiver:
    """Records every POST (path, status, JSON body); answers scripted statuses per path."""

    def __init__(self, script: dict[str, list[int]] | None = None,
                 always: dict[str, int] | None = None,
                 headers: dict[str, dict[str, str]] | None = None) -> None:  # fmt: skip
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.always, self.headers = always or {}, headers or {}
        self.requests: list[tuple[str, int, object]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    queue = receiver.script.get(self.path)
                    status = queue.pop(0) if queue else receiver.always.get(self.path, 200)
                    receiver.requests.append((self.path, status, body))
                self.send_response(status)
                for name, value in receiver.headers.get(self.path, {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def statuses(self, path: str) -> list[int]:
        with self.lock:
            return [s for p, s, _ in self.requests if p == path]

    def bodies(self, path: str) -> list:
        """Bodies of the POSTs to ``path`` that were answered 200 (delivered)."""
        with self.lock:
            return [b for p, s, b in self.requests if p == path and s == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(script={"/flaky": [503, 503]}, always={"/bad": 400})
    yield r
    r.close()


def _closed_port() -> int:
    """A local port nobody listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _event(run_id: str, module: str, step: int, event: str = "opened", **extra) -> dict:
    return Alert(
        id=alert_id(run_id, "router", module, step, "v-test"), run_id=run_id, family="router",
        module=module, series=f"router.token_entropy_norm@{module}", direction="down",
        step=step, role="cause", statistic=12.5, threshold=8.0, false_alarm_rate=0.1429,
        config_version="v-test", evidence={"recent": []}, event=event, **extra,
    ).to_message()  # fmt: skip


A = _event(RUN, "blocks.1.moe", 450)
A_UPDATED = _event(RUN, "blocks.1.moe", 450, "updated", divergence_step=900, lead_time=450)
A_CLEARED = _event(RUN, "blocks.1.moe", 450, "cleared", divergence_step=900, lead_time=450,
                   cleared_step=950)  # fmt: skip
B = _event("r2", "blocks.0.moe", 300)
B_CLEARED = _event("r2", "blocks.0.moe", 300, "cleared", cleared_step=500)
C = _event("r2", "blocks.3.moe", 700)


def _produce(settings, events: list[dict], garbage: bool = False) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    if garbage:
        producer.produce(settings.warnings_topic, value=b"not json at all")
    for event in events:
        producer.produce(settings.warnings_topic, key=event["run_id"].encode(),
                         value=json.dumps(event).encode())  # fmt: skip
    assert producer.flush(10) == 0


def _targets(receiver: Receiver, down_port: int) -> list[Target]:
    return [Target("webhook", receiver.url("/hook")), Target("slack", receiver.url("/slack")),
            Target("alertmanager", receiver.url("/am")),
            Target("webhook", receiver.url("/flaky")), Target("webhook", receiver.url("/bad")),
            Target("webhook", f"http://127.0.0.1:{down_port}/hook")]  # fmt: skip


def _run_notifier(settings, receiver: Receiver, down_port: int) -> Notifier:
    notify = Notifier(settings, _targets(receiver, down_port), DASH, group_id="notify-a",
                      retries=3, backoff=0.05, timeout=2.0)  # fmt: skip
    notify.run(threading.Event(), idle_exit=5)
    return notify


def _ids(bodies: list[dict]) -> list[tuple[str, str]]:
    return sorted((b["id"], b["event"]) for b in bodies)


def test_each_warning_reaches_every_target_once_through_duplicates_and_a_restart(
    kafka_settings, receiver
):
    ensure_topics(kafka_settings)
    down = _closed_port()
    # A opened twice, cleared twice; its lead-time update is not sent (updates=False)
    _produce(kafka_settings, [A, B, A, A_UPDATED, A_CLEARED, A_CLEARED], garbage=True)
    first = _run_notifier(kafka_settings, receiver, down)
    sent = sorted([(A["id"], "opened"), (A["id"], "cleared"), (B["id"], "opened")])
    assert first.stats == {"delivered": 3 * 4, "failed": 3 * 2, "duplicates": 2, "skipped": 1,
                           "replayed": 0, "invalid": 1}  # fmt: skip

    hooks = receiver.bodies("/hook")
    assert _ids(hooks) == sent
    for body in hooks:
        assert body["schema"] == "foreshock.warning/1" and "\n" not in body["summary"]
        assert body["family"] in body["summary"] and str(body["step"]) in body["summary"]
    a_open = next(b for b in hooks if b["id"] == A["id"] and b["event"] == "opened")
    assert a_open["dashboard_url"] == LINK and a_open["evidence"] == {"recent": []}

    slack = receiver.bodies("/slack")
    assert len(slack) == 3 and all(set(s) == {"text", "blocks"} for s in slack)
    assert all(s["blocks"][0]["text"]["type"] == "mrkdwn" for s in slack)
    a_slack = [s["text"] for s in slack if "`lr high/s1`" in s["text"]]
    assert len(a_slack) == 2
    for text in a_slack:
        assert "*router*" in text and "module `blocks.1.moe`" in text and "step 450" in text
        assert "false-alarm rate: ≤ 0.143 per healthy run" in text and f"<{LINK}|" in text
    assert ["lead time: 450 steps" in t for t in a_slack] == [False, True]  # known at clearing

    am = receiver.bodies("/am/api/v2/alerts")
    assert len(am) == 3 and all(isinstance(b, list) and len(b) == 1 for b in am)
    a_alerts = [b[0] for b in am if b[0]["labels"]["run_id"] == RUN]
    opened, cleared = a_alerts
    assert opened["labels"] == {
        "alertname": "ForeshockWarning",
        "family": "router",
        "module": "blocks.1.moe",
        "run_id": RUN,
        "severity": "warning",
    }
    assert "endsAt" not in opened and cleared["endsAt"] >= cleared["startsAt"]
    assert cleared["labels"] == opened["labels"] and cleared["startsAt"] == opened["startsAt"]
    assert opened["generatorURL"] == LINK and opened["annotations"]["dashboard"] == LINK
    assert opened["annotations"]["false_alarm_rate"] == "0.1429"
    assert set(opened["annotations"]) >= {"summary", "description"}

    assert receiver.statuses("/flaky") == [503, 503, 200, 200, 200]  # retried with backoff
    assert _ids(receiver.bodies("/flaky")) == sent
    assert receiver.statuses("/bad") == [400, 400, 400]  # one try per event: not retried

    # Same group, restarted: the history rebuilds the ledger, only what is new goes out
    before = len(receiver.requests)
    _produce(kafka_settings, [B, A, B_CLEARED, C])
    second = _run_notifier(kafka_settings, receiver, down)
    assert second.stats == {"delivered": 2 * 4, "failed": 2 * 2, "duplicates": 2, "skipped": 0,
                            "replayed": 6, "invalid": 1}  # fmt: skip
    new = receiver.requests[before:]
    assert sorted((b["id"], b["event"]) for p, _, b in new if p == "/hook") == sorted(
        [(B["id"], "cleared"), (C["id"], "opened")])  # fmt: skip
    b_alerts = [b[0] for b in receiver.bodies("/am/api/v2/alerts")
                if b[0]["labels"].get("module") == "blocks.0.moe"]  # fmt: skip
    assert [("endsAt" in a) for a in b_alerts] == [False, True]
    assert b_alerts[0]["startsAt"] == b_alerts[1]["startsAt"]  # the start, from the replay

    # Alertmanager forgets an alert not re-posted: the one still open (C) is re-posted
    assert second.refresh_open() == 1
    (refreshed,) = receiver.bodies("/am/api/v2/alerts")[-1]
    assert refreshed["labels"]["module"] == "blocks.3.moe" and "endsAt" not in refreshed


def test_updates_are_sent_once_per_divergence_and_spare_resolved_alerts(kafka_settings):
    receiver = Receiver()
    try:
        targets = [Target("webhook", receiver.url("/hook")),
                   Target("alertmanager", receiver.url("/am/"))]  # fmt: skip
        notify = Notifier(kafka_settings, targets, DASH, group_id="notify-updates",
                          updates=True, retries=0)  # fmt: skip
        exact = {**A_UPDATED, "divergence_step": 880, "lead_time": 430}
        for i, event in enumerate([A, A_UPDATED, A_UPDATED, A_CLEARED, exact]):
            notify.handle({**event, "_partition": 0, "_offset": i, "_time": 1000.0 + i})
        notify.consumer.close()
        hooks = receiver.bodies("/hook")
        assert [(b["event"], b["lead_time"]) for b in hooks] == [
            ("opened", None), ("updated", 450), ("cleared", 450), ("updated", 430)]  # fmt: skip
        assert "lead time 450 steps" in hooks[1]["summary"]
        am = [b[0] for b in receiver.bodies("/am/api/v2/alerts")]
        assert [("endsAt" in a, a["startsAt"]) for a in am] == [
            (False, "1970-01-01T00:16:40.000Z"), (False, "1970-01-01T00:16:40.000Z"),
            (True, "1970-01-01T00:16:40.000Z")]  # fmt: skip
        assert "diverged 450 steps after" in am[1]["annotations"]["description"]
        assert am[2]["endsAt"] == "1970-01-01T00:16:43.000Z"
        assert notify.stats["duplicates"] == 1 and notify.stats["delivered"] == 7
    finally:
        receiver.close()


def test_send_retries_what_may_pass_and_not_what_cannot() -> None:
    receiver = Receiver(script={"/flaky": [503, 503], "/busy": [429]},
                        always={"/bad": 400, "/down": 500},
                        headers={"/busy": {"Retry-After": "1"}})  # fmt: skip
    try:
        waits: list[float] = []
        assert send(receiver.url("/flaky"), {"x": 1}, retries=3, backoff=0.1, sleep=waits.append)
        assert waits == [0.1, 0.2] and receiver.statuses("/flaky") == [503, 503, 200]
        waits.clear()
        assert send(receiver.url("/busy"), {"x": 1}, retries=3, backoff=0.1, sleep=waits.append)
        assert waits == [1.0]  # the 429's Retry-After, over our own backoff
        waits.clear()
        assert not send(receiver.url("/bad"), {"x": 1}, retries=3, sleep=waits.append)
        assert waits == [] and receiver.statuses("/bad") == [400]
        assert not send(receiver.url("/down"), {}, retries=2, backoff=0.1, sleep=waits.append)
        assert waits == [0.1, 0.2] and receiver.statuses("/down") == [500] * 3
        waits.clear()
        refused = f"http://127.0.0.1:{_closed_port()}/"
        assert not send(refused, {}, retries=2, backoff=0.1, sleep=waits.append)
        assert waits == [0.1, 0.2]  # connection errors are retried too
        loop: dict = {}
        loop["self"] = loop
        assert not send(receiver.url("/hook"), loop, sleep=waits.append)  # not JSON: no raise
    finally:
        receiver.close()


@pytest.mark.parametrize("module", [delivery, notifier])
def test_payload_builders_and_ledger_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 3 and result.failed == 0


def test_cli_needs_a_target_and_stops_on_sigterm(kafka_settings, capsys) -> None:
    assert main(["notify", "--dashboard-url", DASH]) == 2
    assert "no target" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["notify", "--slack", "not-a-url"])
    ensure_topics(kafka_settings)
    _produce(kafka_settings, [B])
    receiver = Receiver()
    env = service_env(kafka_settings)
    proc = subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli", "notify", "--webhook", receiver.url("/hook"),
         "--dashboard-url", DASH, "--group", "notify-cli", "--idle-exit", "60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not receiver.bodies("/hook") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ids(receiver.bodies("/hook")) == [(B["id"], "opened")]
        assert receiver.bodies("/hook")[0]["dashboard_url"] == f"{DASH}/run?run=r2"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()
    assert proc.returncode == 0, err
    assert "1 delivered, 0 failed, 0 duplicates" in out
