"""``foreshock approvers keygen | allow``: the keys that may steer a run.

A trainer follows a person's remedy request only if an approver on its allowlist signed it
(:mod:`foreshock.transport.approvals`). The setup, once per approver and trainer fleet::

    foreshock approvers keygen ana --out ~/.foreshock        # ana.key (0600), ana.pub.json
    foreshock approvers allow ~/.foreshock/ana.pub.json --allowlist approvers.json
    FORESHOCK_KAFKA_APPROVERS=approvers.json python train.py  # each trainer
    foreshock warnings act WARNING --key ~/.foreshock/ana.key

The private key never leaves the approver; the allowlist holds public keys only and can be
shipped with the training job. ``allow`` replaces an entry of the same key id, so rotating a
key is ``keygen`` then ``allow`` (and removing the old entry from the file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from foreshock.transport.approvals import ApprovalError, generate_key

__all__ = ["add_approver_commands"]


def _keygen(args: argparse.Namespace) -> int:
    try:
        private, public = generate_key(args.name)
    except ApprovalError as exc:
        print(f"foreshock approvers: {exc}", file=sys.stderr)
        return 2
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = folder / f"{args.name}.key", folder / f"{args.name}.pub.json"
    if key_path.exists() and not args.force:
        print(f"foreshock approvers: {key_path} exists (--force replaces it)", file=sys.stderr)
        return 2
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(json.dumps(private, indent=1) + "\n")
    pub_path.write_text(json.dumps(public, indent=1) + "\n")
    print(f"private key: {key_path} (keep it; mode 0600)\npublic entry: {pub_path}")
    print(json.dumps(public))
    return 0


def _allow(args: argparse.Namespace) -> int:
    path = Path(args.allowlist)
    try:
        data = json.loads(path.read_text()) if path.exists() else {"approvers": []}
        approvers = data["approvers"] if isinstance(data, dict) else data
        for entry_file in args.entries:
            entry = json.loads(Path(entry_file).read_text())
            if not {"key_id", "name", "public_key"} <= set(entry):
                raise ValueError(f"{entry_file}: not a public entry (keygen's .pub.json)")
            approvers = [a for a in approvers if a.get("key_id") != entry["key_id"]] + [entry]
        from foreshock.transport.approvals import Allowlist

        Allowlist(approvers)  # every entry readable before the file is written
    except (OSError, ValueError, KeyError, TypeError, ApprovalError) as exc:
        print(f"foreshock approvers: {exc}", file=sys.stderr)
        return 2
    path.write_text(json.dumps({"approvers": approvers}, indent=1) + "\n")
    names = ", ".join(str(a["name"]) for a in approvers)
    print(f"{path}: {len(approvers)} approver(s): {names}")
    return 0


def add_approver_commands(sub: argparse._SubParsersAction) -> None:
    approvers = sub.add_parser("approvers", help="the keys that may steer a run (signed requests)")
    what = approvers.add_subparsers(dest="approvers_command", required=True)
    keygen = what.add_parser("keygen", help="a new approver key pair (Ed25519)")
    keygen.add_argument("name", help="the approver's name, as trainers will record it")
    keygen.add_argument("--out", default=".", help="folder for NAME.key and NAME.pub.json")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.set_defaults(func=_keygen)
    allow = what.add_parser("allow", help="add public entries to a trainer's allowlist file")
    allow.add_argument("entries", nargs="+", metavar="PUB_JSON", help="keygen's NAME.pub.json")
    allow.add_argument("--allowlist", required=True, help="the allowlist file (made if missing)")
    allow.set_defaults(func=_allow)
