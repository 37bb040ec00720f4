"""The console script and the torch-free service side."""

import argparse
import importlib
import json
import logging
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from foreshock.app.cli import build_parser

BLOCK_TORCH = "import sys; sys.modules['torch'] = None\n"


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# Imports each module named in ``names`` and prints {module: error} for those that fail. A
# module whose top level calls main() (a dashboard page: Streamlit runs it as a script) is run
# without that call: its imports and definitions, not the page.
IMPORT_EACH = """
import ast, importlib, importlib.util, json
failed = {}
for name in names:
    try:
        origin = importlib.util.find_spec(name).origin
        tree = ast.parse(open(origin).read(), origin)
        body = [n for n in tree.body if ast.unparse(n) != 'main()']
        if len(body) == len(tree.body):
            importlib.import_module(name)
        else:
            scope = {'__name__': name, '__package__': name.rpartition('.')[0]}
            exec(compile(ast.Module(body, []), origin, 'exec'), scope)
    except Exception as exc:
        failed[name] = f'{type(exc).__name__}: {exc}'
print(json.dumps(failed))
"""


def _service_modules() -> list[str]:
    """Every module of the service side: the core and the service packages, recursively (the
    Kafka sink's room, ``delivery``, with its spool and ``spool flush``), and the producers'
    torch-free part (the file sinks)."""
    names = ["foreshock.producers", "foreshock.producers.sinks"]
    for package in [
        "foreshock",
        "foreshock.transport",
        "foreshock.delivery",
        "foreshock.detectors",
        "foreshock.notify",
        "foreshock.storage",
        "foreshock.dashboard",
    ]:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.walk_packages(path, f"{package}.")]
    return names


@pytest.mark.slow
def test_service_side_imports_without_torch() -> None:
    """Every service module imports with torch blocked, each by its name (a package whose
    ``__init__`` imports nothing proves nothing about its modules)."""
    names = _service_modules()
    # among them, those the first version of this check never imported
    issue = (
        "transport.consumer detectors.engine detectors.worker notify.notifier "
        "storage.sink storage.queries dashboard.app dashboard.views.fleet"
    )
    missing = {f"foreshock.{m}" for m in issue.split()} - set(names)
    assert not missing, sorted(missing)
    done = run_python(BLOCK_TORCH + f"names = {names!r}\n" + IMPORT_EACH)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def test_torch_really_blocked_in_that_check() -> None:
    """The check above can fail: importing a torch-side module with torch blocked errors."""
    done = run_python(BLOCK_TORCH + "import foreshock.producers.monitor\n")
    assert done.returncode != 0
    assert "torch" in done.stderr


def test_help_without_torch() -> None:
    done = run_python(BLOCK_TORCH + "from foreshock.app.cli import main\nmain(['--help'])\n")
    assert done.returncode == 0
    assert "smoke" in done.stdout


def test_smoke_without_torch_says_how_to_install() -> None:
    done = run_python(
        BLOCK_TORCH + "from foreshock.app.cli import main\nraise SystemExit(main(['smoke']))\n"
    )
    assert done.returncode == 2
    assert "pip install" in done.stderr


@pytest.mark.slow
def test_smoke_command_runs_and_writes_records(tmp_path: Path) -> None:
    out = tmp_path / "smoke.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "smoke",
            "--steps",
            "21",
            "--every",
            "5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "attn.d2.entropy_mean@h.0.attn" in done.stdout
    assert "router.token_entropy_norm@h.0.mlp.gate" in done.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "start" and lines[-1]["kind"] == "end"
    records = lines[1:-1]
    assert [r["step"] for r in records] == [0, 5, 10, 15, 20]
    assert "attn.d2.entropy_mean@h.1.attn" not in records[0]["values"]  # no snapshot yet
    assert 0.0 <= records[-1]["values"]["attn.d2.entropy_mean@h.1.attn"] <= 1.0


# ---------------------------------------------------------------- service conventions


def foreshock(*args: str, env: dict[str, str] | None = None, prelude: str = ""):
    """``foreshock ARGS`` in a fresh interpreter (logging and os.environ stay untouched here);
    ``prelude`` runs first (to stand in a quick fake for a command)."""
    code = (
        prelude + "import sys\nfrom foreshock.app.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FORESHOCK_")}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**full_env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "x.toml", "--log-level", "debug", "detect"],
        ["detect", "--config", "x.toml", "--log-level", "DEBUG"],
        ["--config", "other.toml", "detect", "--config", "x.toml", "--log-level", "Debug"],
        ["--log-level", "info", "detect", "--log-level", "debug", "--config", "x.toml"],
        ["lab", "--config", "x.toml", "run", "--out", "r.jsonl", "--log-level", "debug"],
        ["store", "info", "--config", "x.toml", "--log-level", "debug"],
    ],
)
def test_common_options_anywhere_on_the_line_the_last_one_wins(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.config, args.log_level) == ("x.toml", "DEBUG")


