"""compose/: the Kafka cluster and the foreshock services, checked without Docker or a network."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import http.server
import re
import shlex
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
from conftest import require_tool

from foreshock import logs
from foreshock.app.cli import build_parser
from foreshock.transport.settings import KafkaSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
README = ROOT / "compose" / "README.md"

# What `docker compose` substitutes for ${VAR:-default} here: the defaults, and a webhook for
# the opt-in notify service (it has no sensible default).
COMPOSE_ENV = {"FORESHOCK_NOTIFY_WEBHOOK": "https://hooks.example/foreshock"}

# Subcommands the compose services run that the CLI does not have yet (none today). Remove a
# name when its subcommand lands; test_pending_subcommands_have_not_landed fails until then.
PENDING: set[str] = set()

MERGE_TAG = "tag:yaml.org,2002:merge"


@pytest.fixture(scope="module")
def yaml():
    return pytest.importorskip("yaml", reason="PyYAML is needed to read the compose file")


@pytest.fixture(scope="module")
def spec(yaml) -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(spec) -> dict[str, dict]:
    return spec["services"]


@pytest.fixture(scope="module")
def brokers(services) -> dict[str, dict]:
    found = {n: s for n, s in services.items() if s.get("image", "").startswith("apache/kafka")}
    assert found, "no apache/kafka services"
    return found


@pytest.fixture(scope="module")
def foreshock_services(services) -> dict[str, dict]:
    found = {name: service for name, service in services.items() if "build" in service}
    assert found, "no services built from the foreshock Dockerfile"
    return found


def env_of(service: dict) -> dict[str, str]:
    """A service's environment as a dict (compose allows a mapping or a list of K=V)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {str(k): None if v is None else str(v) for k, v in env.items()}


def depends_of(service: dict) -> dict[str, str]:
    """depends_on as {service: condition} (the short list form means service_started)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (cond or {}).get("condition", "service_started") for name, cond in deps.items()}


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR-default} substitution, from ``env``."""
    env = COMPOSE_ENV if env is None else env
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: env.get(m[1]) or m[2] or "", text)


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """'NAME://host:port,...' -> {NAME: (host, port)}."""
    found = {}
    for item in interpolate(value).split(","):
        name, address = item.split("://")
        host, port = address.rsplit(":", 1)
        found[name] = (host, int(port))
    return found


def published(service: dict) -> dict[int, int]:
    """ports as {host port: container port} (short syntax, [IP:]HOST:CONTAINER, no ranges)."""
    pairs = [interpolate(str(p)).rsplit(":", 2)[-2:] for p in service.get("ports") or []]
    return {int(host): int(container) for host, container in pairs}


def healthcheck_code(service: dict) -> str:
    """The Python a healthcheck runs (the image has no curl: every check is python -c)."""
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    return test[3]


def one_shot(services: dict[str, dict]) -> set[str]:
    """Services others wait on to finish (service_completed_successfully): no healthcheck."""
    return {
        t
        for s in services.values()
        for t, c in depends_of(s).items()
        if c == "service_completed_successfully"
    }


