#!/usr/bin/env bash
# Set everything up, then lint and run the whole test suite (doctests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh torch,dev,broker,dashboard,hf,lightning
bash scripts/system-deps.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
