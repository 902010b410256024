#!/usr/bin/env bash
# The e2e suite runs Airflow on a real PostgreSQL. Install the server from Debian when it is missing.
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || command -v initdb > /dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "PostgreSQL is not installed; run as root or: sudo apt-get install -y postgresql" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq postgresql > /dev/null
