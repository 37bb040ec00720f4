"""The control topic: ``foreshock warnings act`` asks a running trainer to act on a warning,
signed with an approver's key; the trainer's ``KafkaSink.poll_requests()`` hands the request
over at a step boundary — never blocking, never raising, each request once, only its own
runs', only those made after it started, verified against its allowlist — and ``act --wait``
hears the trainer's answer (its ``action`` record)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from types import SimpleNamespace

import pytest
from _kafka import service_env
from test_notify import _closed_port, _event

from foreshock.delivery.control_requests import ControlRequests
from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.detectors import alerts
from foreshock.operate import warnings_commands
from foreshock.remediation.remedy import Remediator, RemedyPolicy, action_record
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore
from foreshock.transport.approvals import Allowlist, generate_key, sign
from foreshock.transport.control import ControlError, check_request, remedy_request
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import ensure_topics

RUN = "r-act"


def _approver(tmp_path, name: str = "ana") -> tuple[dict, str, str]:
    """A key for ``name`` (its content), its key file and an allowlist file holding it."""
    key, entry = generate_key(name)
    key_file, allowlist = tmp_path / f"{name}.key", tmp_path / "approvers.json"
    key_file.write_text(json.dumps(key))
    allowlist.write_text(json.dumps({"approvers": [entry]}))
    return key, str(key_file), str(allowlist)


def _cli(argv: list[str]) -> int:
    """``foreshock warnings …`` as the CLI runs it (``--config`` is the CLI's own)."""
    parser = argparse.ArgumentParser(prog="foreshock")
    parser.add_argument("--config")
    warnings_commands.add_warnings_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def _store(tmp_path, *events: dict) -> list[str]:
    """A store holding ``events``; the ``--store`` arguments that name it."""
    builder = BatchBuilder()
    for event in events:
        builder.add_warning(event, time.time())
    DeltaStore(tmp_path / "store").write(builder.take(), 1)
    return ["--store", str(tmp_path / "store")]


def _metrics(run_id: str, step: int) -> dict:
    return {"schema": "foreshock.metrics/1", "run_id": run_id, "step": step, "values": {"x": 1.0}}


def _until(get, timeout: float):
    """``get()``'s first truthy value within ``timeout`` s, else the last one."""
    deadline = time.monotonic() + timeout
    while not (value := get()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


class _Trainer:
    """The trainer's side of the remedies: what it was asked to do."""

    def __init__(self) -> None:
        self.held: list[float] = []

    def hold_lr(self, scale: float, since: int | None = None) -> None:
        self.held.append(scale)


# ---------------------------------------------------------------- the request


def test_a_request_says_what_to_do_and_a_bad_one_names_its_field():
    warning = {**_event(RUN, "blocks.1.moe", 450), "evidence": {"recent": [[400, 1.0, 2.0]]}}
    request = remedy_request(warning, "ana", "hold-lr", True, 0.5, now=10.0)
    assert {k: request[k] for k in ("run_id", "warning_id", "family", "module", "step")} == {
        "run_id": RUN,
        "warning_id": warning["id"],
        "family": "router",
        "module": "blocks.1.moe",
        "step": 450,
    }
    assert (request["action"], request["rollback"], request["lr_scale"]) == ("hold-lr", True, 0.5)
    assert request["evidence"] == {"recent": [[400, 1.0, 2.0]]}
    assert check_request(json.loads(json.dumps(request))) == request
    for change, field in [
        ({"action": "Lower LR!"}, "not a remedy's name"),
        ({"action": 3}, "not a remedy's name"),
        ({"lr_scale": 0.0}, "lr_scale"),
        ({"lr_scale": 1.5}, "lr_scale"),
        ({"rollback": "yes"}, "rollback"),
        ({"run_id": "../x"}, "run_id"),
        ({"request_id": ""}, "request_id"),
        ({"step": -1}, "step"),
        ({"evidence": {"recent": [["a"]]}}, "evidence"),
        ({"schema": "foreshock.warning/1"}, "foreshock.control/1"),
    ]:
        with pytest.raises(ControlError, match=field):
            check_request({**request, **change})


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--action", "lower-lr"], "invalid choice: 'lower-lr'"),
        (["--lr-scale", "1.5"], "--lr-scale must be in (0, 1], got 1.5"),
        (["--lr-scale", "0"], "--lr-scale must be in (0, 1], got 0"),
        (["--wait", "-1"], "--wait must be in (0, 3600] s"),
    ],
    ids=["action", "scale-high", "scale-zero", "wait"],
)
def test_act_refuses_bad_arguments_with_a_reason(tmp_path, capsys, argv, said):
    with pytest.raises(SystemExit) as exited:
        _cli(["warnings", "act", "abc", *argv, "--store", str(tmp_path)])
    assert exited.value.code == 2 and said in capsys.readouterr().err


