"""compose/: who can reach the cluster and what each principal may do, checked without Docker.

The default file publishes nothing beyond 127.0.0.1 unless told to; the secure override, merged
over it as ``docker compose -f ... -f ...`` would, puts SASL on every listener a client uses,
turns the authorizer on with nothing allowed by default, and logs every foreshock service in as
a role of its own; ``compose/acls.sh`` runs against stand-ins for Kafka's tools that record
their arguments, so the ACLs checked are the commands it really runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool
from test_compose import COMPOSE, COMPOSE_ENV, ROOT, depends_of, env_of, listeners

import foreshock.delivery.control_requests as control_requests
import foreshock.operate.remedy_requests as remedy_requests
from foreshock.app.cli import build_parser
from foreshock.delivery.kafka_sink import KafkaSinkConfig
from foreshock.transport.settings import load_settings

SECURE = ROOT / "compose" / "docker-compose.secure.yml"
ACLS = ROOT / "compose" / "acls.sh"
COMPOSE_README = ROOT / "compose" / "README.md"
TRANSPORT = ROOT / "docs" / "transport.md"

ROLES = ("admin", "trainer", "detector", "sink", "notify", "approver")
SUPER_USER = "broker"
# Who each foreshock service is in the secured cluster (the dashboard reads the store only).
SERVICE_ROLES = {"topics": "admin", "detector": "detector", "storage": "sink", "notify": "notify"}
NO_KAFKA = {"dashboard"}
SASL_PROTOCOLS = {"SASL_PLAINTEXT", "SASL_SSL"}
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# Environment keys the apache/kafka image does not turn into server properties.
NOT_PROPERTIES = {
    "KAFKA_VERSION",
    "KAFKA_HEAP_OPT",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
    "KAFKA_JMX_HOSTNAME",
}


def password_variable(role: str) -> str:
    return f"FORESHOCK_{role.upper()}_PASSWORD"


# Stand-in passwords, one per principal, each recognisable in what the script runs.
PASSWORDS = {password_variable(r): f"{r}-pw-0123456789abcdef" for r in (SUPER_USER, *ROLES)}
PASSWORD_REF = re.compile(r"^\$\{(FORESHOCK_[A-Z]+_PASSWORD):\?[^}]+\}$")


def resolve(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ``$$``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?m}``, ``${V?m}``
    (a required variable that is missing raises, as compose refuses to start)."""

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        name, op, arg = m["name"], m["op"] or "", m["arg"] or ""
        value = env.get(name)
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("?") and unset:
            raise KeyError(f"required variable {name} is missing: {arg}")
        if op.endswith("-") and unset:
            return arg
        return value or ""

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}", one, text)


APPENDED = {"ports", "volumes", "expose", "extra_hosts", "dns", "env_file"}


