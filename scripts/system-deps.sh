#!/usr/bin/env bash
# System tools some tests use: kcat (reads the wire format like any Kafka tool), docker-compose
# v1 (validates compose/ offline) and Debian's chromium (the dashboard's browser tests, driven by
# Playwright; Playwright's own browser download does not work offline). Installed with apt when missing and we may; otherwise those
# tests skip with the reason — unless FORESHOCK_REQUIRE_SYSTEM_TOOLS=1 (CI), where they fail.
set -uo pipefail
missing=()
command -v kcat >/dev/null || missing+=(kcat)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v chromium >/dev/null || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: apt-get install ${missing[*]}" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") >/dev/null 2>&1 \
    || echo "setup: could not install ${missing[*]}; their tests will skip" >&2
else
  echo "setup: ${missing[*]} missing (not root / no apt); their tests will skip" >&2
fi
exit 0
