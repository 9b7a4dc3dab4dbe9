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
NAME=aiperf
LABEL="aiperf venv"
VENV="${PDD_ROUTER_AIPERF_VENV:-$HOME/.cache/pdd-router/aiperf-venv}"
WANT_STAMP="aiperf==${AIPERF_VERSION}"
RESULT="$VENV/bin/aiperf"
# shellcheck source=scripts/venv-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"

stamp_ok() {
    stamp_current || return 1
    "$VENV/bin/python" - "$AIPERF_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("aiperf") == sys.argv[1], version("aiperf")
PY
}

venv_exit_if_ready
start=$(date +%s)
venv_create "${PDD_ROUTER_AIPERF_PYTHON:-}"

log "pip install aiperf==${AIPERF_VERSION} (first time: a minute or two)"
"$VENV/bin/python" -m pip install --no-input --quiet "aiperf==${AIPERF_VERSION}" >&2

log "checking that aiperf runs"
"$VENV/bin/aiperf" --version >&2

venv_finish 'aiperf|transformers|tokenizers' "$start"
