#!/usr/bin/env bash
# The savings view's browser test (tests/e2e/test_partitioned_assets.py) drives Debian's headless Chromium with
# Playwright (the Python package is pinned in constraints.txt; Playwright's own browser download is not used).
# Install the browser from Debian when it is missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "chromium is not installed; run as root or: sudo apt-get install -y chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core > /dev/null
