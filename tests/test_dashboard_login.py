"""The dashboard's login end to end (slow): `foreshock dashboard --auth FILE` over a seeded
history, a real OpenID Connect provider (``oidc-provider-mock``, on 127.0.0.1 in this process)
and Debian's headless Chromium through Playwright.

A visitor who has not logged in gets a login page and nothing else; a user whose e-mail is
listed, or whose ``groups`` claim holds a listed group, gets the fleet; anyone else a refusal.
Every browser starts with no cookies (a context of its own) and every wait has a bound.

First (fast), the auth file's checks, the allowlist's rule, and the app's gate under Streamlit's
AppTest (``st.user`` as AppTest sets it).
"""

from __future__ import annotations

import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import require_tool
from streamlit.testing.v1 import AppTest
from test_dashboard import seed_history
from test_dashboard_browser import ARTIFACTS, CHROMIUM_ARGS, _plain, wait_healthy

from foreshock.dashboard.auth import ENV, Access, AuthConfigError, allowed, load_access
from foreshock.dashboard.commands import streamlit_command
from foreshock.transport.broker import free_port

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
RUN_IDS = ["live-fa", "fa-lowprec-s1", "lr-high-s2", "healthy-s3"]  # what seed_history writes
ALICE = "alice@example.test"  # allowed by her e-mail (listed in another case)
BOB = "bob@example.test"  # allowed by a group
MALLORY = "mallory@example.test"  # neither
CLIENT_SECRET = "client-secret-c0ffee-never-shown"
COOKIE_SECRET = "cookie-secret-5eed-never-shown-0123456789abcdef"
WAIT_MS = 60_000  # any one wait in the browser
FIRST_RENDER_MS = 90_000  # a cold Streamlit renders a blank page for its first seconds


def _auth_file(folder: Path, access: str, **auth: str) -> Path:
    settings = {
        "redirect_uri": "https://dash.example.test/oauth2callback",
        "cookie_secret": COOKIE_SECRET,
        "client_id": "foreshock-dashboard",
        "client_secret": CLIENT_SECRET,
        "server_metadata_url": "https://idp.example.test/.well-known/openid-configuration",
        **auth,
    }
    path = folder / "auth.toml"
    lines = [f"{k} = {v!r}".replace("'", '"') for k, v in settings.items() if v != "-"]
    path.write_text("[auth]\n" + "\n".join(lines) + "\n\n[access]\n" + access)
    return path


def test_the_auth_file_gives_the_allowlist(tmp_path):
    path = _auth_file(
        tmp_path,
        'allowed_users = [" Alice@Example.TEST "]\nallowed_groups = ["ml-oncall"]\n'
        'groups_claim = "roles"\n',
    )
    assert load_access(path) == Access(
        frozenset({"alice@example.test"}),
        frozenset({"ml-oncall"}),
        "roles",
        "https://dash.example.test/oauth2callback",
    )


@pytest.mark.parametrize(
    ("access", "auth", "reason"),
    [
        ('allowed_users = ["a@example.test"]\n', {"client_secret": "-"}, "lacks client_secret"),
        ("", {}, "allows nobody"),
        ("allowed_users = []\nallowed_groups = []\n", {}, "allows nobody"),
        ('allowed_users = "a@example.test"\n', {}, "must be a list"),
        ('allowed_user = ["a@example.test"]\n', {}, "unknown keys: allowed_user"),
        ('allowed_groups = ["g"]\n', {"cookie_secret": "short"}, "cookie_secret is shorter"),
        ('allowed_groups = ["g"]\n', {"redirect_uri": "https://d.test/"}, "/oauth2callback"),
        ('allowed_groups = ["g"]\nx = "' + CLIENT_SECRET, {}, "not valid TOML (at "),
    ],
    ids=[
        "no-client-secret",
        "no-access",
        "empty-access",
        "not-a-list",
        "unknown-key",
        "short-cookie-secret",
        "redirect-path",
        "bad-toml",
    ],
)
def test_an_auth_file_that_cannot_work_is_refused_without_its_secrets(
    tmp_path, access, auth, reason
):
    with pytest.raises(AuthConfigError) as refused:
        load_access(_auth_file(tmp_path, access, **auth))
    assert reason in str(refused.value)
    assert CLIENT_SECRET not in str(refused.value) and COOKIE_SECRET not in str(refused.value)


def test_who_is_allowed():
    access = Access(frozenset({"alice@example.test"}), frozenset({"ml-oncall"}))
    assert allowed({"email": "Alice@Example.test"}, access)
    assert allowed({"email": "bob@example.test", "groups": ["staff", "ml-oncall"]}, access)
    assert allowed({"email": "bob@example.test", "groups": "ml-oncall"}, access)  # one string
    assert not allowed({"email": "bob@example.test", "groups": ["staff"]}, access)
    assert not allowed({"email": "alice@example.test", "email_verified": False}, access)
    assert not allowed({"sub": "alice@example.test"}, access)  # a subject is not an e-mail
    assert not allowed({"email": "bob@example.test", "roles": ["ml-oncall"]}, access)
    assert allowed({"roles": ["ml-oncall"]}, Access(frozenset(), frozenset({"ml-oncall"}), "roles"))


