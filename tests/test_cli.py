"""The console script and the torch-free service side."""

import json
import subprocess
import sys
from pathlib import Path

BLOCK_TORCH = "import sys; sys.modules['torch'] = None\n"


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_service_side_imports_without_torch() -> None:
    """detectors, storage, dashboard, the record format and the CLI never need torch."""
    code = BLOCK_TORCH + (
        "import foreshock, foreshock.cli, foreshock.detectors, foreshock.storage\n"
        "import foreshock.dashboard, foreshock.producers.records, foreshock.table\n"
        "from foreshock.producers.records import parse_series_key\n"
        "print(parse_series_key('attn.d2.entropy@h.0.attn#h1').head)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_torch_really_blocked_in_that_check() -> None:
    """The check above can fail: importing a torch-side module with torch blocked errors."""
    done = run_python(BLOCK_TORCH + "import foreshock.producers.monitor\n")
    assert done.returncode != 0
    assert "torch" in done.stderr


def test_help_without_torch() -> None:
    done = run_python(BLOCK_TORCH + "from foreshock.cli import main\nmain(['--help'])\n")
    assert done.returncode == 0
    assert "smoke" in done.stdout


def test_smoke_without_torch_says_how_to_install() -> None:
    done = run_python(
        BLOCK_TORCH + "from foreshock.cli import main\nraise SystemExit(main(['smoke']))\n"
    )
    assert done.returncode == 2
    assert "pip install" in done.stderr


def test_smoke_command_runs_and_writes_records(tmp_path: Path) -> None:
    out = tmp_path / "smoke.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "foreshock.cli", "smoke", "--steps", "21", "--every", "5",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "attn.d2.entropy_mean@h.0.attn" in done.stdout
    assert "router.token_entropy_norm@h.0.mlp.gate" in done.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "start" and lines[-1]["kind"] == "end"
    records = lines[1:-1]
    assert [r["step"] for r in records] == [0, 5, 10, 15, 20]
    assert "attn.d2.entropy_mean@h.1.attn" not in records[0]["values"]  # no snapshot yet
    assert 0.0 <= records[-1]["values"]["attn.d2.entropy_mean@h.1.attn"] <= 1.0
