#!/usr/bin/env bash
# The main job: set everything up, then `foreshock demo` — the embedded broker, the storage sink,
# a detector worker and the dashboard, watching a fleet of live and replayed lab runs fail.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh torch,broker,dashboard
exec .venv/bin/foreshock demo "$@"
