"""Warning delivery against a local HTTP receiver and the real broker: each opened and each
resolved warning reaches every target once (generic JSON, Slack, Alertmanager), through
duplicates, a restart in the same group, a receiver answering 503 and one refusing with 400;
each receiver's courier retries on its own, with backoff, and never blocks."""

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

from foreshock.app.cli import main
from foreshock.detectors.warning_facts import alert_id
from foreshock.notify import ledger, payloads, signing, targets
from foreshock.notify.courier import Courier, Job
from foreshock.notify.delivery import Target
from foreshock.notify.notifier import Notifier, NotifyConfig
from foreshock.transport.envelope import Consumed
from foreshock.transport.topics import ensure_topics
from foreshock.transport.warning import RunWarning, WarningEvent

DASH = "http://dash.example:8501"
RUN = "lr high/s1"  # quoted in links: space and slash
LINK = "http://dash.example:8501/run?run=lr%20high%2Fs1"


class Receiver:
    """Records every request (path, status, JSON body; ``details``: method, headers, raw body,
    time); answers scripted statuses per path. Alertmanager's silences API answers a silence
    id. A path in ``hanging`` answers nothing for ``hang`` s (a receiver that is down but
    accepts connections: the worst case for a sender without its own thread)."""

    def __init__(
        self,
        script: dict[str, list[int]] | None = None,
        always: dict[str, int] | None = None,
        headers: dict[str, dict[str, str]] | None = None,
        hanging: set[str] | None = None,
        hang: float = 1.5,
    ) -> None:
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.always, self.headers = always or {}, headers or {}
        self.hanging, self.hang = set(hanging or ()), hang
        self.requests: list[tuple[str, int, object]] = []
        self.details: list[dict] = []
        self.silences: dict[str, dict] = {}  # Alertmanager's, by id
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                hangs = self.path in receiver.hanging
                with receiver.lock:
                    queue = receiver.script.get(self.path)
                    if hangs:
                        status = 503  # recorded as it comes; answered when the sender is gone
                    else:
                        status = queue.pop(0) if queue else receiver.always.get(self.path, 200)
                    receiver.requests.append((self.path, status, body))
                    receiver.details.append(
                        {
                            "path": self.path,
                            "status": status,
                            "method": self.command,
                            "raw": raw,
                            "headers": dict(self.headers),
                            "time": time.monotonic(),
                        }
                    )
                    answer = receiver._silences_api(self.command, self.path, status, body)
                if hangs:
                    time.sleep(receiver.hang)
                try:
                    self.send_response(status)
                    for name, value in receiver.headers.get(self.path, {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # a hung request's sender is gone

            def do_POST(self) -> None:
                self._answer()

            def do_DELETE(self) -> None:
                self._answer()

            def do_GET(self) -> None:
                self._answer()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _silences_api(self, method: str, path: str, status: int, body: object) -> bytes:
        """Alertmanager's silences, as it keeps them: a POST makes one (or replaces the one
        whose id it names, which expires), a DELETE expires one, a GET lists them all."""
        if status != 200 or "/api/v2/silence" not in path:
            return b"ok"
        if method == "GET":
            return json.dumps(list(self.silences.values())).encode()
        if method == "DELETE":
            silence = self.silences.get(path.rsplit("/", 1)[-1])
            if silence is not None:
                silence["status"] = {"state": "expired"}
            return b"ok"
        number = sum(
            d["path"].endswith("/silences") and d["method"] == "POST" for d in self.details
        )
        made = f"s-{number}"
        if isinstance(body, dict) and body.get("id") in self.silences:
            self.silences[body["id"]]["status"] = {"state": "expired"}
        self.silences[made] = {**(body or {}), "id": made, "status": {"state": "active"}}
        return json.dumps({"silenceID": made}).encode()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def statuses(self, path: str) -> list[int]:
        with self.lock:
            return [s for p, s, _ in self.requests if p == path]

    def bodies(self, path: str) -> list:
        """Bodies of the POSTs to ``path`` that were answered 200 (delivered)."""
        with self.lock:
            posts = [d["method"] == "POST" for d in self.details]
            return [
                b
                for (p, s, b), post in zip(self.requests, posts, strict=True)
                if post and p == path and s == 200
            ]

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
    return RunWarning(
        id=alert_id(run_id, "router", module, step, "v-test"),
        run_id=run_id,
        family="router",
        module=module,
        series=f"router.token_entropy_norm@{module}",
        direction="down",
        step=step,
        role="cause",
        statistic=12.5,
        threshold=8.0,
        false_alarm_rate=0.1429,
        config_version="v-test",
        evidence={"recent": []},
        event=event,
        **extra,
    ).to_message()


A = _event(RUN, "blocks.1.moe", 450)
A_UPDATED = _event(RUN, "blocks.1.moe", 450, "updated", divergence_step=900, lead_time=450)
A_CLEARED = _event(
    RUN, "blocks.1.moe", 450, "cleared", divergence_step=900, lead_time=450, cleared_step=950
)
B = _event("r2", "blocks.0.moe", 300)
B_CLEARED = _event("r2", "blocks.0.moe", 300, "cleared", cleared_step=500)
C = _event("r2", "blocks.3.moe", 700)


def _produce(settings, events: list[dict], garbage: bool = False) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    if garbage:
        producer.produce(settings.warnings_topic, value=b"not json at all")
    for event in events:
        producer.produce(
            settings.warnings_topic, key=event["run_id"].encode(), value=json.dumps(event).encode()
        )
    assert producer.flush(10) == 0


def _targets(receiver: Receiver, down_port: int) -> list[Target]:
    return [
        Target("webhook", receiver.url("/hook")),
        Target("slack", receiver.url("/slack")),
        Target("alertmanager", receiver.url("/am")),
        Target("webhook", receiver.url("/flaky")),
        Target("webhook", receiver.url("/bad")),
        Target("webhook", f"http://127.0.0.1:{down_port}/hook"),
    ]


def _run_notifier(settings, receiver: Receiver, down_port: int, refresh: float = 60.0) -> Notifier:
    notify = Notifier(
        settings,
        NotifyConfig(
            _targets(receiver, down_port),
            DASH,
            group_id="notify-a",
            retries=3,
            backoff=0.05,
            timeout=2.0,
            refresh=refresh,
        ),
    )
    notify.run(threading.Event(), idle_exit=4)
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
    assert first.stats.as_dict() == {
        "delivered": 3 * 4,
        "failed": 3 * 2,
        "duplicates": 2,
        "skipped": 1,
        "replayed": 0,
        "invalid": 1,
        "refreshed": 0,
    }

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
    second = _run_notifier(kafka_settings, receiver, down, refresh=0.5)
    stats = second.stats.as_dict()
    refreshed = stats.pop("refreshed")
    assert stats == {
        "delivered": 2 * 4,
        "failed": 2 * 2,
        "duplicates": 2,
        "skipped": 0,
        "replayed": 6,
        "invalid": 1,
    }
    new = receiver.requests[before:]
    assert sorted((b["id"], b["event"]) for p, _, b in new if p == "/hook") == sorted(
        [(B["id"], "cleared"), (C["id"], "opened")]
    )
    b_alerts = [
        b[0]
        for b in receiver.bodies("/am/api/v2/alerts")
        if b[0]["labels"].get("module") == "blocks.0.moe"
    ]
    assert [("endsAt" in a) for a in b_alerts] == [False, True]
    assert b_alerts[0]["startsAt"] == b_alerts[1]["startsAt"]  # the start, from the replay

    # Alertmanager forgets an alert not re-posted: the one still open (C) is re-posted, every
    # refresh, and the resolved ones (A, B) never again
    b_resolved = next(
        i
        for i, (p, s, b) in enumerate(receiver.requests)
        if p == "/am/api/v2/alerts"
        and "endsAt" in b[0]
        and b[0]["labels"].get("module") == "blocks.0.moe"
    )
    later = [b for p, s, b in receiver.requests[b_resolved + 1 :] if p == "/am/api/v2/alerts"]
    reposts = [b for b in later if b[0]["labels"]["module"] == "blocks.3.moe"]
    assert refreshed >= 2 and len(reposts) >= 2  # C's opening, then its re-posts
    assert all(len(b) == 1 and "endsAt" not in b[0] for b in reposts)
    assert all(b[0]["labels"]["module"] == "blocks.3.moe" for b in later)


def test_updates_are_sent_once_per_divergence_and_spare_resolved_alerts(kafka_settings):
    receiver = Receiver()
    try:
        targets = [
            Target("webhook", receiver.url("/hook")),
            Target("alertmanager", receiver.url("/am/")),
        ]
        notify = Notifier(
            kafka_settings,
            NotifyConfig(targets, DASH, group_id="notify-updates", updates=True, retries=0),
        )
        exact = {**A_UPDATED, "divergence_step": 880, "lead_time": 430}
        for i, event in enumerate([A, A_UPDATED, A_UPDATED, A_CLEARED, exact]):
            typed = WarningEvent.from_message(event)  # as decode_warning hands it over
            notify.handle(Consumed(typed, "foreshock.warnings", 0, i, 1000.0 + i))
        assert notify.wait_idle(10)
        notify.close()
        hooks = receiver.bodies("/hook")
        assert [(b["event"], b["lead_time"]) for b in hooks] == [
            ("opened", None),
            ("updated", 450),
            ("cleared", 450),
            ("updated", 430),
        ]
        assert "lead time 450 steps" in hooks[1]["summary"]
        am = [b[0] for b in receiver.bodies("/am/api/v2/alerts")]
        assert [("endsAt" in a, a["startsAt"]) for a in am] == [
            (False, "1970-01-01T00:16:40.000Z"),
            (False, "1970-01-01T00:16:40.000Z"),
            (True, "1970-01-01T00:16:40.000Z"),
        ]
        assert "diverged 450 steps after" in am[1]["annotations"]["description"]
        assert am[2]["endsAt"] == "1970-01-01T00:16:43.000Z"
        assert notify.stats.duplicates == 1 and notify.stats.delivered == 7
    finally:
        receiver.close()


def _courier(url: str, **kw) -> tuple[Courier, list[tuple[bool, object]]]:
    settled: list[tuple[bool, object]] = []
    courier = Courier(Target("webhook", url), **{"timeout": 2.0, "backoff": 0.1, **kw})
    courier.submit(Job(url, b'{"x": 1}', done=lambda ok, answer: settled.append((ok, answer))))
    assert courier.wait_idle(15)
    courier.close(1.0)
    return courier, settled


@pytest.mark.slow
def test_a_courier_retries_what_may_pass_and_not_what_cannot() -> None:
    receiver = Receiver(
        script={"/flaky": [503, 503], "/busy": [429]},
        always={"/bad": 400, "/down": 500},
        headers={"/busy": {"Retry-After": "1"}},
    )
    try:
        courier, settled = _courier(receiver.url("/flaky"), retries=3)
        assert settled == [(True, None)] and receiver.statuses("/flaky") == [503, 503, 200]
        assert courier.stats.retries == 2 and courier.stats.delivered == 1
        _courier(receiver.url("/busy"), retries=3)
        busy = [d["time"] for d in receiver.details if d["path"] == "/busy"]
        assert len(busy) == 2 and busy[1] - busy[0] >= 0.95  # the 429's Retry-After, not 0.1
        courier, settled = _courier(receiver.url("/bad"), retries=3)
        assert settled == [(False, None)] and receiver.statuses("/bad") == [400]  # not retried
        courier, settled = _courier(receiver.url("/down"), retries=2)
        assert settled == [(False, None)] and receiver.statuses("/down") == [500] * 3
        courier, settled = _courier(f"http://127.0.0.1:{_closed_port()}/", retries=2)
        assert settled == [(False, None)] and courier.stats.retries == 2  # refused: retried
        courier, settled = _courier(receiver.url("/later"), patience=0.0)
        assert settled == [(True, None)]  # patience bounds retries, not the first try
    finally:
        receiver.close()


def test_a_courier_never_blocks_bounds_its_queue_and_leaves_what_it_could_not_send() -> None:
    receiver = Receiver(hanging={"/hang"}, hang=1.0)
    try:
        url, settled = receiver.url("/hang"), []
        courier = Courier(
            Target("webhook", url), timeout=0.3, backoff=0.05, max_delay=0.1, capacity=2
        )
        started = time.monotonic()
        for i in range(4):
            courier.submit(
                Job(url, b"{}", what=f"job {i}", done=lambda ok, _, i=i: settled.append((i, ok)))
            )
        assert time.monotonic() - started < 0.1  # queued, not sent: a hung receiver holds nobody
        time.sleep(0.5)
        courier.close(grace=0.2)
        stats = courier.stats.as_dict()
        # job 0 in flight, 1 dropped for 3, then 2 dropped for... the queue holds 2
        assert stats["dropped"] >= 1 and stats["abandoned"] >= 1 and stats["delivered"] == 0
        dropped = [i for i, ok in settled if not ok]
        assert len(dropped) == stats["dropped"]  # dropped jobs are settled (failed) ...
        assert len(settled) == stats["dropped"] + stats["failed"]  # ... abandoned ones are not
    finally:
        receiver.close()


@pytest.mark.parametrize("module", [payloads, ledger, targets, signing])
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
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "notify",
            "--webhook",
            receiver.url("/hook"),
            "--dashboard-url",
            DASH,
            "--group",
            "notify-cli",
            "--idle-exit",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


def test_every_target_kind_is_a_registered_receiver_with_its_own_flag() -> None:
    """A kind is registered once (receivers.py); the target check and the CLI read it."""
    from foreshock.app.cli import build_parser
    from foreshock.notify.receivers import RECEIVERS
    from foreshock.notify.targets import Target, kinds

    assert kinds() == tuple(RECEIVERS)
    with pytest.raises(ValueError, match="one of webhook, slack, alertmanager"):
        Target("pager", "https://example.com/")
    notify = build_parser().parse_args(["notify", *[f"--{k}=https://h.example/" for k in kinds()]])
    assert [getattr(notify, k)[0].kind for k in kinds()] == list(kinds())
