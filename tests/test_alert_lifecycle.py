"""A warning's life, end to end on the real broker: opened by the detectors, resolved when its
run ends, acknowledged and silenced by people — and how each receiver (an Alertmanager-compatible
one, a signed webhook, Slack) hears it, with one receiver down for a while."""

from __future__ import annotations

import argparse
import base64
import doctest
import json
import logging
import threading
import time
from collections.abc import Callable

import pytest
from _kafka import publish_recorded, service_env
from confluent_kafka import Consumer, TopicPartition
from test_notify import DASH, Receiver, _closed_port, _event, _produce

from foreshock.detectors import alerts
from foreshock.detectors.engine import RunDetector
from foreshock.detectors.replay import replay_run
from foreshock.detectors.worker import DetectorWorker
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.notify.notifier import Notifier, NotifyConfig
from foreshock.notify.signing import verify
from foreshock.notify.targets import Target, notify_targets
from foreshock.operate import warnings_commands
from foreshock.operate.detect_commands import default_config
from foreshock.storage import acks
from foreshock.storage.acks import warning_states
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.sink import StorageSink
from foreshock.storage.store import DeltaStore
from foreshock.transport.envelope import Consumed
from foreshock.transport.settings import SettingsError
from foreshock.transport.topics import ensure_topics
from foreshock.transport.warning import WarningEvent

SECRET = "whsec_" + base64.b64encode(b"lifecycle-test-key-0123456789").decode()
# six warnings (the optimizer test's after the divergence), all open when the run ends (diverged)
RUN = "fa-lowprec-s2"


def _run(name: str):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    run.start["run_id"] = name
    return run


