# Shared step of the scripts that make sure a Debian package's command is installed
# (ensure-chromium.sh, ensure-prometheus.sh): sourced, not run.

# apt_ensure COMMAND [APT-GET INSTALL OPTIONS...] PACKAGE: print the command's path, first
# installing PACKAGE with apt-get (sudo when not root) when COMMAND is not on PATH.
apt_ensure() {
    local cmd="$1"
    shift
    if command -v "$cmd" >/dev/null 2>&1; then
        echo "$cmd: $(command -v "$cmd")"
        return 0
    fi
    local sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    echo "$cmd: not found, installing Debian's package" >&2
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$@" >/dev/null
    echo "$cmd: $(command -v "$cmd")"
}
