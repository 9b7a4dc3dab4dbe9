#!/usr/bin/env bash
# Make sure a virtual environment with NVIDIA aiperf exists OUTSIDE the repo, for the
# end-to-end test that replays a Mooncake trace with aiperf through the router
# (tests/e2e/test_aiperf_replay.py).
#
#   AIPERF=$(scripts/ensure-aiperf.sh | tail -1)
#   "$AIPERF" profile --custom-dataset-type mooncake_trace --fixed-schedule ...
#
# Its own venv because aiperf pins versions the project's .venv has newer of (pyzmq
# ~=26.4, rich ~=14.1, pillow ~=12.3): installing it there would downgrade them.
#
# Idempotent: the first run creates the venv and installs aiperf from PyPI (a minute or
# two, about 1 GB); later runs find the stamp file and return in well under a second.
# A venv that is missing, half-installed (no stamp) or whose stamp does not match the
# wanted version is rebuilt from scratch.
#
# Environment:
#   PDD_ROUTER_AIPERF_VENV    where the venv lives (default ~/.cache/pdd-router/aiperf-venv)
#   PDD_ROUTER_AIPERF_PYTHON  interpreter to build it with (default python3.11, else python3;
#                             aiperf 0.13 needs Python 3.11 to 3.13)
#
# Progress goes to stderr; the last line on stdout is the venv's aiperf executable.
set -euo pipefail

AIPERF_VERSION="0.13.0"
VENV="${PDD_ROUTER_AIPERF_VENV:-$HOME/.cache/pdd-router/aiperf-venv}"
STAMP="$VENV/.pdd-router-aiperf-stamp"
WANT_STAMP="aiperf==${AIPERF_VERSION}"

log() { echo "ensure-aiperf: $*" >&2; }

stamp_ok() {
    [ -x "$VENV/bin/aiperf" ] && [ -f "$STAMP" ] || return 1
    [ "$(head -1 "$STAMP")" = "$WANT_STAMP" ] || return 1
    "$VENV/bin/python" - "$AIPERF_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("aiperf") == sys.argv[1], version("aiperf")
PY
}

if stamp_ok; then
    log "aiperf venv ready at $VENV ($(head -1 "$STAMP"))"
    echo "$VENV/bin/aiperf"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
# Serialize concurrent runs on one machine.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    if ! flock -n 9; then
        log "another install holds $VENV.lock; waiting"
        flock 9
    fi
    if stamp_ok; then
        log "aiperf venv ready at $VENV ($(head -1 "$STAMP"))"
        echo "$VENV/bin/aiperf"
        exit 0
    fi
fi

start=$(date +%s)

BASE_PY="${PDD_ROUTER_AIPERF_PYTHON:-}"
if [ -z "$BASE_PY" ]; then
    if command -v python3.11 >/dev/null 2>&1; then BASE_PY=python3.11; else BASE_PY=python3; fi
fi
log "base interpreter: $("$BASE_PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

if [ -e "$VENV" ]; then
    # Only ever delete something that looks like a venv (or an empty directory).
    if [ -f "$VENV/pyvenv.cfg" ] || [ -z "$(ls -A "$VENV" 2>/dev/null)" ]; then
        log "removing missing/broken/outdated venv at $VENV"
        rm -rf "$VENV"
    else
        log "$VENV exists and is not a virtual environment; refusing to delete it"
        exit 1
    fi
fi

log "creating venv at $VENV"
"$BASE_PY" -m venv "$VENV"
log "pip install aiperf==${AIPERF_VERSION} (first time: a minute or two)"
"$VENV/bin/python" -m pip install --no-input --quiet "aiperf==${AIPERF_VERSION}" >&2

log "checking that aiperf runs"
"$VENV/bin/aiperf" --version >&2

{
    echo "$WANT_STAMP"
    "$VENV/bin/python" -m pip freeze 2>/dev/null | grep -iE '^(aiperf|transformers|tokenizers)==' || true
    echo "installed $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - start ))s"
} > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"

log "aiperf venv installed at $VENV in $(( $(date +%s) - start ))s ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
echo "$VENV/bin/aiperf"