def test_act_refuses_what_no_trainer_could_follow_before_sending_anything(tmp_path, capsys):
    opened, done = _event(RUN, "blocks.1.moe", 450), _event(RUN, "blocks.2.moe", 500)
    store = _store(tmp_path, opened, {**done, "event": "cleared", "cleared_step": 600})
    scale = ["--action", "stop", "--lr-scale", "0.5"]
    assert _cli(["warnings", "act", opened["id"], *scale, *store]) == 2
    assert "--lr-scale is for hold-lr only" in capsys.readouterr().err
    assert _cli(["warnings", "act", done["id"], *store]) == 1
    assert "resolved already" in capsys.readouterr().err
    assert _cli(["warnings", "act", "ffff", *store]) == 1
    assert "no warning 'ffff'" in capsys.readouterr().err
    assert _cli(["warnings", "act", "ffff", "--store", str(tmp_path / "none")]) == 2
    assert _cli(["warnings", "act", opened["id"], *store]) == 2  # no key: nothing is sent
    assert "a trainer follows only signed requests" in capsys.readouterr().err


# ---------------------------------------------------------------- the trainer's side, alone


def _raw(request: dict) -> SimpleNamespace:
    """A consumed message as confluent-kafka gives it."""
    value = json.dumps(request).encode()
    return SimpleNamespace(error=lambda: None, value=lambda: value)


def test_the_trainer_hands_over_its_own_runs_requests_verified_and_refuses_the_rest(tmp_path):
    """Only this sink's runs, only made since it started; each verified against the
    allowlist: a signed one carries its approver, the others are handed over refused (so the
    trainer records why); a replay is refused; other runs' and junk are counted, never
    queued."""
    key, _, allowlist = _approver(tmp_path)
    control = ControlRequests(
        KafkaSettings(spool_dir="s", approvers=allowlist), 100.0, lambda: {"r1"}
    )
    now = time.time()
    warning = _event("r1", "b.1", 450)
    signed = sign(remedy_request(warning, "x", "hold-lr", now=now), key)
    old = sign(remedy_request(warning, "x", "hold-lr", now=50.0), key)  # an earlier producer's
    unsigned = remedy_request(warning, "mallory", "stop", now=now)
    forged = {
        **sign(remedy_request(warning, "x", "hold-lr", lr_scale=0.5, now=now), key),
        "lr_scale": 1e-9,
    }
    ahead = sign(remedy_request(warning, "x", "stop", now=now + 864_000, lifetime=60), key)
    expired = sign(remedy_request(warning, "x", "stop", now=now - 7200, lifetime=60), key)
    other_run = sign(remedy_request(_event("r2", "b.1", 450), "x", "stop", now=now), key)
    for request in (signed, old, unsigned, forged, ahead, expired, other_run, signed):
        control._take(_raw(request))
    for _ in range(30):
        control._take(SimpleNamespace(error=lambda: None, value=lambda: b'{"kind": "x"}'))
    handed = control._mine()
    assert [r.get("refused") for r in handed] == [
        None, "unsigned", "bad signature", "future-dated", "expired", "already taken (a replay)"
    ]  # fmt: skip
    assert handed[0]["approver"] == {"key_id": key["key_id"], "name": "ana"}
    assert handed[0]["by"] == "ana"
    assert (control.other_runs, control.invalid, control.refused) == (1, 30, 5)
    assert control._mine() == []
    none = ControlRequests(KafkaSettings(spool_dir="s"), 100.0, lambda: {"r1"})  # no allowlist
    none._take(_raw(sign(remedy_request(warning, "x", "stop", now=now), key)))
    assert none._mine()[0]["refused"] == "no approvers configured on this trainer"


