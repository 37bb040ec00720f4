"""``foreshock warnings list | ack | silence | act``: see the warnings and their states; take one.

``list`` reads the store (:func:`foreshock.storage.acks.warning_states`). ``ack`` and
``silence`` find the warning there — by its id or a unique start of it, as ``list`` prints —
and send a person's event (:func:`foreshock.detectors.alerts.action_event`) to the warnings
topic, where the sink stores it with who and when and the notifier tells the receivers. Who is
``--by``, or the login name. The command returns once the broker has the event: the store and
the receivers follow within seconds. ``act`` finds the warning the same way and asks the
running trainer to act on it (:mod:`foreshock.operate.remedy_requests`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
import time
from datetime import UTC, datetime

from foreshock.table import format_table

from .remedy_requests import add_act_arguments

__all__ = [
    "MAX_SILENCE_DAYS",
    "add_warnings_commands",
    "parse_duration",
    "parse_time",
    "silence_until",
]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# The longest silence: a warning muted longer is a warning nobody will see again, and an
# unbounded one used to publish a time no receiver (Alertmanager included) can hold.
MAX_SILENCE_DAYS = 90


def parse_duration(text: str) -> float:
    """Seconds in ``30m``, ``2h``, ``1d12h``, ``90`` (seconds).

    >>> parse_duration("2h"), parse_duration("1d12h"), parse_duration("90")
    (7200.0, 129600.0, 90.0)
    """
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 2h, 1d)")
    return float(sum(float(n) * _UNITS[u] for n, u in parts))


def parse_time(text: str) -> float:
    """Unix seconds of an ISO 8601 time; without a zone it is this machine's local time.

    >>> parse_time("1970-01-01T01:00:00+00:00")
    3600.0
    """
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return (moment if moment.tzinfo else moment.astimezone()).timestamp()


def _when(seconds: float | None) -> str:
    """A stored time for people; one out of any calendar's range (an unbounded silence an
    earlier version published) says so instead of crashing every listing."""
    if seconds is None:
        return "-"
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"out of range ({seconds:.3g} s)"


def silence_until(now: float, until: float | None, duration: float | None) -> float:
    """The end of a silence asked as ``--until`` or ``--for``: in the future, and at most
    ``MAX_SILENCE_DAYS`` ahead (ValueError otherwise, with the reason).

    >>> silence_until(0.0, None, 7200.0)
    7200.0
    >>> silence_until(0.0, None, 99999999999 * 86400.0)
    Traceback (most recent call last):
    ...
    ValueError: a silence lasts at most 90 days; asked for 99999999999 days
    """
    end = until if until is not None else now + float(duration or 0.0)
    if not end > now:
        raise ValueError("a silence must end in the future")
    if end - now > MAX_SILENCE_DAYS * 86400:
        raise ValueError(
            f"a silence lasts at most {MAX_SILENCE_DAYS} days; asked for "
            f"{(end - now) / 86400:.0f} days"
        )
    return end


def _login() -> str:
    """Who is acting, when ``--by`` does not say: the login name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user without a name
        raise ValueError("cannot tell who you are: give --by NAME") from None


def _location(args: argparse.Namespace):
    from foreshock.storage.location import load_location

    return load_location(args.store, args.config)


def _list(args: argparse.Namespace) -> int:
    from foreshock.storage.acks import warning_states
    from foreshock.storage.reader import open_history
    from foreshock.storage.store import store_exists

    location = _location(args)
    if not store_exists(location):
        print(f"foreshock warnings: no store at {location.uri}", file=sys.stderr)
        return 2
    with open_history(location) as history:
        rows = warning_states(history, run_id=args.run, resolved=args.all)
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
        return 0
    table = []
    for r in rows:
        if r["state"] == "acknowledged":
            who = f"{r['acknowledged_by']} at {_when(r['acknowledged_at'])}"
        elif r["state"] == "silenced":
            who = f"{r['silenced_by']} until {_when(r['silenced_until'])}"
        elif r["state"] == "resolved":
            who = f"{r['resolved_by']} at step {r['cleared_step']}"
        else:
            who = "-"
        table.append(
            [
                r["id"],
                r["run_id"],
                r["family"],
                r["module"] or "-",
                r["step"],
                r["role"],
                r["state"],
                who,
            ]
        )
    print(
        format_table(["id", "run", "family", "module", "step", "role", "state", "by / why"], table)
    )
    return 0


