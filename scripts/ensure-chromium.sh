#!/usr/bin/env bash
# Make sure Debian's headless Chromium is installed, for the test that renders the
# HTML report. Idempotent; installs with apt-get (sudo when not root) when missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    echo "chromium: $(command -v chromium)"
    exit 0
fi
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
echo "chromium: not found, installing Debian's package" >&2
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium >/dev/null
echo "chromium: $(command -v chromium)"
