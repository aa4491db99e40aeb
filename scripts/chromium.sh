#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser tests (tests/e2e/test_dashboard.py), installed once with
# apt where it is missing; prints its path. Playwright drives it: no browser is downloaded.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "[chromium] installing Debian's chromium (first time only)" >&2
  "$(dirname "$0")/apt-install.sh" chromium || { echo "[chromium] could not install Debian's chromium" >&2; exit 1; }
fi
command -v chromium
