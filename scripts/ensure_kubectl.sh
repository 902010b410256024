#!/usr/bin/env bash
# tests/integration/test_emulator_protocol.py runs the source document's literal `kubectl apply -f ...`.
# Install kubectl from Debian (package kubernetes-client) when it is missing.
set -euo pipefail
if command -v kubectl > /dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "kubectl is not installed; run as root or: sudo apt-get install -y kubernetes-client" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq kubernetes-client > /dev/null
