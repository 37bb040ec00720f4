"""Shared fixtures: the real embedded Kafka-protocol broker (Tansu), started once per session."""

from __future__ import annotations

import os
import shutil

import pytest

# One thread per training process (the brief's rule): torch reads this when first imported, in
# this process and in every trainer a test starts. Tiny models gain nothing from a second
# thread, and on a shared 2-core machine two threads per process only contend.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hypothesis import settings as hypothesis_settings

from foreshock.transport.broker import EmbeddedBroker
from foreshock.transport.settings import KafkaSettings

# Property tests draw the same examples on every run (a fixed seed): a failure in CI is one
# anyone reproduces by running the test again, and a pass is not a lucky draw. Exploring new
# examples is opt-in: HYPOTHESIS_PROFILE=explore.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("explore", print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The fast lane (`pytest -m "not slow"`, docs/operating.md) leaves out what starts real
# services, processes or browsers: a test that takes one of these fixtures is slow by nature.
# A test that takes more than ~1.5 s of its own is marked ``@pytest.mark.slow`` where it is
# defined, so that the lane stays under a minute on two cores.
# So are the modules of system tests (they start their own brokers, trainers, torchrun jobs).
SLOW_FIXTURES = {"broker", "kafka_settings", "s3", "location", "browser", "page"}
SLOW_MODULES = {
    "test_compose",
    "test_dashboard_browser",
    "test_demo",
    "test_distributed",
    "test_fuzz_decoders",
    "test_megatron",
    "test_megatron_parallel",
    "test_olmo_core",
    "test_per_rank",
    "test_reliability",
    "test_resume_order",
    "test_run_identity",
    "test_run_life",
    "test_sharded",
    "test_sharded_integrations",
    "test_transport_faults",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        slow_module = item.module is not None and item.module.__name__ in SLOW_MODULES
        if slow_module or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def read_cache(tmp_path_factory: pytest.TempPathFactory):
    """A remote store's read cache of the session's own, not the user's ``~/.cache``."""
    folder = tmp_path_factory.mktemp("read-cache")
    os.environ["FORESHOCK_READ_CACHE"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory):
    """One Tansu for the session (tests isolate themselves by topic names)."""
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as running:
        yield running


@pytest.fixture
def kafka_settings(broker: EmbeddedBroker, tmp_path, request) -> KafkaSettings:
    """Settings with topics of this test's own and a spool folder of its own."""
    name = request.node.name.replace("[", "-").replace("]", "")[:60]
    return KafkaSettings(
        bootstrap_servers=broker.bootstrap,
        metrics_topic=f"t.{name}.metrics",
        warnings_topic=f"t.{name}.warnings",
        deadletter_topic=f"t.{name}.deadletter",
        control_topic=f"t.{name}.control",
        partitions=3,
        spool_dir=str(tmp_path / "spool"),
    )


def require_tool(name: str) -> str:
    """Path of a system tool; skip without it unless CI requires it (then fail)."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("FORESHOCK_REQUIRE_SYSTEM_TOOLS") == "1":
        pytest.fail(f"{name} is required here (scripts/system-deps.sh installs it)")
    pytest.skip(f"{name} not installed (scripts/system-deps.sh installs it)")