def test_the_auth_file_is_streamlits_only_secrets_file(tmp_path):
    flags = streamlit_command("127.0.0.1", 8501, tmp_path / "auth.toml")[5:]
    assert dict(zip(flags[::2], flags[1::2], strict=True))["--secrets.files"] == str(
        tmp_path / "auth.toml"
    )
    assert "--secrets.files" not in streamlit_command("127.0.0.1", 8501)  # as before


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gate") / "history"
    seed_history(root)
    return root


def _app(history: Path, monkeypatch, user: dict | None = None) -> tuple[AppTest, str]:
    """app.py run once as ``user``; what it shows, as one text."""
    monkeypatch.setenv("FORESHOCK_STORE", str(history))
    app = AppTest.from_file(str(APP), default_timeout=60)
    if user is not None:
        app.user = user
    app.run()
    assert not app.exception, app.exception
    shown = [e.value for kind in ("title", "markdown", "error", "caption") for e in app.get(kind)]
    return app, "\n".join(map(str, shown))


def test_without_auth_the_dashboard_is_open_as_before(history, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    app, shown = _app(history, monkeypatch)
    assert all(f'data-run="{run}"' in shown for run in RUN_IDS)
    assert not [b for b in app.button if b.label in ("Log in", "Log out")]


@pytest.mark.parametrize(
    ("user", "shows"),  # not "page": conftest takes a test with that fixture for a browser test
    [
        (None, "login"),  # AppTest's default user: not logged in
        ({"is_logged_in": False}, "login"),
        ({"is_logged_in": True, "email": ALICE, "groups": []}, "fleet"),
        ({"is_logged_in": True, "email": MALLORY, "groups": ["ml-oncall"]}, "fleet"),
        ({"is_logged_in": True, "email": MALLORY, "groups": ["staff"]}, "refusal"),
        ({"is_logged_in": True, "sub": "no-email"}, "refusal"),
    ],
    ids=["default", "logged-out", "listed", "in-group", "not-allowed", "no-email"],
)
def test_the_gate_shows_the_fleet_only_to_an_allowed_user(
    history, monkeypatch, tmp_path, user, shows
):
    path = _auth_file(tmp_path, f'allowed_users = ["{ALICE}"]\nallowed_groups = ["ml-oncall"]\n')
    monkeypatch.setenv(ENV, str(path))
    app, shown = _app(history, monkeypatch, user)
    buttons = [b.label for b in app.button]
    if shows == "fleet":
        assert all(f'data-run="{run}"' in shown for run in RUN_IDS)
        assert f"Logged in as {user['email']}" in _plain(shown.replace("\\", ""))  # Markdown
        assert "Log out" in buttons
        return
    assert not [run for run in RUN_IDS if run in shown], shown
    assert CLIENT_SECRET not in shown and COOKIE_SECRET not in shown
    if shows == "login":
        assert buttons == ["Log in"] and "Log in to see the fleet dashboard." in shown
    else:
        assert buttons == ["Log out"] and "is not allowed to see this dashboard" in shown


def test_a_broken_auth_file_shuts_everyone_out(history, monkeypatch, tmp_path):
    path = _auth_file(tmp_path, "")  # allows nobody
    monkeypatch.setenv(ENV, str(path))
    _, shown = _app(history, monkeypatch, {"is_logged_in": True, "email": ALICE})
    assert "misconfigured" in shown and not [run for run in RUN_IDS if run in shown]
    assert str(path) not in shown  # not even where it is


@pytest.fixture(scope="module")
def provider():
    """oidc-provider-mock on 127.0.0.1 (any client id and secret is accepted; a nonce is
    required, as Streamlit sends one), with three users and their claims."""
    from oidc_provider_mock import User, app
    from werkzeug.serving import make_server

    users = [
        User(sub=ALICE, claims={"email": ALICE, "name": "Alice", "groups": ["interns"]}),
        User(sub=BOB, claims={"email": BOB, "name": "Bob", "groups": ["ml-oncall", "staff"]}),
        User(sub=MALLORY, claims={"email": MALLORY, "name": "Mallory", "groups": ["staff"]}),
    ]
    server = make_server("127.0.0.1", 0, app(user_claims=users, require_nonce=True), threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, provider):
    """`foreshock dashboard --auth FILE` on a free port; yields its URL and its log file."""
    folder = tmp_path_factory.mktemp("login")
    root = folder / "history"
    seed_history(root)
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    auth = folder / "auth.toml"
    auth.write_text(
        "[auth]\n"
        f'redirect_uri = "{address}/oauth2callback"\n'
        f'cookie_secret = "{COOKIE_SECRET}"\n'
        'client_id = "foreshock-dashboard"\n'
        f'client_secret = "{CLIENT_SECRET}"\n'
        f'server_metadata_url = "{provider}/.well-known/openid-configuration"\n'
        "\n[access]\n"
        f'allowed_users = ["{ALICE.upper()}", "nobody@example.test"]\n'  # any case
        'allowed_groups = ["ml-oncall"]\n'
    )
    auth.chmod(stat.S_IRUSR | stat.S_IWUSR)
    log = folder / "dashboard.log"
    command = [sys.executable, "-m", "foreshock.app.cli", "dashboard", "--store", str(root)]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--auth", str(auth)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        wait_healthy(address, process)
        yield address, log
    finally:
        process.terminate()
        process.wait(20)


@pytest.fixture(scope="module")
def browser(dashboard):
    chromium = require_tool("chromium")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def tab(browser):
    """A page in a fresh context: no cookie from another test's login."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(WAIT_MS)
    yield context.new_page()
    context.close()


def _settled(tab) -> None:
    """Streamlit's script run is over: what the page shows now is all it will show."""
    tab.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]')