def merge(base, override, key: str | None = None):
    """``docker compose -f base -f override``: mappings merge key by key (environment,
    depends_on, healthcheck), ports and volumes are added to the base's, anything else is
    replaced (command, a healthcheck's test)."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if key in APPENDED and isinstance(base, list) and isinstance(override, list):
        return base + [item for item in override if item not in base]
    return override


def bindings(service: dict) -> list[tuple[str, str | None, int, int]]:
    """Published ports as (as written, host address or None, host port, container port): the
    short syntax ``[IP:]HOST:CONTAINER`` (IPv6 in brackets) or the long one (``host_ip``)."""
    found = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            raw = str(entry.get("host_ip", ""))
            ip = resolve(raw, {}) or None
            found.append((raw, ip, int(entry["published"]), int(entry["target"])))
            continue
        text = resolve(str(entry), {})
        parts = text.rsplit(":", 2)
        ip = parts[0].strip("[]") if len(parts) == 3 else None
        found.append((str(entry), ip, int(parts[-2]), int(parts[-1].split("/")[0])))
    return found


def broker_properties(env: dict[str, str | None]) -> dict[str, str]:
    """The server properties the apache/kafka image writes from a broker's environment
    (KafkaDockerWrapper: KAFKA_ dropped, lower case, ``_`` → ``.``, ``___`` → ``-``,
    ``__`` → ``_``), the values interpolated with the stand-in passwords."""
    props = {}
    for key, value in env.items():
        if key.startswith("KAFKA_") and key not in NOT_PROPERTIES and value is not None:
            name = key.replace("KAFKA_", "").lower().replace("_", ".")
            props[name.replace("...", "-").replace("..", "_")] = resolve(value, PASSWORDS)
    return props


@pytest.fixture(scope="module")
def yaml():
    return pytest.importorskip("yaml", reason="PyYAML is needed to read the compose files")


@pytest.fixture(scope="module")
def base(yaml) -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def override(yaml) -> dict:
    return yaml.safe_load(SECURE.read_text())


@pytest.fixture(scope="module")
def secure(base, override) -> dict[str, dict]:
    """The services of the secured cluster: the override merged over the default file."""
    return merge(base, override)["services"]


@pytest.fixture(scope="module")
def brokers(secure) -> dict[str, dict]:
    found = {n: s for n, s in secure.items() if str(s.get("image", "")).startswith("apache/kafka")}
    found = {n: s for n, s in found.items() if "KAFKA_NODE_ID" in env_of(s)}
    assert len(found) == 3, sorted(found)
    return found


# ---- who can reach it ---------------------------------------------------------------------


def test_every_published_port_of_the_default_file_binds_loopback(base) -> None:
    """No port is published on every address (0.0.0.0, the default when none is written): each
    names its host address, 127.0.0.1 unless a FORESHOCK_*BIND variable says otherwise."""
    seen = {}
    for name, service in base["services"].items():
        for raw, ip, host, container in bindings(service):
            assert ip is not None, f"{name}: {raw!r} publishes on every address"
            assert ip == "127.0.0.1", f"{name}: {raw!r} binds {ip} by default"
            variable = re.match(r"^\$\{(FORESHOCK_\w*BIND):-127\.0\.0\.1\}:", raw)
            assert variable, f"{name}: {raw!r}: the address is not a FORESHOCK_*BIND setting"
            opened = bindings({"ports": [resolve(raw, {variable[1]: "0.0.0.0"})]})
            assert opened[0][1] == "0.0.0.0", f"{name}: {variable[1]} does not open {raw!r}"
            seen[host] = (name, container, variable[1])
    assert set(seen) == {19092, 29092, 39092, 8501}, seen
    assert seen[8501][2] != seen[19092][2], "the dashboard has a bind setting of its own"


def test_the_bindings_parser_sees_what_compose_would_publish_everywhere() -> None:
    for entry in ("8501:8501", "0.0.0.0:8501:8501", {"published": 8501, "target": 8501}):
        ((_, ip, host, _),) = bindings({"ports": [entry]})
        assert host == 8501 and ip in (None, "0.0.0.0"), entry
    assert bindings({"ports": ["[::1]:8501:8501"]})[0][1] == "::1"


def test_the_secure_override_publishes_nothing_more(override) -> None:
    """Compose adds an override's ports to the base's: any here would be another binding."""
    for name, service in override["services"].items():
        assert "ports" not in service, f"{name} publishes ports of its own"


# ---- the brokers --------------------------------------------------------------------------


def test_every_listener_a_client_uses_is_sasl_with_scram(brokers) -> None:
    for name, broker in brokers.items():
        env = env_of(broker)
        props = broker_properties(env)
        protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
        bound = listeners(env["KAFKA_LISTENERS"])
        advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        assert set(advertised) <= set(bound) <= set(protocols), name
        for listener in bound:  # the controller's too: nothing listens in the clear
            assert protocols[listener] in SASL_PROTOCOLS, f"{name}: {listener} is not SASL"
        for listener in advertised:  # what clients are handed: SCRAM, every login checked
            key = f"listener.name.{listener.lower()}.sasl.enabled.mechanisms"
            mechanisms = props[key].split(",")
            assert "SCRAM-SHA-512" in mechanisms, f"{name}: {listener} has no SCRAM-SHA-512"
            assert set(mechanisms) <= {"SCRAM-SHA-512", "PLAIN"}, f"{name}: {key}"
        assert props["listener.name.external.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
        assert advertised["INTERNAL"] == (name, 9092), "the services keep kafka-N:9092"
        for listener in bound:
            key = f"listener.name.{listener.lower()}.sasl.enabled.mechanisms"
            for mechanism in props[key].split(","):
                jaas = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
                assert props.get(jaas, "").endswith(";"), f"{name}: no {jaas}"


def test_brokers_log_in_to_each_other_as_the_one_super_user(brokers) -> None:
    for name, broker in brokers.items():
        env = env_of(broker)
        props = broker_properties(env)
        inter = props["inter.broker.listener.name"]
        controller = props["controller.listener.names"]
        assert inter in listeners(env["KAFKA_ADVERTISED_LISTENERS"]), name
        for listener, mechanism in (
            (inter, props["sasl.mechanism.inter.broker.protocol"]),
            (controller, props["sasl.mechanism.controller.protocol"]),
        ):
            lowered = listener.lower()
            assert mechanism in props[f"listener.name.{lowered}.sasl.enabled.mechanisms"]
            jaas = props[f"listener.name.{lowered}.{mechanism.lower()}.sasl.jaas.config"]
            password = PASSWORDS[password_variable(SUPER_USER)]
            assert f'username="{SUPER_USER}"' in jaas and f'password="{password}"' in jaas
        assert props["super.users"] == f"User:{SUPER_USER}", name


def test_acls_are_on_and_nothing_is_allowed_without_one(brokers) -> None:
    for name, broker in brokers.items():
        props = broker_properties(env_of(broker))
        assert props["authorizer.class.name"] == STANDARD_AUTHORIZER, name
        assert props["allow.everyone.if.no.acl.found"] == "false", name


def test_no_password_is_written_in_the_files(override) -> None:
    """Every password is a required ${FORESHOCK_*_PASSWORD:?...}: from the environment or an
    env file, never a value in the file (nor a default compose would fall back to)."""
    text = SECURE.read_text()
    for found in re.findall(r'(?:password|user_\w+)="([^"]*)"', text):
        assert PASSWORD_REF.match(found), found
    for name, service in override["services"].items():
        for key, value in env_of(service).items():
            if "PASSWORD" in key:
                assert value is not None and PASSWORD_REF.match(value), f"{name}: {key}"
    with pytest.raises(KeyError, match="FORESHOCK_TRAINER_PASSWORD"):
        resolve("${FORESHOCK_TRAINER_PASSWORD:?see compose/docker-compose.secure.yml}", {})


def test_the_brokers_healthcheck_logs_in(brokers, secure) -> None:
    for name, broker in brokers.items():
        test = broker["healthcheck"]["test"]
        assert test[:3] == ["CMD", "bash", "/opt/foreshock/acls.sh"] and test[3] == "ping"
        port = listeners(env_of(broker)["KAFKA_ADVERTISED_LISTENERS"])["INTERNAL"][1]
        assert test[4:] == [f"localhost:{port}"], name
        assert "./acls.sh:/opt/foreshock/acls.sh:ro" in broker["volumes"], name
        assert {"interval", "timeout", "retries", "start_period"} <= set(broker["healthcheck"])
        password = env_of(broker)[password_variable(SUPER_USER)]
        assert PASSWORD_REF.match(password)[1] == password_variable(SUPER_USER), name


# ---- the services -------------------------------------------------------------------------


def test_every_foreshock_service_logs_in_as_a_role_of_its_own(base, secure) -> None:
    foreshock = {name for name, service in base["services"].items() if "build" in service}
    assert foreshock == set(SERVICE_ROLES) | NO_KAFKA, sorted(foreshock)
    for name in foreshock:
        env = env_of(secure[name])
        if name in NO_KAFKA:  # `foreshock dashboard` reads the store, never Kafka: no login
            assert secure[name]["command"][1] == name
            assert not any(k.startswith("FORESHOCK_RDKAFKA_SASL") for k in env), name
            continue
        role = SERVICE_ROLES[name]
        assert env["FORESHOCK_RDKAFKA_SASL_USERNAME"] == role, name
        ref = PASSWORD_REF.match(env["FORESHOCK_RDKAFKA_SASL_PASSWORD"] or "")
        assert ref and ref[1] == password_variable(role), f"{name}: not {role}'s password"
        others = [v for v in env.values() if v and "_PASSWORD" in v]
        assert len(others) == 1, f"{name} sees another principal's password"
        # what the loader makes of it (transport/settings.py): the librdkafka login
        resolved = {k: resolve(v, {**COMPOSE_ENV, **PASSWORDS}) for k, v in env.items() if v}
        client = load_settings(env=resolved).client
        assert client["security.protocol"] in SASL_PROTOCOLS, name
        assert client["sasl.mechanisms"] == "SCRAM-SHA-512", name
        assert client["sasl.username"] == role, name
        assert client["sasl.password"] == PASSWORDS[password_variable(role)], name
    assert SUPER_USER not in SERVICE_ROLES.values()


def test_the_acls_service_runs_before_any_foreshock_service(brokers, secure) -> None:
    acls = secure["acls"]
    assert acls["image"] == next(iter(brokers.values()))["image"], "Kafka's own tools"
    assert acls["entrypoint"] == ["bash", "/opt/foreshock/acls.sh"]
    assert acls["command"] == ["apply"]
    assert "./acls.sh:/opt/foreshock/acls.sh:ro" in acls["volumes"]
    assert acls["restart"] == "on-failure"
    assert depends_of(acls) == dict.fromkeys(brokers, "service_healthy")
    env = env_of(acls)
    for who in (SUPER_USER, *ROLES):
        ref = PASSWORD_REF.match(env.get(password_variable(who)) or "")
        assert ref and ref[1] == password_variable(who), who
    internal = {
        "{}:{}".format(*listeners(env_of(b)["KAFKA_ADVERTISED_LISTENERS"])["INTERNAL"])
        for b in brokers.values()
    }
    assert set(env["FORESHOCK_ACLS_BOOTSTRAP"].split(",")) == internal
    assert depends_of(secure["topics"])["acls"] == "service_completed_successfully"
    for name in SERVICE_ROLES:  # every other service waits on topics, which waits on acls
        if name != "topics":
            assert depends_of(secure[name]).get("topics") == "service_completed_successfully"


# ---- the ACLs, as acls.sh adds them --------------------------------------------------------

STUB = """#!/usr/bin/env bash
# a stand-in for one of Kafka's tools: records its arguments (and its client config)
n=$(wc -l <"$STUB_LOG")
{ printf '%s' "${0##*/}"; printf '\\x1f%s' "$@"; printf '\\n'; } >>"$STUB_LOG"
while [ $# -gt 0 ]; do
    if [ "$1" = --command-config ]; then cp "$2" "$STUB_LOG.config.$n"; fi
    shift
done
"""
TOOLS = ("kafka-acls.sh", "kafka-configs.sh", "kafka-broker-api-versions.sh")


@dataclasses.dataclass
class Run:
    returncode: int
    stderr: str
    calls: list[list[str]]  # each tool's name, then its arguments
    configs: dict[int, str]  # call number -> the client config it was given


def run_acls(tmp: Path, *args: str, **env: str) -> Run:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS:
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    log = tmp / "calls.log"
    log.write_text("")
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp)}
    environ["TMPDIR"] = str(tmp)  # where its login file goes (and must be gone from)
    environ |= {"FORESHOCK_ACLS_BIN": str(bin_dir), "STUB_LOG": str(log), **env}
    done = subprocess.run(
        ["bash", str(ACLS), *args], env=environ, capture_output=True, text=True, timeout=60
    )
    calls = [line.split("\x1f") for line in log.read_text().splitlines()]
    configs = {int(p.name.rsplit(".", 1)[1]): p.read_text() for p in tmp.glob("calls.log.config.*")}
    return Run(done.returncode, done.stderr, calls, configs)


@dataclasses.dataclass(frozen=True)
class Grant:
    principal: str  # without User:
    operation: str
    kind: str  # topic, group, cluster, transactional-id
    name: str
    pattern: str  # literal, prefixed


def options(arguments: list[str], multi: set[str], flags: set[str]) -> dict[str, list[str]]:
    """A Kafka tool's ``--option value`` arguments (``multi`` may repeat, ``flags`` take none)."""
    found: dict[str, list[str]] = {}
    words = iter(arguments)
    for word in words:
        assert word.startswith("--"), f"stray argument {word!r} in {arguments}"
        name = word[2:]
        value = "" if name in flags else next(words)
        assert name in multi or name not in found, f"--{name} twice in {arguments}"
        found.setdefault(name, []).append(value)
    return found


ACL_MULTI = {"allow-principal", "deny-principal", "operation", "topic", "group"}
ACL_FLAGS = {"add", "remove", "list", "cluster", "force"}
KNOWN_ACL_OPTIONS = ACL_MULTI | ACL_FLAGS | {"bootstrap-server", "command-config"}
KNOWN_ACL_OPTIONS |= {"resource-pattern-type", "transactional-id"}


def grants(run: Run) -> set[Grant]:
    """Every ACL the run added, one (principal, operation, resource) each."""
    found = set()
    for tool, *arguments in run.calls:
        if tool != "kafka-acls.sh":
            continue
        opts = options(arguments, ACL_MULTI, ACL_FLAGS)
        assert set(opts) <= KNOWN_ACL_OPTIONS, sorted(opts)
        if "add" not in opts:
            assert "remove" not in opts, "acls.sh removes nothing"
            continue
        assert "deny-principal" not in opts, "nothing is allowed by default: no deny needed"
        pattern = opts.get("resource-pattern-type", ["literal"])[0].lower()
        resources = [("topic", t) for t in opts.get("topic", [])]
        resources += [("group", g) for g in opts.get("group", [])]
        resources += [("transactional-id", t) for t in opts.get("transactional-id", [])]
        resources += [("cluster", "kafka-cluster")] if "cluster" in opts else []
        assert resources, arguments
        for principal in opts["allow-principal"]:
            assert principal.startswith("User:"), principal
            for operation in opts["operation"]:
                for kind, name in resources:
                    found.add(Grant(principal[5:], operation.lower(), kind, name, pattern))
    return found


IMPLIES_DESCRIBE = {"describe", "read", "write", "delete", "alter", "all"}


def can(found: set[Grant], principal: str, operation: str, kind: str, name: str) -> bool:
    """Whether Kafka's authorizer would allow it: ``All`` allows everything; Read, Write,
    Delete and Alter each imply Describe; principal ``User:*``, resource ``*`` and prefixed
    patterns match more than one name."""
    for g in found:
        if g.principal not in (principal, "*") or g.kind != kind:
            continue
        named = g.name in ("*", name) if g.pattern == "literal" else name.startswith(g.name)
        if not named:
            continue
        if g.operation in (operation, "all"):
            return True
        if operation == "describe" and g.operation in IMPLIES_DESCRIBE:
            return True
    return False


@pytest.fixture(scope="module")
def topics(base) -> dict[str, str]:
    env = env_of({"environment": base["x-foreshock-env"]})
    return {
        kind: env[f"FORESHOCK_KAFKA_{kind.upper()}_TOPIC"]
        for kind in ("metrics", "warnings", "deadletter", "control")
    }


@pytest.fixture(scope="module")
def applied(tmp_path_factory) -> Run:
    run = run_acls(tmp_path_factory.mktemp("acls"), "apply", **PASSWORDS)
    assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def acl(applied) -> set[Grant]:
    found = grants(applied)
    assert found, "acls.sh added no ACL"
    return found


def principals_that_can(found: set[Grant], operation: str, kind: str, name: str) -> set[str]:
    return {p for p in (*ROLES, SUPER_USER, "ANONYMOUS") if can(found, p, operation, kind, name)}


def test_only_the_approver_may_write_the_control_topic(acl, topics) -> None:
    assert principals_that_can(acl, "write", "topic", topics["control"]) == {"approver"}
    for operation in ("alter", "delete", "alterconfigs", "all"):  # nor change it otherwise
        assert principals_that_can(acl, operation, "topic", topics["control"]) == set()


def test_trainers_write_metrics_read_control_and_nothing_else(acl, topics) -> None:
    every = set(topics.values())

    def where(operation: str) -> set[str]:
        return {t for t in every if can(acl, "trainer", operation, "topic", t)}

    assert where("write") == {topics["metrics"]}, "a trainer writes its metrics, only"
    assert where("read") == {topics["control"]}, "a trainer reads the requests, only"
    assert where("describe") == every, "a trainer lists the topics it would otherwise create"
    assert where("create") == set()


def test_each_role_may_do_what_its_code_does_and_no_more(acl, topics, secure) -> None:
    m, w, d, c = (topics[k] for k in ("metrics", "warnings", "deadletter", "control"))
    expected = {  # role: (writes, reads, creates)
        "admin": (set(), set(), {m, w, d, c}),
        "trainer": ({m}, {c}, set()),
        "detector": ({w, d}, {m}, set()),
        "sink": ({d}, {m, w, d}, set()),
        "notify": ({d}, {w}, set()),
        "approver": ({c, w}, {w, m}, set()),
    }
    every = {m, w, d, c}
    for role, (writes, reads, creates) in expected.items():
        for operation, topics_expected in (("write", writes), ("read", reads)):
            got = {t for t in every if can(acl, role, operation, "topic", t)}
            assert got == topics_expected, f"{role} {operation}: {sorted(got)}"
        got = {t for t in every if can(acl, role, "create", "topic", t)}
        assert got == creates, f"{role} create: {sorted(got)}"
        described = {t for t in every if can(acl, role, "describe", "topic", t)}
        assert described == every, f"{role} cannot see {sorted(every - described)}"
    # each service reads in the group its command line gives it
    parser = build_parser()
    for service, role in SERVICE_ROLES.items():
        command = [resolve(part, COMPOSE_ENV) for part in secure[service]["command"]]
        group = getattr(parser.parse_args(command[1:]), "group", None)
        if group is None:
            continue
        assert can(acl, role, "read", "group", group), f"{role} cannot read its group {group}"
        others = {r for r in ROLES if can(acl, r, "read", "group", group)}
        assert others == {role}, f"{group} is read by {sorted(others)}"


def test_group_ids_that_only_assign_partitions_may_find_their_coordinator(acl) -> None:
    """A trainer's control reader and ``warnings act --wait``'s answer reader never join their
    (random) groups: Describe on the prefix, so the coordinator lookup is not refused."""
    for module, role in ((control_requests, "trainer"), (remedy_requests, "approver")):
        source = Path(module.__file__).read_text()
        (prefix,) = re.findall(r'"group\.id":\s*f"([\w.-]+)\{', source)
        group = f"{prefix}0123456789ab"
        assert can(acl, role, "describe", "group", group), (role, prefix)
        assert not can(acl, role, "read", "group", group), f"{role} needs no more than Describe"
    # at close a trainer asks whether the sink group has committed past what it sent
    assert can(acl, "trainer", "describe", "group", KafkaSinkConfig().confirm_group)


def test_no_acl_is_broader_than_it_names(acl) -> None:
    for g in acl:
        assert g.principal in ROLES, g
        assert g.operation != "all" and g.name != "*", g
        assert g.kind in ("topic", "group"), f"{g}: a cluster grant lets a role grant itself more"
        assert g.pattern == "literal" or g.kind == "group", g


def test_acls_sh_makes_one_scram_user_per_role_from_its_password(applied, brokers) -> None:
    users = {}
    for tool, *arguments in applied.calls:
        if tool == "kafka-configs.sh":
            opts = options(arguments, set(), {"alter"})
            assert opts["entity-type"] == ["users"] and "alter" in opts, arguments
            users[opts["entity-name"][0]] = opts["add-config"][0]
    assert set(users) == set(ROLES), sorted(users)
    external = {
        broker_properties(env_of(b))["listener.name.external.sasl.enabled.mechanisms"]
        for b in brokers.values()
    }
    for role, config in users.items():
        m = re.fullmatch(r"(SCRAM-SHA-\d+)=\[iterations=(\d+),password=([^\]]+)\]", config)
        assert m, config
        assert {m[1]} == external, "the mechanism the brokers take"
        assert int(m[2]) >= 4096, "SCRAM's minimum"
        assert m[3] == PASSWORDS[password_variable(role)], f"{role}: another password"
    first_acl = next(i for i, (tool, *_) in enumerate(applied.calls) if tool == "kafka-acls.sh")
    assert all(tool == "kafka-configs.sh" for tool, *_ in applied.calls[:first_acl])


def test_acls_sh_logs_in_as_the_super_user(applied, secure) -> None:
    bootstrap = env_of(secure["acls"])["FORESHOCK_ACLS_BOOTSTRAP"]
    assert applied.calls, "nothing ran"
    for number, (_tool, *arguments) in enumerate(applied.calls):
        opts = options(arguments, ACL_MULTI, ACL_FLAGS | {"alter"})
        assert opts["bootstrap-server"] == [bootstrap]
        config = dict(line.split("=", 1) for line in applied.configs[number].splitlines() if line)
        assert config["security.protocol"] == "SASL_PLAINTEXT"
        assert config["sasl.mechanism"] == "PLAIN"
        password = PASSWORDS[password_variable(SUPER_USER)]
        assert f'username="{SUPER_USER}" password="{password}";' in config["sasl.jaas.config"]
    assert applied.calls[-1][0] == "kafka-acls.sh" and applied.calls[-1][-1] == "--list"


def test_the_topic_names_are_the_services(tmp_path, topics) -> None:
    """acls.sh's defaults are the compose file's topics, and it follows the same variables."""
    run = run_acls(tmp_path, **PASSWORDS, FORESHOCK_KAFKA_CONTROL_TOPIC="fleet.control")
    assert run.returncode == 0, run.stderr
    moved = grants(run)
    assert principals_that_can(moved, "write", "topic", "fleet.control") == {"approver"}
    assert not any(g.name == topics["control"] for g in moved)
    source = ACLS.read_text()
    for kind, name in topics.items():
        assert f"${{FORESHOCK_KAFKA_{kind.upper()}_TOPIC:-{name}}}" in source, kind


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FORESHOCK_TRAINER_PASSWORD", None),
        ("FORESHOCK_APPROVER_PASSWORD", ""),
        ("FORESHOCK_SINK_PASSWORD", "short"),
        ("FORESHOCK_BROKER_PASSWORD", 'quote"in-a-jaas-string-x'),
        ("FORESHOCK_NOTIFY_PASSWORD", "comma,breaks-kafka-configs"),
    ],
)
def test_acls_sh_refuses_a_bad_password_before_changing_anything(tmp_path, variable, value):
    env = {k: v for k, v in PASSWORDS.items() if k != variable}
    if value is not None:
        env[variable] = value
    run = run_acls(tmp_path, "apply", **env)
    assert run.returncode != 0
    assert variable in run.stderr
    assert run.calls == [], "it ran Kafka's tools first"


