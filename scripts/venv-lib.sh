# Shared steps of the scripts that keep a tool's virtual environment OUTSIDE the repo
# (ensure-aiperf.sh, ensure-vllm.sh): sourced, not run.
#
# The sourcing script sets, before calling these functions:
#   NAME        the tool's name in log lines ("ensure-NAME: ...")
#   LABEL       how log lines name the venv ("aiperf venv", "vLLM venv")
#   VENV        where the venv lives
#   WANT_STAMP  the stamp's first line for the wanted versions
#   RESULT      the path printed as the last line on stdout (the venv's executable)
# and defines `stamp_ok` (true when the venv at $VENV is complete and current), which
# may start with `stamp_current` (below). The stamp, written once an install is
# complete, is $STAMP.

STAMP="$VENV/.pdd-router-$NAME-stamp"

log() { echo "ensure-$NAME: $*" >&2; }

# True when $RESULT is executable and the stamp names the wanted versions.
stamp_current() {
    [ -x "$RESULT" ] && [ -f "$STAMP" ] || return 1
    [ "$(head -1 "$STAMP")" = "$WANT_STAMP" ]
}

venv_report_ready() {
    log "$LABEL ready at $VENV ($(head -1 "$STAMP"))"
    echo "$RESULT"
    exit 0
}

# Exit printing $RESULT when the venv is ready; otherwise hold the install lock (when
# flock exists) and return. Concurrent runs on one machine (two CI jobs, or tests in
# parallel) are serialized; one that waited finds the other's install and exits.
venv_exit_if_ready() {
    if stamp_ok; then venv_report_ready; fi
    mkdir -p "$(dirname "$VENV")"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$VENV.lock"
        if ! flock -n 9; then
            log "another install holds $VENV.lock; waiting"
            flock 9
        fi
        if stamp_ok; then venv_report_ready; fi
    fi
}

# Build an empty venv at $VENV with the interpreter $1 (default python3.11, else
# python3), after removing a missing, half-installed or outdated one.
venv_create() {
    local base_py="${1:-}"
    if [ -z "$base_py" ]; then
        if command -v python3.11 >/dev/null 2>&1; then base_py=python3.11; else base_py=python3; fi
    fi
    log "base interpreter: $("$base_py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

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
    "$base_py" -m venv "$VENV"
}

# Write the stamp (with the installed versions of the distributions matching the
# extended regex $1) and print $RESULT; $2 is the install's start (date +%s).
venv_finish() {
    local packages="$1" start="$2"
    {
        echo "$WANT_STAMP"
        "$VENV/bin/python" -m pip freeze 2>/dev/null | grep -iE "^($packages)==" || true
        echo "installed $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - start ))s"
    } > "$STAMP.tmp"
    mv "$STAMP.tmp" "$STAMP"

    log "$LABEL installed at $VENV in $(( $(date +%s) - start ))s ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
    echo "$RESULT"
}