def _shows_no_data(tab) -> None:
    body = tab.locator("body").inner_text()
    assert not [run for run in RUN_IDS if run in body], body
    assert tab.locator("table.fs-fleet, .js-plotly-plot").count() == 0
    assert tab.locator('[data-testid="stSidebarNav"]').count() == 0  # no other page offered


def _log_in(tab, url: str, provider: str, sub: str) -> None:
    """From the login page through the provider's form (the user's subject, "Authorize") and
    back to the dashboard."""
    tab.goto(f"{url}/")
    tab.get_by_role("button", name="Log in").click(timeout=FIRST_RENDER_MS)
    tab.wait_for_url(f"{provider}/oauth2/authorize?*")
    tab.get_by_placeholder("sub").fill(sub)
    tab.get_by_role("button", name="Authorize", exact=True).click()
    tab.wait_for_url(f"{url}/")  # Streamlit's /oauth2callback sends the browser home


@pytest.mark.slow
def test_a_visitor_who_has_not_logged_in_sees_only_the_login_page(dashboard, tab):
    url, _ = dashboard
    for path in ("/", "/run?run=fa-lowprec-s1", "/compare", "/tuning"):
        tab.goto(f"{url}{path}")
        tab.get_by_role("button", name="Log in").wait_for(timeout=FIRST_RENDER_MS)
        _settled(tab)
        assert tab.get_by_role("heading", name="foreshock").count() == 1
        _shows_no_data(tab)
    tab.screenshot(path=ARTIFACTS / "login.png", full_page=True)


@pytest.mark.slow
@pytest.mark.parametrize("sub", [ALICE, BOB], ids=["listed-email", "listed-group"])
def test_an_allowed_user_logs_in_and_sees_the_fleet(dashboard, provider, tab, sub):
    url, _ = dashboard
    _log_in(tab, url, provider, sub)
    tab.wait_for_selector('tr[data-run="live-fa"]', timeout=FIRST_RENDER_MS)
    shown = {row.get_attribute("data-run") for row in tab.locator("table.fs-fleet tbody tr").all()}
    assert shown == set(RUN_IDS)
    sidebar = tab.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Logged in as").wait_for()
    assert f"Logged in as {sub}" in _plain(sidebar.inner_text())
    assert sidebar.get_by_role("button", name="Log out").count() == 1
    tab.get_by_role("link", name="Tuning").click()  # the other pages are there too
    tab.wait_for_selector("text=live detector config")
    tab.screenshot(path=ARTIFACTS / f"login-allowed-{sub.split('@')[0]}.png", full_page=True)


@pytest.mark.slow
def test_a_user_not_allowed_is_refused_and_sees_no_data(dashboard, provider, tab):
    url, _ = dashboard
    _log_in(tab, url, provider, MALLORY)
    tab.get_by_text("is not allowed to see this dashboard").wait_for(timeout=FIRST_RENDER_MS)
    _settled(tab)
    assert f"{MALLORY} is not allowed" in _plain(tab.locator("body").inner_text())
    _shows_no_data(tab)
    tab.screenshot(path=ARTIFACTS / "login-refused.png", full_page=True)
    tab.goto(f"{url}/run?run=fa-lowprec-s1")  # no page behind the refusal either
    tab.get_by_text("is not allowed").wait_for(timeout=FIRST_RENDER_MS)
    _settled(tab)
    _shows_no_data(tab)
    tab.get_by_role("button", name="Log out").click()  # Streamlit drops its identity cookie
    tab.wait_for_url(f"{provider}/**")  # and asks the provider to end its session
    tab.goto(f"{url}/")
    tab.get_by_role("button", name="Log in").wait_for(timeout=FIRST_RENDER_MS)


@pytest.mark.slow
def test_no_secret_reaches_the_log(dashboard):
    _, log = dashboard
    text = Path(log).read_text()
    assert "login required" in text  # foreshock dashboard said it is on
    assert CLIENT_SECRET not in text and COOKIE_SECRET not in text