def test_acls_sh_ping_asks_a_broker_as_the_super_user(tmp_path) -> None:
    run = run_acls(tmp_path, "ping", "localhost:9092", **PASSWORDS)
    assert run.returncode == 0, run.stderr
    ((tool, *arguments),) = run.calls
    assert tool == "kafka-broker-api-versions.sh"
    assert options(arguments, set(), set())["bootstrap-server"] == ["localhost:9092"]
    assert 'username="broker"' in run.configs[0]
    assert not list(tmp_path.glob("tmp.*")), "the login file is removed"


# ---- the docs -----------------------------------------------------------------------------


def docs_grants() -> set[Grant]:
    """docs/transport.md's ACL table ("Securing the broker"), one Grant per cell product."""
    text = TRANSPORT.read_text()
    section = text.split("### Securing the broker", 1)[1].split("\n## ", 1)[0]
    rows = [
        line for line in section.splitlines() if line.startswith("| `") and line.count("|") >= 4
    ]
    found = set()
    for row in rows:
        principals, operations, resources = [c.strip() for c in row.strip("|").split("|")][:3]
        words = resources.split()
        kind = {"topic": "topic", "topics": "topic", "group": "group", "groups": "group"}[words[0]]
        pattern = "prefixed" if words[1] == "starting" else "literal"
        for principal in re.findall(r"`([^`]+)`", principals):
            for operation in operations.split(","):
                for name in re.findall(r"`([^`]+)`", resources):
                    found.add(Grant(principal, operation.strip().lower(), kind, name, pattern))
    return found


def test_the_docs_table_is_what_acls_sh_adds(acl) -> None:
    documented = docs_grants()
    assert documented, "no ACL table in docs/transport.md"
    assert documented == acl, {
        "in the docs only": sorted(map(str, documented - acl)),
        "in acls.sh only": sorted(map(str, acl - documented)),
    }


def test_the_docs_say_how_to_secure_and_what_tansu_lacks() -> None:
    transport = TRANSPORT.read_text()
    section = transport.split("### Securing the broker", 1)[1].split("\n## ", 1)[0]
    assert "Tansu" in section and "no SASL and no ACLs" in section
    assert "docker-compose.secure.yml" in section and "SASL_SSL" in section
    readme = COMPOSE_README.read_text()
    for needed in ("127.0.0.1", "FORESHOCK_BIND", "FORESHOCK_DASHBOARD_BIND"):
        assert needed in readme, needed
    assert "docker-compose.secure.yml" in readme and "no SASL and no ACLs" in readme


def test_docker_compose_accepts_the_secure_override() -> None:
    docker_compose = require_tool("docker-compose")
    done = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "-f", str(SECURE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **COMPOSE_ENV, **PASSWORDS},
    )
    assert done.returncode == 0, done.stderr
