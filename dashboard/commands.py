"""``foreshock dashboard``: serve the Streamlit app over a store (no torch)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

from foreshock.dashboard.auth import ENV as AUTH_ENV
from foreshock.dashboard.auth import Access, AuthConfigError, load_access

__all__ = ["add_dashboard_commands", "streamlit_command"]

APP = Path(__file__).parent / "app.py"
# Streamlit's own log lines as foreshock's: time, level, logger (Streamlit's default is the time
# and the message only).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def streamlit_command(host: str, port: int, auth: Path | None = None) -> list[str]:
    """The ``streamlit run`` line: headless, no usage statistics, no file watcher; the toolbar
    in viewer mode (no developer menu: no "Deploy", no rerun or settings for the app's
    source); Streamlit's own log at the level ``foreshock --log-level`` set, in its format.
    With ``auth``, that file is Streamlit's only secrets file (its ``[auth]`` section turns on
    Streamlit's login); without, Streamlit's own search for ``secrets.toml`` is left as is."""
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    secrets = ["--secrets.files", str(auth)] if auth is not None else []
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
        *secrets,
    ]


def _auth_file(value: str | None) -> tuple[Path, Access] | None:
    """The checked ``--auth`` file (absolute) and its allowlist, or None; exits with 2 and the
    reason (key names, never a secret) when it cannot work."""
    if not value:
        return None
    path = Path(value).resolve()
    try:
        access = load_access(path)
    except AuthConfigError as exc:
        print(f"foreshock dashboard: --auth: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    missing = [m for m in ("authlib", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"foreshock dashboard: --auth needs {', '.join(missing)}: "
            "pip install 'foreshock[dashboard]'",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if path.stat().st_mode & 0o077:
        print(
            f"foreshock dashboard: {path} is readable by other users: it holds the client "
            "secret and the cookie secret (chmod 600)",
            file=sys.stderr,
        )
    print(
        f"foreshock dashboard: login required (allowed: {len(access.users)} e-mail "
        f"addresses, {len(access.groups)} groups; redirect URI {access.redirect_uri})",
        file=sys.stderr,
    )
    return path, access


def _dashboard(args: argparse.Namespace) -> int:
    from foreshock.storage.location import load_location

    location = load_location(args.store, getattr(args, "config", None))
    store = location.uri if not location.is_local else str(Path(location.uri).resolve())
    checked = _auth_file(args.auth)
    auth = checked[0] if checked else None
    local = args.host in ("127.0.0.1", "localhost", "::1")
    if checked and not local and checked[1].redirect_uri.startswith("http://"):
        print(
            f"foreshock dashboard: listening on {args.host} with a login over plain HTTP: "
            "the identity cookie and the history cross the network unencrypted — put a TLS "
            "reverse proxy in front of it (redirect_uri https://...)",
            file=sys.stderr,
        )
    elif not checked and not local:
        print(
            f"foreshock dashboard: listening on {args.host}: anyone who can reach this "
            "address reads the whole history (no authentication) — put a reverse proxy "
            "with authentication in front of it, or turn on its login (--auth FILE)",
            file=sys.stderr,
        )
    print(f"foreshock dashboard: http://{args.host}:{args.port}  (store {store})", flush=True)
    env = {**os.environ, "FORESHOCK_STORE": str(store)}
    env.pop(AUTH_ENV, None)
    if auth is not None:
        env[AUTH_ENV] = str(auth)  # the app's gate reads the allowlist there
    command = streamlit_command(args.host, args.port, auth)
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
        "address exposes the history to that network, unauthenticated unless --auth)",
    )
    dash.add_argument("--port", type=int, default=8501)
    dash.add_argument(
        "--auth",
        metavar="FILE",
        default=os.environ.get(AUTH_ENV) or None,
        help="log in through an OpenID Connect provider: a TOML file with Streamlit's [auth] "
        "settings and an [access] allowlist (docs/dashboard.md, Login; default "
        f"${AUTH_ENV}; without it the dashboard has no login)",
    )
    dash.set_defaults(func=_dashboard)
