"""Security: secrets never reach a log or a terminal, and run ids are checked before they can
touch a path or a query (and every query takes them as bound parameters)."""

from __future__ import annotations

import ast
import logging
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from foreshock.storage.retention import export_run
from foreshock.storage.rows import BatchBuilder, RecordError
from foreshock.storage.store import DeltaStore
from foreshock.transport.settings import KafkaSettings, is_secret, load_settings, redact
from foreshock.transport.wire import RUN_ID_PATTERN, WireError, check_run_id, validate

ROOT = Path(__file__).resolve().parents[1]
SECRET = "hunter2-secret"
SECRETS = {  # librdkafka's properties that hold a secret, and one that may (oauthbearer.config)
    "sasl.password": SECRET,
    "ssl.key.password": SECRET + "-key",
    "ssl.keystore.password": SECRET + "-store",
    "sasl.oauthbearer.client.secret": SECRET + "-oidc",
    "sasl.oauthbearer.config": f"principal=alice token={SECRET}-token",
    "ssl.key.pem": f"-----BEGIN PRIVATE KEY-----{SECRET}-pem",
}
PUBLIC = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "alice",
    "ssl.ca.location": "/etc/ssl/ca.pem",
}

# ---------------------------------------------------------------- secrets


def test_settings_repr_redacts_every_secret_and_keeps_the_rest(caplog):
    settings = KafkaSettings(spool_dir="s", client={**SECRETS, **PUBLIC})
    log = logging.getLogger("foreshock.test")
    with caplog.at_level(logging.DEBUG):
        log.info("settings %s / %r", settings, settings)
        log.info(f"settings {settings} {[settings]} {redact(settings.librdkafka())}")
    for text in (repr(settings), str(settings), caplog.text):
        assert SECRET not in text
        assert all(value in text for value in PUBLIC.values())
        assert text.count("'***'") >= len(SECRETS)
    assert settings.librdkafka()["sasl.password"] == SECRET  # the clients still get it


def test_secret_properties_are_recognised():
    assert all(is_secret(k) for k in SECRETS)
    assert all(is_secret(k) for k in ("SASL.PASSWORD", "sasl_password", "ssl_key"))
    assert not any(is_secret(k) for k in PUBLIC)
    assert not is_secret("ssl.key.location")  # a path, not the key


