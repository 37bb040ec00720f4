#!/usr/bin/env bash
# Type-check the rooms that pass mypy (ROOMS; the test command runs this after ruff).
# The package-dir layout maps the top-level folders into foreshock.*, which mypy cannot follow
# through the editable install's import hook: a temporary tree of links gives it those names.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOMS=(${FORESHOCK_ROOMS:-transport notify storage detectors})
root=$PWD
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/foreshock"
for room in transport producers detectors notify storage dashboard lab; do
  ln -s "$root/$room" "$tree/foreshock/$room"
done
for module in foreshock/*.py; do ln -s "$root/$module" "$tree/foreshock/"; done
cd "$tree"
"$root/.venv/bin/mypy" --ignore-missing-imports --cache-dir "$tree/.cache" \
  $(printf -- "-p foreshock.%s " "${ROOMS[@]}")