def subcommands() -> set[str]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def test_three_kraft_brokers_in_one_quorum(brokers) -> None:
    assert len(brokers) == 3
    ids = {name: int(env_of(b)["KAFKA_NODE_ID"]) for name, b in brokers.items()}
    assert sorted(ids.values()) == [1, 2, 3], ids
    expected_voters = {f"{node_id}@{name}:9093" for name, node_id in ids.items()}
    for name, broker in brokers.items():
        env = env_of(broker)
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, name
        assert set(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == expected_voters, name
        assert "CONTROLLER://:9093" in env["KAFKA_LISTENERS"].split(","), name
        assert f"PLAINTEXT://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(","), name
        assert broker["healthcheck"]["test"][1] == "/opt/kafka/bin/kafka-broker-api-versions.sh"
        assert any(str(v).endswith(":/var/lib/kafka/data") for v in broker["volumes"]), name
    assert len({env_of(b)["CLUSTER_ID"] for b in brokers.values()}) == 1, "one shared CLUSTER_ID"


def test_replication_factor_3_and_min_isr_2(brokers, foreshock_services) -> None:
    for name, broker in brokers.items():
        env = env_of(broker)
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2", name
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3", name
    for name, service in foreshock_services.items():
        env = env_of(service)
        assert env["FORESHOCK_KAFKA_REPLICATION_FACTOR"] == "3", name
        assert env["FORESHOCK_KAFKA_PARTITIONS"] == "12", name


def test_topic_auto_creation_disabled(brokers) -> None:
    for name, broker in brokers.items():
        assert env_of(broker)["KAFKA_AUTO_CREATE_TOPICS_ENABLE"].lower() == "false", name


def test_every_broker_has_its_own_external_listener_on_a_host_port_of_its_own(brokers) -> None:
    """A host client bootstraps from any broker and is then sent to each partition's leader
    by its advertised EXTERNAL address: every broker needs one, reachable from the host."""
    host_ports = {}
    for name, broker in brokers.items():
        env = env_of(broker)
        bound = listeners(env["KAFKA_LISTENERS"])
        advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        assert "EXTERNAL" in bound and "EXTERNAL" in advertised, name
        assert set(advertised) <= set(bound), f"{name}: advertises a listener it does not open"
        protocols = dict(
            p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
        )
        assert set(bound) <= set(protocols), name
        assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "PLAINTEXT", name
        assert advertised["PLAINTEXT"] == (name, 9092), name
        host, port = advertised["EXTERNAL"]
        assert host == "localhost", f"{name}: the default external host is localhost"
        assert bound["EXTERNAL"][1] == port, f"{name}: EXTERNAL listens on another port"
        assert published(broker).get(port) == port, f"{name}: {port} not published as {port}"
        host_ports[name] = port
    assert len(set(host_ports.values())) == len(brokers), f"shared host ports: {host_ports}"


def test_the_external_host_is_one_setting_for_all_brokers(brokers) -> None:
    env = {"KAFKA_EXTERNAL_HOST": "gpu-7.lan"}
    advertised = [
        interpolate(env_of(b)["KAFKA_ADVERTISED_LISTENERS"], env) for b in brokers.values()
    ]
    assert {listeners(a)["EXTERNAL"][0] for a in advertised} == {"gpu-7.lan"}


def test_only_the_external_listeners_and_the_dashboard_are_published(services, brokers) -> None:
    for name, service in services.items():
        ports = set(published(service))
        if name in brokers:
            external = listeners(env_of(service)["KAFKA_ADVERTISED_LISTENERS"])["EXTERNAL"][1]
            assert ports == {external}, name
        else:
            assert ports <= {8501}, f"{name} publishes {ports}"


def test_foreshock_services_use_the_shared_env_anchor(yaml, foreshock_services) -> None:
    root = yaml.compose(COMPOSE.read_text())

    def child(node, key: str):
        (value,) = [v for k, v in node.value if k.value == key]
        return value

    anchor = child(root, "x-foreshock-env")
    services = child(root, "services")
    for name in foreshock_services:
        env = child(child(services, name), "environment")
        merged = [v for k, v in env.value if k.tag == MERGE_TAG]
        assert any(v is anchor for v in merged), f"{name}: environment lacks <<: *foreshock-env"


def test_bootstrap_servers_name_exactly_the_brokers(brokers, foreshock_services) -> None:
    for name, service in foreshock_services.items():
        servers = env_of(service)["FORESHOCK_KAFKA_BOOTSTRAP_SERVERS"].split(",")
        hosts = [server.rsplit(":", 1)[0] for server in servers]
        assert sorted(hosts) == sorted(brokers), name
        assert all(server.endswith(":9092") for server in servers), name


def test_every_foreshock_env_var_is_one_the_loader_reads(spec) -> None:
    known = {f.name for f in dataclasses.fields(KafkaSettings)} - {"client"}
    blocks = [env_of(s) for s in spec["services"].values()]
    blocks += [
        env_of({"environment": v})
        for k, v in spec.items()
        if k.startswith("x-") and k.endswith("-env")
    ]
    names = {name for env in blocks for name in env if name.startswith("FORESHOCK_")}
    assert names, "no FORESHOCK_* variables at all"
    for name in names:
        if name == logs.ENV:  # foreshock.logs reads it
            continue
        if name.startswith("FORESHOCK_RDKAFKA_"):
            assert name != "FORESHOCK_RDKAFKA_", name
        elif name.startswith("FORESHOCK_STORE"):  # storage.location reads these
            assert name == "FORESHOCK_STORE" or name.startswith("FORESHOCK_STORE_OPTION_"), name
        else:
            assert name.startswith("FORESHOCK_KAFKA_"), f"{name}: the loader reads no such var"
            field = name.removeprefix("FORESHOCK_KAFKA_").lower()
            assert field in known, f"{name}: KafkaSettings has no field {field!r}"


def test_build_uses_the_compose_dockerfile_from_the_repo_root(foreshock_services) -> None:
    for name, service in foreshock_services.items():
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT, name
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        assert dockerfile == DOCKERFILE, name


def test_dockerfile_installs_the_torch_free_package_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines()]
    copied = {
        part.strip("./")
        for line in lines
        if line.startswith("COPY ")
        for part in line.split()[1:-1]
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values()}
    assert needed <= copied, f"the Dockerfile does not copy {sorted(needed - copied)}"
    assert 'pip install --no-cache-dir ".[dashboard]"' in text
    assert "[torch]" not in text
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}


