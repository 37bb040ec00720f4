#!/usr/bin/env bash
# Set everything up, then lint and run the whole test suite (doctests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh torch,dev,broker,dashboard,hf,lightning,megatron
bash scripts/system-deps.sh
# OLMo-core for its adapter's test (tests/test_olmo_core.py): ai2-olmo-core 3.0.0 reaches
# older huggingface_hub/rich/filelock through cached-path's pins, so those two come without
# their pins (the code the test runs works with the newer ones) and the rest under
# constraints.txt; nothing already installed changes.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
  ai2-olmo-core==3.0.0 cached-path==1.8.10 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt \
  bettermap dataclass-extensions importlib_resources google-cloud-storage 2>&1 |
  grep -v "^WARNING: Location\|requires\|dependency resolver" || true
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh  # mypy on the product code
# Two workers, a test file each at a time (a file's module fixtures stay in one process; each
# worker starts its own broker): most system tests wait on brokers and processes, so two
# workers halve the wall time on two cores. FORESHOCK_TEST_WORKERS=0 runs in one process.
workers="${FORESHOCK_TEST_WORKERS:-2}"
if [ "$workers" = "0" ]; then exec .venv/bin/python -m pytest "$@"; fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
