#!/usr/bin/env bash
# Creates .venv (if missing) and installs foreshock with the given extras, editable.
# torch is pinned to 2.13.0: on this kind of machine pip takes the local CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-torch}"
python3 -m venv .venv
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${find_links[@]}" -e ".[${extras}]"