def test_an_allowlist_that_cannot_be_read_follows_no_request(tmp_path, caplog):
    bad = tmp_path / "approvers.json"
    bad.write_text("{not json")
    control = ControlRequests(KafkaSettings(spool_dir="s", approvers=str(bad)), 0.0, set)
    assert len(control.approvers) == 0
    assert "no remote request will be followed" in caplog.text
    assert isinstance(Allowlist.load(""), Allowlist) and len(Allowlist.load("")) == 0


@pytest.mark.slow
def test_a_broker_that_is_down_never_blocks_nor_raises_into_training(tmp_path):
    down = f"127.0.0.1:{_closed_port()}"
    settings = KafkaSettings(bootstrap_servers=down, spool_dir=str(tmp_path / "spool"))
    sink = KafkaSink(settings, probe_interval=0.2, close_timeout=0.5, confirm_group=None)
    sink.write(_metrics(RUN, 0))
    slowest = 0.0
    for _ in range(50):
        tick = time.perf_counter()
        assert sink.poll_requests() == []
        slowest = max(slowest, time.perf_counter() - tick)
        time.sleep(0.02)
    assert slowest < 0.05
    tick = time.monotonic()
    sink.close()
    assert time.monotonic() - tick < 10
    thread = sink._control._thread
    assert thread is not None
    thread.join(5)  # (close waits 3 s: a probe under way ends by then, but for a slow machine)
    assert not thread.is_alive()
    assert sink.poll_requests() == []  # after close: nothing, no new thread


# ---------------------------------------------------------------- through the broker


def test_act_reaches_the_running_trainer_and_hears_its_answer(
    kafka_settings, tmp_path, monkeypatch, capsys
):
    """A KafkaSink in this process stands in for a running trainer: ``warnings act --wait``
    publishes the request, ``poll_requests()`` hands it over once, the trainer applies it
    (``Remediator.approve``) and writes the action record, and ``act`` prints the answer."""
    for name, value in service_env(kafka_settings).items():
        monkeypatch.setenv(name, value)
    ensure_topics(kafka_settings)
    key, key_file, allowlist = _approver(tmp_path)
    warning, other = _event(RUN, "blocks.1.moe", 450), _event(RUN, "blocks.2.moe", 500)
    store = [*_store(tmp_path, warning, other), "--key", key_file]
    # before the trainer started: a request of an earlier attempt, and another run's
    stale = sign(remedy_request(warning, "ana", "stop"), key)
    alerts.publish(kafka_settings, stale, topic=kafka_settings.control_topic)
    elsewhere = sign(remedy_request(_event("r-other", "b.1", 5), "ana", "stop"), key)
    time.sleep(0.05)  # (the trainer starts after them, by the clocks too)

    trainer_settings = dataclasses.replace(kafka_settings, approvers=allowlist)
    sink = KafkaSink(trainer_settings, close_timeout=5.0, confirm_group=None)
    trainer = _Trainer()
    remediator = Remediator(RemedyPolicy(), trainer)
    try:
        sink.write(_metrics(RUN, 0))
        assert sink.poll_requests() == []  # starts the control thread
        alerts.publish(kafka_settings, elsewhere, topic=kafka_settings.control_topic)
        codes: list[int] = []
        argv = ["warnings", "act", warning["id"][:8], "--action", "hold-lr", "--lr-scale"]
        argv += ["0.25", "--wait", "20", *store]
        acting = threading.Thread(target=lambda: codes.append(_cli(argv)))
        tick = time.monotonic()
        acting.start()
        requests = _until(sink.poll_requests, 15)
        assert len(requests) == 1, requests
        (request,) = requests
        handed = time.monotonic() - tick
        assert (request["warning_id"], request["action"], request["lr_scale"]) == (
            warning["id"],
            "hold-lr",
            0.25,
        )
        assert (request["by"], request["run_id"], request["step"]) == ("ana", RUN, 450)
        assert request["approver"] == {"key_id": key["key_id"], "name": "ana"}
        action = remediator.approve(470, request)
        assert action is not None and action.applied and trainer.held == [0.25]
        sink.write(action_record(RUN, 0, action))
        acting.join(25)
        assert codes == [0]
        out = capsys.readouterr().out
        assert f"request {request['request_id']}" in out
        assert "acknowledged: hold-lr at step 470, applied" in out
        answer = json.loads(out.strip().splitlines()[-1])
        assert (answer["kind"], answer["request_id"], answer["source"]) == (
            "action",
            request["request_id"],
            "approved",
        )
        assert answer["approver"] == {"key_id": key["key_id"], "name": "ana"}
        again = remediator.approve(480, request)  # a request seen twice: applied once
        assert again is not None and not again.applied and trainer.held == [0.25]
        assert again.detail["refused"] == f"request {request['request_id']} was handled already"
        # nobody answers this one: act says so, with its own exit code
        argv = ["warnings", "act", other["id"], "--action", "stop", "--wait", "1.5", *store]
        assert _cli(argv) == 3
        assert "no answer from the trainer within 1.5 s" in capsys.readouterr().err
        late = _until(sink.poll_requests, 10)
        assert [r["warning_id"] for r in late] == [other["id"]]
        assert sink.poll_requests() == []  # each once; never the stale nor the other run's
    finally:
        sink.close()
    assert handed < 15


