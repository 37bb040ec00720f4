"""``foreshock dashboard``: serve the Streamlit app over a store (no torch)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["add_dashboard_commands", "streamlit_command"]

APP = Path(__file__).parent / "app.py"
# Streamlit's own log lines as foreshock's: time, level, logger (Streamlit's default is the time
# and the message only).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def streamlit_command(host: str, port: int) -> list[str]:
    """The ``streamlit run`` line: headless, no usage statistics, no file watcher; the toolbar
    in viewer mode (no developer menu: no "Deploy", no rerun or settings for the app's
    source); Streamlit's own log at the level ``foreshock --log-level`` set, in its format."""
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--global.developmentMode",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--logger.level",
        level,
        "--logger.messageFormat",
        LOG_FORMAT,
    ]


def _dashboard(args: argparse.Namespace) -> int:
    from foreshock.storage.location import load_location

    location = load_location(args.store, getattr(args, "config", None))
    store = location.uri if not location.is_local else str(Path(location.uri).resolve())
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"foreshock dashboard: listening on {args.host}: anyone who can reach this "
            "address reads the whole history (no authentication) — put a reverse proxy "
            "with authentication in front of it",
            file=sys.stderr,
        )
    print(f"foreshock dashboard: http://{args.host}:{args.port}  (store {store})", flush=True)
    env = {**os.environ, "FORESHOCK_STORE": str(store)}
    command = streamlit_command(args.host, args.port)
    os.execve(command[0], command, env)  # streamlit becomes this process: a signal reaches it


def add_dashboard_commands(sub: argparse._SubParsersAction) -> None:
    dash = sub.add_parser("dashboard", help="the fleet dashboard (Streamlit) over a store")
    dash.add_argument(
        "--store",
        help="folder or URI to read (default: [store] uri in --config, "
        "$FORESHOCK_STORE, else ./foreshock-history)",
    )
    dash.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; another "
        "address exposes the history to that network, unauthenticated)",
    )
    dash.add_argument("--port", type=int, default=8501)
    dash.set_defaults(func=_dashboard)
