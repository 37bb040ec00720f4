"""``foreshock profiles list|build|approve|reject|policy``: the profiles a store builds itself
(:mod:`.profile_builder`), seen and decided by a person."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from foreshock.table import format_table

__all__ = ["add_profiles_commands"]


def _store(args: argparse.Namespace) -> Any:
    from foreshock.storage.commands import location_of

    return location_of(args)


def _list(args: argparse.Namespace) -> int:
    from . import profile_builder as pb
    from .profile_groups import by_signature, fleet_runs

    root = _store(args)
    profiles, waiting = pb.in_force(root), pb.candidates(root)
    rows = []
    for group in by_signature(fleet_runs(root)):
        found = pb.profile_of_group(profiles, group) or "zero-shot"
        mine = [c for c in waiting if _same(group.signature, c.signatures)]
        pending = [c.name for c in mine if c.status == pb.PENDING]
        rows.append(
            [
                group.label,
                len(group.runs),
                f"{len(group.healthy)}/{pb.HEALTHY_RUNS_NEEDED}",
                len(group.faults),
                len(group.running),
                found,
                ", ".join(pending) or "-",
            ]
        )
    headers = ["model", "runs", "healthy", "faults", "running", "profile", "pending"]
    print(format_table(headers, rows) if rows else "no run with an architecture signature")
    print(f"policy: {pb.policy(root)} (foreshock profiles policy auto|approve|off)")
    return 0


def _same(signature: dict[str, Any], signatures: list[dict[str, Any]]) -> bool:
    from foreshock.detectors.signatures import same_model

    return any(same_model(signature, s) for s in signatures)


def _build(args: argparse.Namespace) -> int:
    from .profile_builder import build

    report = build(_store(args), args.policy)
    for model, what in report.outcomes:
        print(f"{model}: {what}")
    if not report.outcomes:
        print("no model to build a profile of (or the policy is off)")
    return 0


def _decide(args: argparse.Namespace) -> int:
    from . import profile_builder as pb

    root = _store(args)
    try:
        if args.profiles_command == "approve":
            candidate = pb.approve(root, args.name, args.by)
        else:
            candidate = pb.reject(root, args.name, args.by, args.note or "")
    except pb.BuilderError as exc:
        print(f"foreshock profiles {args.profiles_command}: {exc}", file=sys.stderr)
        return 2
    print(f"{candidate.name} (version {candidate.config.version}): {candidate.status}")
    return 0


def _policy(args: argparse.Namespace) -> int:
    from . import profile_builder as pb

    root = _store(args)
    if args.value is not None:
        pb.set_policy(root, args.value, args.by)
    print(pb.policy(root))
    return 0


def add_profiles_commands(sub: argparse._SubParsersAction) -> None:
    from .profile_builder import HEALTHY_RUNS_NEEDED, POLICIES

    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        help="folder or URI (default: [store] uri in --config, "
        "$FORESHOCK_STORE, else ./foreshock-history)",
    )
    profiles = sub.add_parser(
        "profiles",
        help=f"profiles the store builds itself (a model with {HEALTHY_RUNS_NEEDED} healthy runs)",
    )
    what = profiles.add_subparsers(dest="profiles_command", required=True)
    what.add_parser("list", parents=[store], help="models, their runs, profiles").set_defaults(
        func=_list
    )
    build = what.add_parser("build", parents=[store], help="build candidates now")
    build.add_argument("--policy", choices=POLICIES, help="this time (default: the store's)")
    build.set_defaults(func=_build)
    for name, help_ in (("approve", "publish a candidate"), ("reject", "set a candidate aside")):
        decide = what.add_parser(name, parents=[store], help=help_)
        decide.add_argument("name", help="the candidate's name (foreshock profiles list)")
        decide.add_argument("--by", help="who (default: your login name)")
        if name == "reject":
            decide.add_argument("--note", help="why, for the others (one line)")
        decide.set_defaults(func=_decide)
    policy = what.add_parser("policy", parents=[store], help="show or set the store's policy")
    policy.add_argument("value", nargs="?", choices=POLICIES, help="auto, approve or off")
    policy.add_argument("--by", help="who (default: your login name)")
    policy.set_defaults(func=_policy)
