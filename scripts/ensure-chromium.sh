#!/usr/bin/env bash
# Make sure Debian's headless Chromium is installed, for the test that renders the
# HTML report. Idempotent; installs with apt-get (sudo when not root) when missing.
set -euo pipefail
# shellcheck source=scripts/apt-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/apt-lib.sh"
apt_ensure chromium chromium