def test_secrets_from_the_file_and_the_environment_are_redacted(tmp_path):
    config = tmp_path / "foreshock.toml"
    config.write_text(f'[kafka.client]\n"ssl.key.password" = "{SECRET}-file"\n')
    settings = load_settings(config, env={"FORESHOCK_RDKAFKA_SASL_PASSWORD": SECRET})
    assert settings.client == {"ssl.key.password": SECRET + "-file", "sasl.password": SECRET}
    assert SECRET not in repr(settings)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_cli_never_prints_the_sasl_password(tmp_path):
    """`foreshock spool flush` builds a Kafka client from the environment's settings (SASL on,
    librdkafka's security debugging on, every log line at DEBUG shown) against a broker that
    is not there: the password appears in neither stdout nor stderr."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{_free_port()}",
        "FORESHOCK_KAFKA_SPOOL_DIR": str(tmp_path / "spool"),
        "FORESHOCK_RDKAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "FORESHOCK_RDKAFKA_SASL_MECHANISM": "PLAIN",
        "FORESHOCK_RDKAFKA_SASL_USERNAME": "alice",
        "FORESHOCK_RDKAFKA_SASL_PASSWORD": SECRET,
        "FORESHOCK_RDKAFKA_DEBUG": "security,broker",
    }
    show_all_logs = (
        "import logging, sys; logging.basicConfig(level=logging.DEBUG); "
        "from foreshock.app.cli import main; sys.exit(main())"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", show_all_logs, "spool", "flush", "--timeout", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 60
    assert "spool" in done.stdout, done.stderr  # it ran through (nothing to deliver)
    assert SECRET not in done.stdout and SECRET not in done.stderr


# ---------------------------------------------------------------- run ids

REPO_RUN_IDS = [  # what the lab, the demo, the benchmarks, the integrations and the tests use
    "fa-lowprec-s0",
    "lr-high-s12",
    "gbs-small-s1",
    "combined-s2",
    "healthy-s3",
    "fleet-0001",
    "fleet-7",
    "b0-fa-lowprec-s1",
    "overhead-every10",
    "ingest-3",
    "sim-7",
    "dist-1",
    "live-fa",
    "hf-tiny",
    "pl-tiny",
    "my_run_id",
    "123",
    "r",
    "r1",
    "run-r",
    "fresh",
    "smoke",
    "job:42@cluster",
    "exp.v2+lr=3e-4",
    "a" * 200,
]
HOSTILE = [
    "'; DROP TABLE steps; --",
    "../../etc/passwd",
    "/abs",
    "a/b",
    "a\\b",
    "r1\x00",
    "r1\n",
    "",
    "..",
    ".hidden",
    "a b",
    "a" * 201,
    "ünï",
]


def test_the_run_id_rule_takes_every_id_the_repo_makes():
    from foreshock.lab.recorded import shipped_runs
    from foreshock.lab.scenarios import SCENARIOS

    shipped = [p.name.split(".")[0] for p in shipped_runs()]
    lab = [f"{scenario}-s{seed}" for scenario in SCENARIOS for seed in range(20)]
    monitor_default = uuid.uuid4().hex[:12]  # Monitor's (and so the integrations') default
    for run_id in [*REPO_RUN_IDS, *shipped, *lab, monitor_default]:
        assert check_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id", HOSTILE, ids=ascii)
def test_hostile_run_ids_stop_at_the_wire_the_store_and_export(run_id, tmp_path):
    message = {
        "kind": "metrics",
        "schema": "foreshock.metrics/1",
        "run_id": run_id,
        "seq": 0,
        "step": 0,
        "values": {"loss": 1.0},
    }
    with pytest.raises(WireError, match=re.escape(RUN_ID_PATTERN)):
        validate(message)
    with pytest.raises(RecordError, match="run_id"):
        BatchBuilder().add_metrics(message, 0.0)
    with pytest.raises(ValueError, match="not a valid run id"):
        export_run(tmp_path / "store", run_id, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the target folder


@pytest.fixture
def one_run_store(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "history"
    builder = BatchBuilder()
    builder.add_lifecycle({"kind": "start", "run_id": "r1", "seq": 0, "labels": {}}, 1.0)
    builder.add_metrics({"run_id": "r1", "seq": 1, "step": 0, "values": {"loss": 1.0}}, 1.0)
    with DeltaStore(root) as store:
        store.write(builder.take())
    monkeypatch.setenv("FORESHOCK_STORE", str(root))
    return root


@pytest.mark.slow
def test_dashboard_data_takes_run_ids_only_as_query_parameters(one_run_store):
    from foreshock.dashboard import data

    for run_id in [*HOSTILE, "r1' OR '1'='1", "r1%", "*"]:
        assert data.run_page(run_id, ("attn.d2.entropy_mean", "loss")) == {"summary": None}
        assert data.compare((run_id, "r1' OR 1=1 --"), "loss") == {"lines": [], "leads": []}
    assert data.run_ids() == ["r1"]  # nothing was changed or dropped
    assert data.run_page("r1", ("loss",))["summary"]["run_id"] == "r1"


def _sql_calls(path: Path) -> list[tuple[str, ast.Call]]:
    """(enclosing function, call) of every ``<x>.sql(...)`` / ``execute(...)`` in a file."""
    calls = []
    for func in ast.walk(ast.parse(path.read_text())):
        if isinstance(func, ast.FunctionDef):
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("sql", "execute")
                ):
                    calls.append((func.name, node))
    return calls


def test_queries_bind_every_value_and_the_dashboard_has_no_sql():
    """storage/queries.py is the only SQL the pages run: its statements are constants with
    ``?`` placeholders; the one f-string names a table from a fixed list, never a value."""
    calls = _sql_calls(ROOT / "storage" / "queries.py")
    assert len(calls) > 10
    for function, call in calls:
        statement = call.args[0]
        if isinstance(statement, ast.JoinedStr):
            assert function == "run_rows", f"{function}: SQL built with an f-string"
            names = {
                n.id
                for v in statement.values
                if isinstance(v, ast.FormattedValue)
                for n in ast.walk(v.value)
                if isinstance(n, ast.Name)
            }
            assert names == {"table"}
        else:
            assert isinstance(statement, ast.Constant | ast.Name | ast.BinOp) and not (
                isinstance(statement, ast.BinOp) and not isinstance(statement.op, ast.Add)
            ), f"{function}: SQL built with % formatting"
            for part in ast.walk(statement):
                assert not isinstance(part, ast.Call), f"{function}: SQL built by a call"
    for path in (ROOT / "dashboard").rglob("*.py"):
        text = path.read_text()
        assert "duckdb" not in text and not _sql_calls(path), f"SQL in {path}"


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    out.append(address)
    return out


@pytest.mark.slow
def test_the_dashboard_listens_on_127_0_0_1_only_by_default(tmp_path):
    import signal
    import urllib.request

    from foreshock.transport.broker import free_port

    port = free_port()
    cli = [
        sys.executable,
        "-m",
        "foreshock.app.cli",
        "dashboard",
        "--store",
        str(tmp_path),
        "--port",
        str(port),
    ]
    dashboard = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, and no IPv6 or wildcard socket
    finally:
        dashboard.send_signal(signal.SIGTERM)
        _, err = dashboard.communicate(timeout=30)
    assert "unauthenticated" not in err and "no authentication" not in err
