"""``foreshock broker`` and ``foreshock topics`` (torch-free)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .settings import load_settings

__all__ = ["add_transport_commands"]


def _broker(args: argparse.Namespace) -> int:
    from .broker import BrokerNotFoundError, EmbeddedBroker

    def make_topics(bootstrap: str) -> None:
        if not args.no_topics:
            from .topics import ensure_topics

            settings = load_settings(args.config).with_bootstrap(bootstrap)
            print(f"topics: {ensure_topics(settings).partitions}", flush=True)

    limit = args.max_memory_mb or None
    try:
        broker = EmbeddedBroker(
            port=args.port, host=args.host, max_memory_mb=limit, on_start=make_topics
        ).start()
    except BrokerNotFoundError as exc:
        print(f"foreshock broker: {exc}", file=sys.stderr)
        return 2
    print(
        f"foreshock broker: Tansu (memory storage) on {broker.bootstrap}; Ctrl-C stops it. "
        f"Clients: FORESHOCK_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap}",
        flush=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while broker.running and not stop.wait(5.0):
            if broker.recycle_if_over():
                print(
                    f"foreshock broker: recycled (RSS over {limit:g} MB; recycle "
                    f"{broker.recycles}): clients re-send and rewind",
                    flush=True,
                )
    except KeyboardInterrupt:
        pass
    running = broker.running
    broker.stop()
    return 0 if running else 1


def _topics(args: argparse.Namespace) -> int:
    from .topics import ensure_topics

    settings = load_settings(args.config)
    for name, partitions in ensure_topics(settings).partitions.items():
        print(f"{name}\t{partitions} partitions")
    return 0


def add_transport_commands(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu)")
    broker.add_argument("--port", type=int, default=9092, help="listen port (default 9092)")
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    broker.add_argument("--no-topics", action="store_true", help="do not create the topics")
    broker.add_argument(
        "--max-memory-mb",
        type=float,
        default=4096,
        metavar="MB",
        help="restart the broker empty when its RSS passes MB (it keeps every "
        "message; clients lose nothing by a restart); 0: never (default 4096)",
    )
    broker.set_defaults(func=_broker)
    topics = sub.add_parser("topics", help="create foreshock's topics if missing; list them")
    topics.set_defaults(func=_topics)