def test_depends_on_targets_are_services(services) -> None:
    for name, service in services.items():
        for target in depends_of(service):
            assert target in services, f"{name} depends on undefined {target}"


def test_start_order(brokers, services) -> None:
    assert depends_of(services["topics"]) == dict.fromkeys(brokers, "service_healthy")
    assert services["topics"]["restart"] == "on-failure"
    done = {"topics": "service_completed_successfully"}
    assert depends_of(services["detector"]) == done
    assert depends_of(services["storage"]) == done
    assert depends_of(services["notify"]) == done
    assert set(depends_of(services["dashboard"])) == {"storage"}


def test_detector_scales(services) -> None:
    detector = services["detector"]
    assert "container_name" not in detector
    assert not detector.get("ports")


def test_dashboard_reads_the_storage_volume_read_only(services) -> None:
    (store,) = [v for v in services["storage"]["volumes"] if v.endswith(":/data")]
    volume = store.split(":")[0]
    assert f"{volume}:/data:ro" in services["dashboard"]["volumes"]
    assert published(services["dashboard"]) == {8501: 8501}


def test_service_commands_are_foreshock_subcommands(foreshock_services) -> None:
    known = subcommands()
    for name, service in foreshock_services.items():
        command = [interpolate(part) for part in service["command"]]
        assert isinstance(command, list) and command[0] == "foreshock", name
        sub = command[1]
        assert sub in known | PENDING, f"{name}: foreshock has no subcommand {sub!r}"
        if sub in known:
            build_parser().parse_args(command[1:])  # exits (SystemExit) on bad arguments


def test_every_lasting_foreshock_service_has_a_healthcheck(services, foreshock_services) -> None:
    assert one_shot(services) == {"topics"}
    for name, service in foreshock_services.items():
        if name in one_shot(services):
            assert "healthcheck" not in service, f"{name} runs to completion"
            continue
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        compile(healthcheck_code(service), name, "exec")
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name


