#!/usr/bin/env bash
# Creates .venv (reused if present) and installs foreshock editable with the given extras,
# under constraints.txt: pyproject.toml gives lower bounds (foreshock is a library that installs
# beside a trainer's own torch), constraints.txt the exact versions this project is tested with.
# torch is taken from the local CPU wheel in /opt/wheels: from PyPI the pinned version is a
# multi-GB CUDA build, which this script refuses to download by accident.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-torch}"
torch_pin="$(sed -n 's/^torch==\([^ #]*\).*/\1/p' constraints.txt)"
[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if [[ "$extras" == *torch* ]] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -d /opt/wheels ]; then
    pip+=(--find-links /opt/wheels)
  elif [ "${FORESHOCK_ALLOW_PYPI_TORCH:-0}" != "1" ]; then
    echo "setup: no local CPU torch wheel in /opt/wheels; PyPI's torch==${torch_pin} is a" >&2
    echo "setup: multi-GB CUDA build. Install a CPU torch ${torch_pin} into .venv first, or" >&2
    echo "setup: set FORESHOCK_ALLOW_PYPI_TORCH=1 to accept the download." >&2
    exit 1
  fi
fi
"${pip[@]}" --upgrade pip
"${pip[@]}" -c constraints.txt -e ".[${extras}]"
