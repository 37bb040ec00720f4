"""The dashboard's login (``foreshock dashboard --auth FILE``): Streamlit's own OpenID Connect
login (``st.login``, ``st.user``, ``st.logout``) and an allowlist of foreshock's own.

FILE is one TOML file with two sections::

    [auth]      # Streamlit's, read by Streamlit as its secrets file
    redirect_uri = "https://dashboard.example.org/oauth2callback"
    cookie_secret = "…"   # long and random: it signs the identity cookie
    client_id = "…"
    client_secret = "…"
    server_metadata_url = "https://idp.example.org/.well-known/openid-configuration"

    [access]    # foreshock's: who, once logged in, is let in
    allowed_users = ["alice@example.org"]   # e-mail addresses, any case
    allowed_groups = ["ml-oncall"]          # any of them in the claim below
    groups_claim = "groups"                 # the default

``foreshock dashboard`` checks the file before it starts (:func:`load_access`), hands it to
Streamlit (``--secrets.files``) and its path to the app (``$FORESHOCK_DASHBOARD_AUTH``); the app
calls :func:`gate` before its navigation. Without the variable the gate does nothing: the
dashboard is open, as before. No message here carries a value from the file, only key names.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV", "Access", "AuthConfigError", "allowed", "gate", "load_access"]

ENV = "FORESHOCK_DASHBOARD_AUTH"
# the default provider's settings, flat in [auth] (Streamlit's named providers are not used)
REQUIRED = ("redirect_uri", "cookie_secret", "client_id", "client_secret", "server_metadata_url")
MIN_COOKIE_SECRET = 32  # characters; `python -c "import secrets; print(secrets.token_hex(32))"`
ACCESS_KEYS = {"allowed_users", "allowed_groups", "groups_claim"}


class AuthConfigError(ValueError):
    """The auth file is missing, unreadable or incomplete (the message names keys, never
    values)."""


@dataclass(frozen=True)
class Access:
    users: frozenset[str]  # lower-case e-mail addresses
    groups: frozenset[str]
    groups_claim: str = "groups"
    redirect_uri: str = ""  # where the provider sends the browser back (not a secret)


def _strings(section: Mapping[str, object], key: str) -> list[str]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise AuthConfigError(f"[access] {key} must be a list of non-empty strings")
    return [v.strip() for v in value]


def load_access(path: Path) -> Access:
    """The allowlist of ``path``, once its ``[auth]`` section is checked complete."""
    try:
        with open(path, "rb") as f:
            settings = tomllib.load(f)
    except OSError as exc:
        raise AuthConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:  # where, not what: the message may quote the file
        where = re.search(r"\(at (?:line \d+, column \d+|end of document)\)", str(exc))
        raise AuthConfigError(
            f"{path} is not valid TOML{' ' + where[0] if where else ''}"
        ) from None
    auth = settings.get("auth")
    if not isinstance(auth, dict):
        raise AuthConfigError(f"{path} has no [auth] section")
    missing = [k for k in REQUIRED if not isinstance(auth.get(k), str) or not auth[k].strip()]
    if missing:
        raise AuthConfigError(f"[auth] in {path} lacks {', '.join(missing)}")
    if not auth["redirect_uri"].rstrip().endswith("/oauth2callback"):
        raise AuthConfigError("[auth] redirect_uri must end with /oauth2callback")
    for key in ("redirect_uri", "server_metadata_url"):
        if not auth[key].startswith(("http://", "https://")):
            raise AuthConfigError(f"[auth] {key} must be an absolute http(s) URL")
    if len(auth["cookie_secret"]) < MIN_COOKIE_SECRET:
        raise AuthConfigError(
            f"[auth] cookie_secret is shorter than {MIN_COOKIE_SECRET} characters: "
            'make one with python -c "import secrets; print(secrets.token_hex(32))"'
        )
    access = settings.get("access", {})
    if not isinstance(access, dict):
        raise AuthConfigError(f"[access] in {path} must be a table")
    unknown = sorted(set(access) - ACCESS_KEYS)
    if unknown:
        raise AuthConfigError(f"[access] has unknown keys: {', '.join(unknown)}")
    claim = access.get("groups_claim", "groups")
    if not isinstance(claim, str) or not claim:
        raise AuthConfigError("[access] groups_claim must be a claim name")
    users, groups = _strings(access, "allowed_users"), _strings(access, "allowed_groups")
    if not users and not groups:
        raise AuthConfigError(
            f"[access] in {path} allows nobody: set allowed_users and/or allowed_groups"
        )
    return Access(
        frozenset(u.lower() for u in users), frozenset(groups), claim, auth["redirect_uri"].strip()
    )


def allowed(user: Mapping[str, object], access: Access) -> bool:
    """Whether the logged-in ``user`` (the identity token's claims) may see the dashboard: its
    e-mail is listed (and not marked unverified by the provider), or its groups claim, a list
    or one string, holds a listed group."""
    email, verified = user.get("email"), user.get("email_verified") is not False
    if isinstance(email, str) and verified and email.strip().lower() in access.users:
        return True
    groups = user.get(access.groups_claim)
    if isinstance(groups, str):
        groups = [groups]
    return isinstance(groups, list) and any(
        isinstance(g, str) and g in access.groups for g in groups
    )


def gate() -> None:
    """Return when the dashboard is open (no ``$FORESHOCK_DASHBOARD_AUTH``) or the visitor is
    logged in and allowed; otherwise show a login or a refusal page and stop the script run,
    before any page, navigation or query."""
    path = os.environ.get(ENV)
    if not path:
        return
    import streamlit as st

    from foreshock.dashboard.text import md_text

    try:
        access = load_access(Path(path))  # each run: an edited allowlist applies at once
    except AuthConfigError as exc:  # fail closed; the reason names keys, not values
        logging.getLogger(__name__).error("dashboard login: %s", exc)
        st.title("foreshock")
        st.error("The dashboard's login is misconfigured; its operator can check the auth file.")
        st.stop()
    user = st.user.to_dict()
    if not user.get("is_logged_in"):
        st.title("foreshock")
        st.write("Log in to see the fleet dashboard.")
        if st.button("Log in", type="primary"):
            st.login()
        st.stop()
    if not allowed(user, access):
        who = user.get("email") or user.get("sub") or "this account"
        st.title("foreshock")
        st.error(f"{md_text(who)} is not allowed to see this dashboard.")
        st.write("Ask its operator to add you, or log in with another account.")
        if st.button("Log out"):
            st.logout()
        st.stop()
    with st.sidebar:
        st.caption(f"Logged in as {md_text(user.get('email') or user.get('sub') or '')}")
        if st.button("Log out"):
            st.logout()
