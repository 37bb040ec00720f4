#!/usr/bin/env bash
# Creates .venv (reused if present) and installs foreshock editable with the given extras.
# torch is pinned to 2.13.0 and taken from the local CPU wheel in /opt/wheels: from PyPI the
# same version is a multi-GB CUDA build, which this script refuses to download by accident.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-torch}"
[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if [[ "$extras" == *torch* ]] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -d /opt/wheels ]; then
    pip+=(--find-links /opt/wheels)
  elif [ "${FORESHOCK_ALLOW_PYPI_TORCH:-0}" != "1" ]; then
    echo "setup: no local CPU torch wheel in /opt/wheels; PyPI's torch==2.13.0 is a multi-GB" >&2
    echo "setup: CUDA build. Install a CPU torch 2.13.0 into .venv first, or set" >&2
    echo "setup: FORESHOCK_ALLOW_PYPI_TORCH=1 to accept the download." >&2
    exit 1
  fi
fi
"${pip[@]}" --upgrade pip
"${pip[@]}" -e ".[${extras}]"
