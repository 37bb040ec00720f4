"""compose/: the Kafka cluster and the foreshock services, checked without Docker or a network."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import require_tool

from foreshock.cli import build_parser
from foreshock.transport.settings import KafkaSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"

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


def test_only_kafka_1_is_published_on_the_host(brokers) -> None:
    published = {name: b["ports"] for name, b in brokers.items() if b.get("ports")}
    assert published == {"kafka-1": ["19092:19092"]}
    env = env_of(brokers["kafka-1"])
    assert "EXTERNAL://localhost:19092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert "EXTERNAL://:19092" in env["KAFKA_LISTENERS"].split(",")


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
    blocks += [env_of({"environment": v}) for k, v in spec.items() if k.startswith("x-")
               and k.endswith("-env")]  # fmt: skip
    names = {name for env in blocks for name in env if name.startswith("FORESHOCK_")}
    assert names, "no FORESHOCK_* variables at all"
    for name in names:
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
    copied = {part.strip("./") for line in lines if line.startswith("COPY ")
              for part in line.split()[1:-1]}  # fmt: skip
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
    assert set(depends_of(services["dashboard"])) == {"storage"}


def test_detector_scales(services) -> None:
    detector = services["detector"]
    assert "container_name" not in detector
    assert not detector.get("ports")


def test_dashboard_reads_the_storage_volume_read_only(services) -> None:
    (store,) = [v for v in services["storage"]["volumes"] if v.endswith(":/data")]
    volume = store.split(":")[0]
    assert f"{volume}:/data:ro" in services["dashboard"]["volumes"]
    assert "8501:8501" in services["dashboard"]["ports"]


def test_service_commands_are_foreshock_subcommands(foreshock_services) -> None:
    known = subcommands()
    for name, service in foreshock_services.items():
        command = service["command"]
        assert isinstance(command, list) and command[0] == "foreshock", name
        sub = command[1]
        assert sub in known | PENDING, f"{name}: foreshock has no subcommand {sub!r}"
        if sub in known:
            build_parser().parse_args(command[1:])  # exits (SystemExit) on bad arguments


def test_pending_subcommands_have_not_landed() -> None:
    landed = PENDING & subcommands()
    assert not landed, f"remove {sorted(landed)} from PENDING in tests/test_compose.py"


def test_docker_compose_accepts_the_file() -> None:
    docker_compose = require_tool("docker-compose")
    done = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
