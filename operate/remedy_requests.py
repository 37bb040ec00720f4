"""``foreshock warnings act ID``: ask the running trainer to act on a warning, and hear back.

The command finds the warning in the store (by id or a unique start of it, as ``ack`` does),
publishes a remedy request on the control topic (:mod:`foreshock.transport.control`, keyed
by the run id) and returns once the broker has it. With ``--wait S`` it then waits up to S
seconds for the trainer's answer — the ``action`` record carrying the request's id, on the
metrics topic — and prints it. It reads that topic from the ends it had *before* the request
went out, so the answer cannot slip by between publishing and listening, and nothing older is
read.

Exit codes: 0 the request is out (``--wait``: acknowledged, applied or a dry run); 1 the
warning is unknown or resolved, the broker did not take the request, or the trainer answered
that the action failed; 2 no store, or an argument out of range; 3 no answer within
``--wait``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from foreshock.remediation.remedies import REMEDIES
from foreshock.transport.approvals import DEFAULT_LIFETIME, MAX_LIFETIME
from foreshock.transport.control import ControlError, remedy_request

__all__ = ["MAX_WAIT", "AckListener", "act", "add_act_arguments", "lr_scale", "wait_seconds"]

MAX_WAIT = 3600.0  # s: a trainer answers at its next step boundary; an hour is a dead run
TIMED_OUT = 3


def lr_scale(text: str) -> float:
    """``--lr-scale``: a factor in (0, 1] (a remedy lowers a rate, never raises it).

    >>> lr_scale("0.5")
    0.5
    >>> lr_scale("2")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: --lr-scale must be in (0, 1], got 2
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lr-scale must be a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--lr-scale must be in (0, 1], got {text}")
    return value


def wait_seconds(text: str) -> float:
    """``--wait``: seconds in (0, :data:`MAX_WAIT`]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--wait must be seconds, got {text!r}") from None
    if not 0 < value <= MAX_WAIT:
        raise argparse.ArgumentTypeError(f"--wait must be in (0, {MAX_WAIT:.0f}] s, got {text}")
    return value


def valid_for(text: str) -> float:
    """``--valid-for``: seconds in (0, :data:`~foreshock.transport.approvals.MAX_LIFETIME`]."""
    value = _seconds(text, "--valid-for")
    if not 0 < value <= MAX_LIFETIME:
        raise argparse.ArgumentTypeError(f"--valid-for must be in (0, {MAX_LIFETIME:.0f}] s")
    return value


def _seconds(text: str, option: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{option} must be seconds, got {text!r}") from None


class AckListener:
    """The metrics topic from its current ends on: built before the request goes out, then
    ``wait(request_id, seconds)`` returns the trainer's ``action`` record for it, or None."""

    def __init__(self, settings: Any, timeout: float = 10.0) -> None:
        from foreshock.transport.clients import topic_consumer

        self.consumer = topic_consumer(
            settings,
            {"group.id": f"foreshock-act-{uuid.uuid4().hex[:12]}", "enable.auto.commit": False},
        )
        try:
            ends = self._ends(settings.metrics_topic, timeout)
        except Exception as exc:  # the broker away, the topic missing: say so, in one line
            self.consumer.close()
            raise RuntimeError(f"cannot listen for the answer: {exc}") from None
        self.consumer.assign(ends)

    def _ends(self, name: str, timeout: float) -> list[Any]:
        """Each partition of ``name`` at its current end (its high watermark)."""
        from confluent_kafka import TopicPartition

        topic = self.consumer.list_topics(name, timeout=timeout).topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            raise RuntimeError(f"no topic {name} on the broker: is any run sending?")
        ends = []
        for p in sorted(topic.partitions):
            _, high = self.consumer.get_watermark_offsets(TopicPartition(name, p), timeout)
            ends.append(TopicPartition(name, p, high))
        return ends

    def wait(self, request_id: str, seconds: float) -> dict[str, Any] | None:
        from foreshock.transport.wire import WireError, decode

        needle = request_id.encode()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for raw in self.consumer.consume(100, min(left, 0.5)):
                value = raw.value()
                if raw.error() is not None or not value or needle not in value:
                    continue  # most messages are other runs' records: not decoded
                try:
                    message = decode(value)
                except WireError:
                    continue
                if message["kind"] == "action" and message.get("request_id") == request_id:
                    return message
        return None

    def close(self) -> None:
        self.consumer.close()


