#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser tests (tests/e2e/test_dashboard.py), installed once with
# apt where it is missing; prints its path. Playwright drives it: no browser is downloaded.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "[chromium] installing Debian's chromium (first time only)" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "[chromium] needs root to install the package: sudo apt-get install chromium" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || {
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
fi
command -v chromium
