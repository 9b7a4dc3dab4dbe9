#!/usr/bin/env bash
# Make sure Debian's Prometheus server binary is installed, for the test that runs every
# query of deploy/grafana's dashboard against a real Prometheus scraping a real router.
# Idempotent; installs with apt-get (sudo when not root) when missing. Only the binary is
# needed: the test starts its own server on a free port with a temporary data directory
# (recommended packages such as the node exporter are left out).
set -euo pipefail
# shellcheck source=scripts/apt-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/apt-lib.sh"
apt_ensure prometheus --no-install-recommends prometheus