def _person_event(args: argparse.Namespace) -> int:
    from foreshock.detectors.alerts import action_event, publish
    from foreshock.storage.acks import find_warning
    from foreshock.storage.reader import open_history
    from foreshock.storage.store import store_exists
    from foreshock.transport.settings import load_settings

    kind = "acknowledged" if args.warnings_command == "ack" else "silenced"
    location = _location(args)
    if not store_exists(location):
        print(f"foreshock warnings: no store at {location.uri}", file=sys.stderr)
        return 2
    until = None
    try:
        if kind == "silenced":
            until = silence_until(time.time(), args.until, args.duration)
    except ValueError as exc:
        print(f"foreshock warnings silence: {exc}", file=sys.stderr)
        return 2
    try:
        with open_history(location) as history:
            warning = find_warning(history, args.id)
        event = action_event(warning, kind, args.by or _login(), until, args.note)
        publish(load_settings(args.config), event)
    except (LookupError, ValueError, RuntimeError) as exc:
        print(f"foreshock warnings: {exc}", file=sys.stderr)
        return 1
    where = f"{warning['family']} on run {warning['run_id']}"
    if warning["module"]:
        where += f" ({warning['module']})"
    tail = f" until {_when(until)}" if until is not None else ""
    print(
        f"{kind} warning {warning['id']} ({where}, opened at step {warning['step']}) as "
        f"{event['evidence']['by']}{tail}"
    )
    return 0


def _request_remedy(args: argparse.Namespace) -> int:
    """``warnings act``: the warning from the store, as ``ack`` finds it; the request out."""
    from foreshock.storage.acks import find_warning
    from foreshock.storage.reader import open_history
    from foreshock.storage.store import store_exists
    from foreshock.transport.settings import load_settings

    from .remedy_requests import act

    location = _location(args)
    if not store_exists(location):
        print(f"foreshock warnings: no store at {location.uri}", file=sys.stderr)
        return 2
    try:
        with open_history(location) as history:
            warning = find_warning(history, args.id)
        return act(args, warning, load_settings(args.config))
    except (LookupError, ValueError, RuntimeError) as exc:
        print(f"foreshock warnings: {exc}", file=sys.stderr)
        return 1


def add_warnings_commands(sub: argparse._SubParsersAction) -> None:
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        help="folder or URI (default: [store] uri in --config, "
        "$FORESHOCK_STORE, else ./foreshock-history)",
    )
    person = argparse.ArgumentParser(add_help=False)
    person.add_argument("id", help="the warning's id, or a unique start of it")
    person.add_argument("--by", help="who (default: your login name)")
    person.add_argument("--note", help="why, for the others (one line)")

    warnings = sub.add_parser("warnings", help="list warnings; acknowledge, silence or act on one")
    what = warnings.add_subparsers(dest="warnings_command", required=True)
    listing = what.add_parser("list", parents=[store], help="warnings and their states")
    listing.add_argument("--run", help="only this run's")
    listing.add_argument("--all", action="store_true", help="resolved ones too")
    listing.add_argument("--json", action="store_true", help="one JSON object per warning")
    listing.set_defaults(func=_list)
    ack = what.add_parser(
        "ack", parents=[store, person], help="acknowledge a warning: you have it in hand"
    )
    ack.set_defaults(func=_person_event)
    silence = what.add_parser(
        "silence", parents=[store, person], help="silence a warning until a time"
    )
    until = silence.add_mutually_exclusive_group(required=True)
    until.add_argument(
        "--for", dest="duration", type=parse_duration, metavar="DURATION", help="e.g. 30m, 2h, 1d"
    )
    until.add_argument(
        "--until",
        type=parse_time,
        metavar="TIME",
        help="ISO 8601, e.g. 2025-06-01T18:00 (local) or …Z",
    )
    silence.set_defaults(func=_person_event)
    remedy = what.add_parser(
        "act",
        parents=[store],
        help="ask the running trainer to act on a warning (on the control topic)",
    )
    remedy.add_argument("id", help="the warning's id, or a unique start of it")
    add_act_arguments(remedy)
    remedy.set_defaults(func=_request_remedy)