def option(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_healthchecks_ask_the_port_the_service_serves(foreshock_services) -> None:
    """detector and storage: their --metrics-port's /metrics (bound beyond loopback, so a
    Prometheus on the compose network can scrape each replica); the dashboard: Streamlit's
    health endpoint on its --port; notify (no metrics): a connection to a broker's 9092."""
    for name in ("detector", "storage"):
        command = foreshock_services[name]["command"]
        port = option(command, "--metrics-port")
        assert port and option(command, "--metrics-host") == "0.0.0.0", name
        code = healthcheck_code(foreshock_services[name])
        assert f"'http://127.0.0.1:{port}/metrics'" in code, name
    dashboard = foreshock_services["dashboard"]
    port = option(dashboard["command"], "--port")
    assert f"'http://127.0.0.1:{port}/_stcore/health'" in healthcheck_code(dashboard)
    assert f":{9092:04X}'" in healthcheck_code(foreshock_services["notify"])


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(b"foreshock_messages_consumed_total 0\n")

    def log_message(self, *args: object) -> None:
        pass


def run_check(code: str) -> int:
    return subprocess.run([sys.executable, "-c", code], timeout=30).returncode


def test_the_metrics_healthcheck_passes_only_while_metrics_are_served(foreshock_services) -> None:
    code = healthcheck_code(foreshock_services["detector"])
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    here = code.replace(":9464/", f":{server.server_port}/")
    assert here != code
    assert run_check(here) == 0
    server.shutdown()
    server.server_close()
    assert run_check(here) != 0  # nothing listening


def test_the_notify_healthcheck_needs_an_established_broker_connection(foreshock_services) -> None:
    code = healthcheck_code(foreshock_services["notify"])
    if not glob.glob("/proc/net/tcp*"):
        pytest.skip("no /proc/net/tcp here (not Linux)")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        here = code.replace(f":{9092:04X}'", f":{port:04X}'")
        assert here != code
        assert run_check(here) != 0  # listening, nobody connected
        with socket.create_connection(("127.0.0.1", port)), listener.accept()[0]:
            assert run_check(here) == 0


def test_notify_is_opt_in_and_sends_to_the_configured_webhook(foreshock_services) -> None:
    notify = foreshock_services["notify"]
    assert notify["profiles"] == ["notify"], "without a target it cannot run: opt-in"
    command = [interpolate(part) for part in notify["command"]]
    args = build_parser().parse_args(command[1:])
    assert [t.url for t in args.webhook] == [COMPOSE_ENV["FORESHOCK_NOTIFY_WEBHOOK"]]
    assert args.dashboard_url == "http://localhost:8501"  # the published dashboard


def test_services_log_at_the_level_the_environment_sets(spec) -> None:
    env = env_of({"environment": spec["x-foreshock-env"]})
    assert interpolate(env[logs.ENV], {}) == logs.DEFAULT_LEVEL
    assert interpolate(env[logs.ENV], {logs.ENV: "DEBUG"}) == "DEBUG"


def test_the_readme_describes_this_file(services, brokers) -> None:
    """Every service has a row in compose/README.md's table; its host bootstrap example names
    every broker's external address; nothing there predates the Delta Lake store."""
    text = README.read_text()
    rows = set(re.findall(r"^\| `([\w-]+)", text, flags=re.MULTILINE))
    assert set(services) - set(brokers) <= rows, sorted(set(services) - rows)
    assert any(row.startswith("kafka-") for row in rows)
    addresses = {
        "{}:{}".format(*listeners(env_of(b)["KAFKA_ADVERTISED_LISTENERS"])["EXTERNAL"])
        for b in brokers.values()
    }
    exports = [line for line in text.splitlines() if "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS=" in line]
    assert any(
        set(shlex.split(line)[-1].split("=", 1)[1].split(",")) == addresses for line in exports
    ), addresses
    for stale in ("DuckDB", "arrive with", "until then"):
        assert stale not in text, stale


def test_pending_subcommands_have_not_landed(foreshock_services) -> None:
    """PENDING is exactly what the services run and the CLI lacks: a name whose subcommand
    landed, or that no service runs, fails here, as does a service running an unknown one."""
    run = {interpolate(service["command"][1]) for service in foreshock_services.values()}
    missing = run - subcommands()
    assert PENDING - missing == set(), f"remove {sorted(PENDING - missing)} from PENDING"
    assert missing - PENDING == set(), f"no foreshock subcommand {sorted(missing - PENDING)}"


@pytest.mark.parametrize("profile", [[], ["--profile", "notify"]], ids=["default", "notify"])
def test_docker_compose_accepts_the_file(profile: list[str]) -> None:
    docker_compose = require_tool("docker-compose")
    done = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), *profile, "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
