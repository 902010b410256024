#!/usr/bin/env bash
# The Celery e2e deployment (tests/e2e/test_backfill_celery.py) uses a real Redis as its broker. Install the
# server from Debian when it is missing; the tests start and stop their own, on 127.0.0.1, with no persistence.
set -euo pipefail
if command -v redis-server > /dev/null || [ -x /usr/bin/redis-server ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "redis-server is not installed; run as root or: sudo apt-get install -y redis-server" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq redis-server > /dev/null
# Debian's package may start a system-wide server on 6379 (not where policy-rc.d forbids it, as in containers);
# the tests never use it, so it is stopped. On a host with systemd it stays enabled at boot.
if command -v service > /dev/null; then service redis-server stop > /dev/null 2>&1 || true; fi