def act(args: argparse.Namespace, warning: dict[str, Any], settings: Any) -> int:
    """Publish the request for ``warning`` (a stored warning's state), signed with the
    approver's key (``--key`` or ``FORESHOCK_APPROVER_KEY``); with ``args.wait``, wait for the
    trainer's answer. Returns the exit code (see the module docstring)."""
    from foreshock.detectors.alerts import publish
    from foreshock.transport.approvals import sign

    if warning.get("event") == "cleared":
        print(f"foreshock warnings: warning {warning['id']} is resolved already", file=sys.stderr)
        return 1
    if args.lr_scale is not None and args.action not in (None, "hold-lr"):
        print("foreshock warnings act: --lr-scale is for hold-lr only", file=sys.stderr)
        return 2
    key = _signing_key(args)
    if key is None:
        return 2
    by = key["name"]
    try:
        request = remedy_request(
            warning, by, args.action, args.rollback, args.lr_scale,
            lifetime=args.valid_for, again=args.again,
        )  # fmt: skip
        request = sign(request, key)
    except ControlError as exc:
        print(f"foreshock warnings act: {exc}", file=sys.stderr)
        return 2
    listener = AckListener(settings) if args.wait else None
    try:
        publish(settings, request, topic=settings.control_topic)
        what = args.action or "the policy's action"
        print(
            f"requested {what} for warning {warning['id']} ({warning['family']} on run "
            f"{warning['run_id']}) as {by}: request {request['request_id']}",
            flush=True,
        )
        if listener is None:
            return 0
        answer = listener.wait(request["request_id"], args.wait)
    finally:
        if listener is not None:
            listener.close()
    return _answered(answer, args.wait)


def _signing_key(args: argparse.Namespace) -> dict[str, str] | None:
    """The approver's key (``--key``, else ``FORESHOCK_APPROVER_KEY``); None (said) without."""
    from foreshock.transport.approvals import ApprovalError, load_key

    path = args.key or os.environ.get("FORESHOCK_APPROVER_KEY")
    if not path:
        print(
            "foreshock warnings act: a trainer follows only signed requests: give --key FILE "
            "(or FORESHOCK_APPROVER_KEY; foreshock approvers keygen makes one)",
            file=sys.stderr,
        )
        return None
    try:
        return load_key(path)
    except ApprovalError as exc:
        print(f"foreshock warnings act: {exc}", file=sys.stderr)
        return None


def _answered(answer: dict[str, Any] | None, waited: float) -> int:
    """Print the trainer's answer; the exit code it makes."""
    if answer is None:
        print(
            f"foreshock warnings act: no answer from the trainer within {waited:g} s (is the "
            "run still going, with a KafkaSink that polls requests?)",
            file=sys.stderr,
        )
        return TIMED_OUT
    if answer.get("error"):
        how = f"failed: {answer['error']}"
    else:
        how = "dry run, nothing done" if answer.get("dry_run") else "applied"
    print(f"acknowledged: {answer['action']} at step {answer['step']}, {how}")
    print(json.dumps(answer, sort_keys=True))
    done = answer.get("applied") or answer.get("dry_run")
    return 1 if answer.get("error") or not done else 0


def add_act_arguments(parser: argparse.ArgumentParser) -> None:
    """``act``'s own options (``id``, ``--by`` and ``--store`` come from the shared parents)."""
    parser.add_argument(
        "--action",
        choices=list(REMEDIES),
        help="what to do (default: the trainer's policy's action for the warning's cause): "
        + "; ".join(f"{name}: {remedy.summary}" for name, remedy in REMEDIES.items()),
    )
    parser.add_argument(
        "--rollback",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="restore the newest snapshot from before the warning's evidence first "
        "(default: the policy's)",
    )
    parser.add_argument(
        "--lr-scale",
        type=lr_scale,
        metavar="X",
        help="hold-lr: hold the learning rate at X (0 < X <= 1) times its value",
    )
    parser.add_argument(
        "--wait",
        type=wait_seconds,
        metavar="SECONDS",
        help="wait this long for the trainer's answer and print it (exit 3 without one)",
    )
    parser.add_argument(
        "--key",
        metavar="FILE",
        help="the approver's key file (default $FORESHOCK_APPROVER_KEY; approvers keygen)",
    )
    parser.add_argument(
        "--valid-for",
        type=valid_for,
        default=DEFAULT_LIFETIME,
        metavar="SECONDS",
        help=f"the request expires after this (default {DEFAULT_LIFETIME:.0f} s)",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="act even if this warning was acted on already (refused otherwise)",
    )
