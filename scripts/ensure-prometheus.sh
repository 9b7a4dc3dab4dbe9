#!/usr/bin/env bash
# Make sure Debian's Prometheus server binary is installed, for the test that runs every
# query of deploy/grafana's dashboard against a real Prometheus scraping a real router.
# Idempotent; installs with apt-get (sudo when not root) when missing. Only the binary is
# needed: the test starts its own server on a free port with a temporary data directory
# (recommended packages such as the node exporter are left out).
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
    echo "prometheus: $(command -v prometheus)"
    exit 0
fi
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
echo "prometheus: not found, installing Debian's package" >&2
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
echo "prometheus: $(command -v prometheus)"
