"""The ``foreshock notify`` command: warnings from the broker to webhooks, Slack and
Alertmanager (:mod:`.notifier`), with the receivers from the flags or the settings file."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_notify_commands"]


def _notify(args: argparse.Namespace) -> int:
    from foreshock.transport.service import config_from_args, serve

    from .notifier import Notifier, NotifyConfig
    from .receivers import RECEIVERS
    from .targets import notify_targets

    given = [t for kind in RECEIVERS for t in getattr(args, kind)]
    targets = notify_targets(given, args.config)
    if not targets:
        flags = ", ".join(f"--{kind}" for kind in RECEIVERS)
        print(
            f"foreshock notify: no target; give at least one {flags} URL (each may be "
            "repeated), or [[notify.receivers]] in the settings file",
            file=sys.stderr,
        )
        return 2
    config = config_from_args(NotifyConfig, args, targets=targets)
    started = f"group {args.group} -> {', '.join(t.where for t in targets)}"
    return serve("notify", Notifier, config, args, lambda _: started, _notified)


def _notified(notifier) -> str:
    return "{delivered} delivered, {failed} failed, {duplicates} duplicates".format(
        **notifier.stats.as_dict()
    )


def add_notify_commands(sub: argparse._SubParsersAction) -> None:
    """``foreshock notify``: the service that delivers warnings to people's receivers."""
    from .delivery import Target
    from .notifier import DEFAULT_DASHBOARD
    from .receivers import RECEIVERS

    def target(kind: str):
        def parse(url: str) -> Target:
            try:
                return Target(kind, url)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        return parse

    notify = sub.add_parser("notify", help="deliver warnings to webhooks, Slack, Alertmanager")
    for kind, registered in RECEIVERS.items():
        what = registered.help
        notify.add_argument(
            f"--{kind}",
            action="append",
            default=[],
            type=target(kind),
            metavar="URL",
            help=f"{what}; repeatable",
        )
    notify.add_argument(
        "--dashboard-url",
        default=DEFAULT_DASHBOARD,
        metavar="URL",
        help=f"linked from each warning (default {DEFAULT_DASHBOARD})",
    )
    notify.add_argument("--group", default="foreshock-notify", help="consumer group")
    notify.add_argument(
        "--updates", action="store_true", help="also send the lead time once the loss diverged"
    )
    notify.add_argument(
        "--retries",
        type=int,
        default=None,
        metavar="N",
        help="retries of a failed delivery (default: until --patience)",
    )
    notify.add_argument(
        "--patience",
        type=float,
        default=900.0,
        metavar="S",
        help="keep retrying a receiver that is down for S s (default 900)",
    )
    notify.add_argument(
        "--am-refresh",
        type=float,
        default=60.0,
        metavar="S",
        help="re-post open warnings to Alertmanager every S s",
    )
    notify.add_argument("--idle-exit", type=float, metavar="S", help="stop after S idle s")
    notify.set_defaults(func=_notify)
