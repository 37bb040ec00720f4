#!/usr/bin/env bash
# Type-check the product code with mypy: every room and foreshock/*.py (the test command runs
# this after ruff); FORESHOCK_ROOMS="storage lab" checks those rooms alone.
# The package-dir layout maps the top-level folders into foreshock.*, which mypy cannot follow
# through the editable install's import hook: a temporary tree of links gives it those names.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/foreshock"
for room in app transport delivery producers remediation integrations detectors operate notify storage dashboard lab; do
  ln -s "$root/$room" "$tree/foreshock/$room"
done
for module in foreshock/*.py; do ln -s "$root/$module" "$tree/foreshock/"; done
cd "$tree"
# Every room and the ground floor's modules (foreshock/*.py) unless FORESHOCK_ROOMS names some.
if [ -n "${FORESHOCK_ROOMS:-}" ]; then
  targets=$(printf -- "-p foreshock.%s " ${FORESHOCK_ROOMS})
else
  targets="-p foreshock"
fi
"$root/.venv/bin/mypy" --ignore-missing-imports --cache-dir "$tree/.cache" $targets