def test_common_options_default_to_none_everywhere() -> None:
    for argv in (["detect"], ["store", "info"], ["spool", "flush"]):
        args = build_parser().parse_args(argv)
        assert (args.config, args.log_level) == (None, None), argv


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaf_parsers(child, (*path, name))


def test_every_subcommand_takes_the_common_options() -> None:
    leaves = list(_leaf_parsers(build_parser()))
    assert len(leaves) > 15
    for path, parser in leaves:
        options = {s for a in parser._actions for s in a.option_strings}
        assert {"--config", "--log-level"} <= options, path


def test_config_after_the_subcommand_shows_in_its_help() -> None:
    done = foreshock("detect", "--config", "x.toml", "--help")
    assert done.returncode == 0, done.stderr
    assert "--config PATH" in done.stdout and "--log-level LEVEL" in done.stdout


@pytest.mark.slow
def test_a_real_command_reads_the_config_given_after_it(tmp_path: Path) -> None:
    """`store info` takes the store from the file's [store] section, wherever --config is."""
    store = tmp_path / "store-from-the-file"
    config = tmp_path / "foreshock.toml"
    config.write_text(f'[store]\nuri = "{store}"\n')
    for argv in (
        ["store", "info", "--config", str(config)],
        ["--config", str(config), "store", "info"],
    ):
        done = foreshock(*argv)
        assert done.returncode == 0, done.stderr
        assert str(store) in done.stdout, argv


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"FORESHOCK_KAFKA_PARTITIONS": "abc"}, "FORESHOCK_KAFKA_PARTITIONS='abc'"),
        ({"FORESHOCK_KAFKA_REPLICATION_FACTOR": "0"}, "FORESHOCK_KAFKA_REPLICATION_FACTOR='0'"),
        ({"FORESHOCK_KAFKA_RETENTION_MS": "7d"}, "FORESHOCK_KAFKA_RETENTION_MS='7d'"),
        ({"FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": ""}, "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS is empty"),
        ({"FORESHOCK_LOG_LEVEL": "loud"}, "FORESHOCK_LOG_LEVEL='loud'"),
    ],
)
def test_a_bad_setting_names_the_variable(env: dict[str, str], named: str) -> None:
    done = foreshock("topics", env=env)
    assert done.returncode == 2
    assert named in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_setting_in_the_file_names_the_key_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "foreshock.toml"
    config.write_text('[kafka]\npartitions = "many"\n')
    done = foreshock("topics", "--config", str(config))
    assert done.returncode == 2
    assert f"partitions in [kafka] of {config}='many'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_log_level_option_is_a_usage_error() -> None:
    done = foreshock("topics", "--log-level", "loud")
    assert done.returncode == 2
    assert "--log-level: 'loud': not a log level" in done.stderr


# `foreshock topics` replaced by a command that logs at INFO and DEBUG and reports the level
# its child processes would inherit.
FAKE_TOPICS = """
import logging, os
from foreshock.transport import commands
def fake(args):
    log = logging.getLogger("foreshock.test")
    log.info("retrying in 0.5 s")
    log.debug("detail")
    print("child level:", os.environ.get("FORESHOCK_LOG_LEVEL"))
    return 0
commands._topics = fake
"""
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|DEBUG) foreshock\.test: (.*)$")


@pytest.mark.parametrize(
    ("argv", "env", "shown", "child"),
    [
        (["topics"], {}, ["retrying in 0.5 s"], "None"),
        (["topics", "--log-level", "debug"], {}, ["retrying in 0.5 s", "detail"], "DEBUG"),
        (["--log-level", "debug", "topics"], {}, ["retrying in 0.5 s", "detail"], "DEBUG"),
        (["topics"], {"FORESHOCK_LOG_LEVEL": "debug"}, ["retrying in 0.5 s", "detail"], "debug"),
        (["topics"], {"FORESHOCK_LOG_LEVEL": "WARNING"}, [], "WARNING"),
        (
            ["topics", "--log-level", "info"],
            {"FORESHOCK_LOG_LEVEL": "WARNING"},
            ["retrying in 0.5 s"],
            "INFO",
        ),
    ],
)
def test_every_command_logs_time_level_and_logger(argv, env, shown, child) -> None:
    done = foreshock(*argv, env=env, prelude=FAKE_TOPICS)
    assert done.returncode == 0, done.stderr
    lines = [LINE.match(line) for line in done.stderr.splitlines()]
    assert all(lines), done.stderr  # every line: UTC time, level, logger
    assert [m[2] for m in lines] == shown
    assert f"child level: {child}" in done.stdout


def test_the_dashboard_runs_streamlit_in_viewer_mode_at_the_log_level() -> None:
    from foreshock.dashboard.commands import streamlit_command

    root = logging.getLogger()
    before = root.level
    try:
        root.setLevel(logging.WARNING)
        command = streamlit_command("127.0.0.1", 8501)
    finally:
        root.setLevel(before)
    flags = dict(zip(command[5::2], command[6::2], strict=True))
    assert flags["--client.toolbarMode"] == "viewer"  # no "Deploy", no developer menu
    assert flags["--global.developmentMode"] == "false"
    assert flags["--logger.level"] == "warning"
