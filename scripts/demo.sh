#!/usr/bin/env bash
# The main job: set everything up, then a short healthy run with the monitors attached.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh torch,broker
exec .venv/bin/foreshock smoke "$@"