def _wait(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _lower(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _in_thread(service, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    return thread


def test_the_end_of_a_run_resolves_its_open_warnings_once_every_rank_ended():
    run = _run(RUN)
    detector = RunDetector(RUN, default_config())
    events = detector.update({**run.start, "kind": "start"})
    events += detector.update({"kind": "start", "run_id": RUN, "rank": 1})  # a second writer
    for record in run.records:
        events += detector.update({**record, "kind": "metrics"})
    opened = {e.id for e in events if e.event == "opened"}
    assert len(opened) == 6 and not [e for e in events if e.event == "cleared"]
    first = detector.update({**run.end, "kind": "end", "rank": 1})
    assert [e for e in first if e.event == "cleared"] == []  # rank 0 still writes
    last = detector.update({**run.end, "kind": "end", "rank": 0})
    assert {e.id for e in last if e.event == "cleared"} == opened
    for event in last:
        assert event.cleared_step == detector.last_step
        assert event.evidence["resolved_by"] == "run ended"
        assert event.evidence["run_status"] == run.end["status"]
    assert all(a.cleared_step is not None for a in detector.alerts)
    # a statistic back under its threshold says so too
    stat = [
        e for e in replay_run(_run("lr-high-s0"), default_config()).events if e.event == "cleared"
    ]
    assert {e.evidence["resolved_by"] for e in stat} == {"statistic", "run ended"}


def test_a_warning_opens_and_resolves_through_the_broker_while_a_receiver_hangs(kafka_settings):
    """The acceptance test: detector worker → warnings topic → notifier → receivers. The signed
    webhook hangs (answers nothing) until Alertmanager and Slack have heard every warning open
    and resolve; then it comes back and hears all of it, in order, signed."""
    ensure_topics(kafka_settings)
    publish_recorded(kafka_settings, [RUN])
    expected = {e.id for e in replay_run(_run(RUN), default_config()).events}
    assert kafka_settings.partitions == 3
    receiver = Receiver(hanging={"/hook"}, hang=1.0)
    targets = [
        Target("alertmanager", receiver.url("/am")),
        Target("webhook", receiver.url("/hook"), secret=SECRET),
        Target("slack", receiver.url("/slack")),
    ]
    notify = Notifier(
        kafka_settings,
        NotifyConfig(
            targets,
            DASH,
            group_id="life-notify",
            timeout=0.5,
            backoff=0.1,
            max_delay=0.5,
            refresh=0,
        ),
    )
    worker = DetectorWorker(kafka_settings, default_config(), group_id="life-detect")
    stop = threading.Event()
    threads = [_in_thread(worker, stop), _in_thread(notify, stop)]

    def resolved_alerts() -> list[dict]:
        return [b[0] for b in receiver.bodies("/am/api/v2/alerts") if "endsAt" in b[0]]

    try:
        assert _wait(lambda: len(resolved_alerts()) == 5, 40), receiver.requests
        assert _wait(lambda: len(receiver.bodies("/slack")) == 10, 5)
        hung = [d for d in receiver.details if d["path"] == "/hook"]
        assert hung and receiver.bodies("/hook") == []  # down all along: it delayed nobody
        receiver.hanging.clear()
        assert _wait(lambda: len(receiver.bodies("/hook")) == 10, 20)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        receiver.close()

    am = [b[0] for b in receiver.bodies("/am/api/v2/alerts")]
    assert len(am) == 10 and sum("endsAt" not in a for a in am) == 5
    for alert in resolved_alerts():
        assert (
            alert["endsAt"] >= alert["startsAt"]
            and "(the run ended)" in alert["annotations"]["description"]
        )
        (opening,) = [a for a in am if "endsAt" not in a and a["labels"] == alert["labels"]]
        assert opening["startsAt"] == alert["startsAt"]

    hooks = [d for d in receiver.details if d["path"] == "/hook"]
    delivered = [d for d in hooks if d["status"] == 200]
    events = [json.loads(d["raw"]) for d in delivered]
    assert {e["id"] for e in events} == expected
    for wid in expected:
        kinds = [e["event"] for e in events if e["id"] == wid]
        assert kinds == ["opened", "cleared"], kinds  # in order, once each
    for e in events:
        if e["event"] == "cleared":
            assert e["state"] == "resolved" and e["resolved_by"] == "run ended"
            assert e["evidence"]["run_status"] == "diverged" and "the run ended" in e["summary"]
        else:
            assert e["state"] == "open"
    for d in delivered:  # each signed: the receiver can tell it came from us, unaltered
        assert verify(SECRET, d["headers"], d["raw"])
        assert not verify(SECRET, d["headers"], d["raw"].replace(b"cleared", b"opened"))
    for d in hooks:  # a retry is the same message: same webhook-id for the same body
        same = {_lower(h["headers"])["webhook-id"] for h in hooks if h["raw"] == d["raw"]}
        assert len(same) == 1
    slack = [b["text"] for b in receiver.bodies("/slack")]
    assert sum("warning resolved" in t and "the run ended" in t for t in slack) == 5

    assert notify.stats.delivered == 30 and notify.stats.failed == 0
    # every event settled with every receiver: the group committed all of them
    consumer = Consumer(
        {"bootstrap.servers": kafka_settings.bootstrap_servers, "group.id": "life-notify"}
    )
    parts = [
        TopicPartition(kafka_settings.warnings_topic, p) for p in range(kafka_settings.partitions)
    ]
    committed = consumer.committed(parts, timeout=10)
    consumer.close()
    produced = len(replay_run(_run(RUN), default_config()).events)  # one run: one partition
    assert sorted(max(tp.offset, 0) for tp in committed) == [0, 0, produced]


def _cli(argv: list[str]) -> int:
    """``foreshock warnings …`` as the CLI will run it (``--config`` is the CLI's own)."""
    parser = argparse.ArgumentParser(prog="foreshock")
    parser.add_argument("--config")
    warnings_commands.add_warnings_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_people_acknowledge_and_silence_and_every_receiver_hears_it(
    kafka_settings, tmp_path, monkeypatch, capsys
):
    for name, value in service_env(kafka_settings).items():
        monkeypatch.setenv(name, value)
    ensure_topics(kafka_settings)
    a, b = _event("r-ack", "blocks.1.moe", 450), _event("r-ack", "blocks.2.moe", 500)
    store = tmp_path / "store"
    builder = BatchBuilder()
    for event in (a, b):
        builder.add_warning(event, time.time())
    DeltaStore(store).write(builder.take(), 1)
    _produce(kafka_settings, [a, b])
    receiver = Receiver()
    targets = [
        Target("alertmanager", receiver.url("/am")),
        Target("webhook", receiver.url("/hook"), secret=SECRET),
        Target("slack", receiver.url("/slack")),
    ]
    notify = Notifier(
        kafka_settings, NotifyConfig(targets, DASH, group_id="people-notify", refresh=0.5)
    )
    stop = threading.Event()
    thread = _in_thread(notify, stop)

    def hooks(kind: str) -> list[dict]:
        return [h for h in receiver.bodies("/hook") if h["event"] == kind]

    try:
        assert _wait(lambda: len(hooks("opened")) == 2, 30)
        store_arg = ["--store", str(store)]
        assert (
            _cli(["warnings", "ack", a["id"][:8], "--by", "ana", "--note", "on it", *store_arg])
            == 0
        )
        assert _cli(["warnings", "silence", b["id"], "--for", "2h", "--by", "bo", *store_arg]) == 0
        out = capsys.readouterr().out
        assert f"acknowledged warning {a['id']}" in out and "as ana" in out
        assert f"silenced warning {b['id']}" in out and "as bo until" in out
        assert _wait(lambda: len(receiver.bodies("/am/api/v2/silences")) == 2, 20)
        # A resolves; a late acknowledgement of it, and the same silence of B again, go nowhere
        late = alerts.action_event(a, "acknowledged", "cy")
        _produce(kafka_settings, [{**a, "event": "cleared", "cleared_step": 600}, late])
        assert _wait(lambda: any(d["method"] == "DELETE" for d in receiver.details), 20)
        (silence_b,) = hooks("silenced")
        _produce(
            kafka_settings,
            [
                {
                    k: v
                    for k, v in silence_b.items()
                    if k not in ("state", "resolved_by", "dashboard_url", "summary")
                }
            ],
        )
        assert _wait(lambda: notify.stats.duplicates == 1, 20)
        time.sleep(1.2)  # two more re-posts: B (open, silenced) only
    finally:
        stop.set()
        thread.join(30)
        receiver.close()

    (ack,) = hooks("acknowledged")
    assert ack["state"] == "acknowledged" and ack["evidence"]["by"] == "ana"
    assert ack["summary"].endswith("acknowledged by ana: on it")
    assert silence_b["state"] == "silenced" and silence_b["evidence"]["until"] > time.time() + 7000
    texts = [t["text"] for t in receiver.bodies("/slack")]
    assert (
        sum(t.startswith(":eyes:") and "by *ana*" in t and "note: on it" in t for t in texts) == 1
    )
    assert sum(t.startswith(":mute:") and "by *bo* until" in t for t in texts) == 1
    assert not any("*cy*" in t for t in texts) and notify.stats.skipped == 1
    made = receiver.bodies("/am/api/v2/silences")
    assert [s["createdBy"] for s in made] == ["ana", "bo"]
    for silence in made:
        matchers = {m["name"]: m["value"] for m in silence["matchers"]}
        assert matchers["run_id"] == "r-ack" and matchers["alertname"] == "ForeshockWarning"
    assert {m["value"] for m in made[0]["matchers"] if m["name"] == "module"} == {"blocks.1.moe"}
    deletes = [d["path"] for d in receiver.details if d["method"] == "DELETE"]
    assert deletes == ["/am/api/v2/silence/s-1"]  # A's acknowledgement, expired as A resolved
    am = receiver.bodies("/am/api/v2/alerts")
    a_end = next(i for i, body in enumerate(am) if any("endsAt" in x for x in body))
    assert all(x["labels"]["module"] == "blocks.2.moe" for body in am[a_end + 1 :] for x in body)
    assert len(am[a_end + 1 :]) >= 2  # B is silenced, not resolved: it is still re-posted

    # the sink stores people's events like any other: who, when, until, in the state view
    StorageSink(kafka_settings, store, group_id="people-sink").run(threading.Event(), idle_exit=2)
    with open_history(store) as history:
        states = {r["id"]: r for r in warning_states(history)}
        assert warning_states(history, resolved=False)[0]["id"] == b["id"]
    assert states[a["id"]]["state"] == "resolved" and states[a["id"]]["resolved_by"] == "statistic"
    assert states[a["id"]]["acknowledged_by"] in ("ana", "cy")  # "cy" once the sink keys actions
    assert states[b["id"]]["state"] == "silenced" and states[b["id"]]["silenced_by"] == "bo"
    assert states[b["id"]]["silenced_until"] == pytest.approx(silence_b["evidence"]["until"])
    assert _cli(["warnings", "list", *store_arg]) == 0
    listing = capsys.readouterr().out
    assert b["id"] in listing and "bo until" in listing and a["id"] not in listing
    assert _cli(["warnings", "ack", a["id"], "--by", "ana", *store_arg]) == 1  # resolved already
    assert "resolved already" in capsys.readouterr().err


def test_a_restarted_notifier_extends_and_expires_the_silences_it_made_before(kafka_settings):
    """A person silences B for 2 h; the notifier restarts; B resolves. The silence is expired
    (it used to stay, muting B's module for later runs, as the new notifier had lost its id),
    and a renewal of an acknowledgement updates the silence it made instead of adding one."""
    ensure_topics(kafka_settings)
    b, c = _event("r-restart", "blocks.2.moe", 500), _event("r-restart", "blocks.3.moe", 520)
    receiver = Receiver()
    target = Target("alertmanager", receiver.url("/am"))

    def notifier(refresh: float) -> tuple[Notifier, threading.Event, threading.Thread]:
        config = NotifyConfig([target], DASH, group_id="restart-notify", refresh=refresh)
        service, stop = Notifier(kafka_settings, config), threading.Event()
        return service, stop, _in_thread(service, stop)

    _first, stop, thread = notifier(refresh=0)
    try:
        quiet = alerts.action_event(b, "silenced", "bo", until=time.time() + 7200)
        _produce(kafka_settings, [b, c, quiet, alerts.action_event(c, "acknowledged", "ana")])
        assert _wait(lambda: len(receiver.silences) == 2, 30)
        stop.set()
        thread.join(30)
        made = {s["createdBy"]: s["id"] for s in receiver.silences.values()}
        _second, stop, thread = notifier(refresh=0.3)  # its re-posts renew C's acknowledgement
        _produce(kafka_settings, [{**b, "event": "cleared", "cleared_step": 600}])
        assert _wait(lambda: receiver.silences[made["bo"]]["status"]["state"] == "expired", 30)
    finally:
        stop.set()
        thread.join(30)
        receiver.close()
    renewals = [s for s in receiver.bodies("/am/api/v2/silences") if s["createdBy"] == "ana"]
    assert all(s["id"] == made["ana"] for s in renewals[1:])  # updated, never a second one
    live = [s for s in receiver.silences.values() if s["status"]["state"] == "active"]
    assert [s["createdBy"] for s in live] == ["ana"]  # C is still open and acknowledged


def test_receivers_from_the_settings_file_carry_auth_and_no_secret_reaches_a_log(
    kafka_settings, tmp_path, caplog
):
    receiver = Receiver()
    down = _closed_port()
    config = tmp_path / "foreshock.toml"
    config.write_text(f"""
[notify]
secret = "env:HOOK_SECRET"

[[notify.receivers]]
kind = "alertmanager"
url = "{receiver.url("/am")}"
headers = {{ Authorization = "env:AM_TOKEN" }}

[[notify.receivers]]
kind = "webhook"
url = "http://ops:pa55word@127.0.0.1:{receiver.server.server_address[1]}/relay"

[[notify.receivers]]
kind = "slack"
url = "http://127.0.0.1:{down}/services/T0/B0/sl4ck-path-secret"
""")
    env = {"HOOK_SECRET": "hook-s3cret", "AM_TOKEN": "Bearer am-t0ken"}
    cli = [Target("alertmanager", receiver.url("/am")), Target("webhook", receiver.url("/hook"))]
    targets = notify_targets(cli, config, env)
    assert len(targets) == 4  # the command line's Alertmanager is the file's
    shown = repr(targets) + " ".join(t.where for t in targets)
    for secret in ("pa55word", "am-t0ken", "hook-s3cret", "sl4ck"):
        assert secret not in shown
    with pytest.raises(SettingsError, match="AM_TOKEN"):
        notify_targets([], config, {"HOOK_SECRET": "x"})

    caplog.set_level(logging.DEBUG, logger="foreshock")
    notify = Notifier(
        kafka_settings, NotifyConfig(targets, DASH, group_id="auth-notify", retries=1, backoff=0.01)
    )
    try:
        opened = WarningEvent.from_message(_event("r-auth", "blocks.0.moe", 300))
        notify.handle(Consumed(opened, "foreshock.warnings", 0, 0, time.time()))
        assert notify.wait_idle(15)
    finally:
        notify.close()
        receiver.close()
    seen = {d["path"]: d["headers"] for d in receiver.details}
    assert seen["/am/api/v2/alerts"]["Authorization"] == "Bearer am-t0ken"
    basic = base64.b64encode(b"ops:pa55word").decode()
    assert seen["/relay"]["Authorization"] == f"Basic {basic}"
    for path in ("/relay", "/hook"):  # webhooks signed with the default secret
        raw = next(d["raw"] for d in receiver.details if d["path"] == path)
        assert verify("hook-s3cret", seen[path], raw)
    am_headers = {name.lower() for name in seen["/am/api/v2/alerts"]}
    assert "webhook-signature" not in am_headers  # Alertmanager: no secret of its own
    assert (notify.stats.delivered, notify.stats.failed) == (3, 1)  # Slack is down
    for secret in ("pa55word", "am-t0ken", "hook-s3cret", "sl4ck", basic):
        assert secret not in caplog.text
    assert f"slack http://127.0.0.1:{down}" in caplog.text


def test_the_store_keeps_every_persons_event_apart():
    """Two people acknowledging one warning are two events (the sink's key has the action id)."""
    a = _event("r-key", "blocks.0.moe", 1)
    first, second = (alerts.action_event(a, "acknowledged", who) for who in ("ana", "bo"))
    assert acks.event_key(first) != acks.event_key(second)
    assert acks.event_key(a) == (a["id"], "opened", None, None, None)


@pytest.mark.parametrize("module", [alerts, acks, warnings_commands])
def test_state_and_cli_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 1 and result.failed == 0


def test_a_silence_is_bounded_and_an_unbounded_one_stored_earlier_lists(
    kafka_settings, tmp_path, monkeypatch, capsys
):
    """`silence --for 99999999999d` is refused (it used to publish a time no receiver can
    hold, then crash printing it); a store holding such a silence from an earlier version
    still lists its warnings."""
    for name, value in service_env(kafka_settings).items():
        monkeypatch.setenv(name, value)
    warning = _event("r-mute", "blocks.1.moe", 450)
    legacy = alerts.action_event(warning, "silenced", "old", until=1e20)
    store = tmp_path / "store"
    builder = BatchBuilder()
    for event in (warning, legacy):
        builder.add_warning(event, time.time())
    DeltaStore(store).write(builder.take(), 1)
    mute = ["warnings", "silence", warning["id"], "--by", "bo", "--store", str(store)]
    assert _cli([*mute, "--for", "99999999999d"]) == 2
    assert "at most 90 days" in capsys.readouterr().err
    assert _cli([*mute, "--until", "2001-01-01T00:00Z"]) == 2
    assert "in the future" in capsys.readouterr().err
    assert _cli(["warnings", "list", "--store", str(store), "--all"]) == 0
    assert "out of range" in capsys.readouterr().out
