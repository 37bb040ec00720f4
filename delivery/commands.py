"""``foreshock spool flush``: what a producer could not deliver, sent now (torch-free: the
spool and the Kafka sink need no torch)."""

from __future__ import annotations

import argparse

__all__ = ["add_producer_commands"]


def _spool_flush(args: argparse.Namespace) -> int:
    from foreshock.transport.settings import load_settings

    from .kafka_sink import KafkaSink

    settings = load_settings(args.config)
    sink = KafkaSink(settings)  # takes over every spool no live producer holds
    done = sink.wait_delivered(args.timeout)
    left = sink.pending()
    sink.close(timeout=5)
    print(
        f"spool {settings.spool_dir}: {sink.delivered} messages delivered, "
        f"{left} bytes still spooled"
        + (
            f", {sink.stranded} set aside (their topic is gone: *.stranded)"
            if sink.stranded
            else ""
        )
    )
    return 0 if done else 1


def add_producer_commands(sub: argparse._SubParsersAction) -> None:
    spool = sub.add_parser("spool", help="the local spool of undelivered messages")
    spool_sub = spool.add_subparsers(dest="spool_command", required=True)
    flush = spool_sub.add_parser("flush", help="re-send every spooled message to Kafka")
    flush.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    flush.set_defaults(func=_spool_flush)