@pytest.mark.slow
def test_act_reaches_a_training_loop_through_the_product_runner(
    kafka_settings, tmp_path, monkeypatch
):
    """End to end, nothing stood in: a plain training loop (the lab's tiny GPT-MoE, the
    Monitor on a KafkaSink, :class:`~foreshock.remediation.runner.Remediation`) trains in a
    thread; ``warnings act --action hold-lr --lr-scale 0.25 --wait`` reaches it through the
    broker, the runner applies it at a step boundary (every group's learning rate held at a
    quarter), writes the acknowledgement, and the loop trains on."""
    import torch

    from foreshock.lab.arch import build
    from foreshock.lab.model import GPTConfig
    from foreshock.producers.monitor import Monitor, MonitorConfig
    from foreshock.remediation.runner import Remediation

    for name, value in service_env(kafka_settings).items():
        monkeypatch.setenv(name, value)
    ensure_topics(kafka_settings)
    run = "r-act-loop"
    warning = _event(run, "h.1.mlp.gate", 40)
    store = _store(tmp_path, warning)
    torch.manual_seed(0)
    lab = build("gpt-moe", GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, n_experts=4))
    optimizer = torch.optim.AdamW(lab.model.parameters(), lr=1e-3)
    _, key_file, allowlist = _approver(tmp_path)
    trainer_settings = dataclasses.replace(kafka_settings, approvers=allowlist)
    sink = KafkaSink(trainer_settings, close_timeout=5.0, confirm_group=None)
    monitor = Monitor(lab.model, sink, run_id=run, config=MonitorConfig(every=10))
    remediation = Remediation.for_monitor(RemedyPolicy(), monitor, optimizer, warnings=None)
    assert remediation is not None
    done, steps = threading.Event(), []

    def train() -> None:
        x = torch.randint(0, 256, (4, 16))
        for step in range(100_000):
            if done.is_set():
                break
            remediation.before_step(step)
            loss = lab.loss(x, x.roll(-1, 1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            remediation.after_step(step, monitor.step(step, loss=loss))
            steps.append(step)
            time.sleep(0.01)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        argv = ["warnings", "act", warning["id"], "--action", "hold-lr", "--lr-scale", "0.25"]
        code = _cli([*argv, "--key", key_file, "--wait", "30", *store])
        applied_by = len(steps)
        assert code == 0
        (action,) = remediation.actions
        assert (action.kind, action.source, action.applied) == ("hold-lr", "approved", True)
        _until(lambda: len(steps) > applied_by + 5, 10)  # the loop trains on
        assert all(abs(g["lr"] - 0.25e-3) < 1e-12 for g in optimizer.param_groups)
    finally:
        done.set()
        trainer.join(10)
        remediation.close()
        monitor.close()
    assert len(steps) > applied_by + 5
