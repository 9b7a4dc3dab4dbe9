#!/usr/bin/env bash
# make compose-test: run docker-compose.yml for real and check it, with no image registry.
#
#  1. install Debian's docker.io, docker-compose and debootstrap if they are missing
#  2. start dockerd if no Docker engine answers (stopped again at the end; one that was
#     already running is left as it was)
#  3. make the base image with debootstrap once (scripts/compose-base-image.sh)
#  4. build the image (Dockerfile; Debian's python3 and redis-server, the project from PyPI)
#  5. start the stack: Redis, two router replicas on its index, simulated P, RLD and MD
#  6. run tests/e2e/test_compose_stack.py against both replicas
#  7. remove the stack, whatever happened (logs kept in $PDD_COMPOSE_LOG_DIR)
#
# Every wait is bounded. Environment (all optional):
#   PDD_COMPOSE_LOG_DIR   where the logs go (default /tmp/pdd-compose-test)
#   PDD_COMPOSE_PROJECT   compose project name (default pdd-compose-test)
#   PDD_ROUTER_IMAGE, PDD_BASE_IMAGE   image names (pdd-router:local, pdd-base:bookworm)
#   PDD_PIP_CA_BUNDLE     CA bundle pip trusts during the build (default: the host's,
#                         /etc/ssl/certs/ca-certificates.crt, so a TLS-intercepting proxy
#                         the host trusts works in the build too)
#   PDD_DOCKERD_ARGS      arguments of a dockerd started here (default
#                         "--iptables=false --ip-forward=false --bridge=none": the host's
#                         firewall and forwarding are left alone; the stack has its own network)
#   PYTEST                the pytest to run (default .venv/bin/pytest)
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$(date +%s)
logs="${PDD_COMPOSE_LOG_DIR:-/tmp/pdd-compose-test}"
project="${PDD_COMPOSE_PROJECT:-pdd-compose-test}"
export PDD_ROUTER_IMAGE="${PDD_ROUTER_IMAGE:-pdd-router:local}"
export PDD_BASE_IMAGE="${PDD_BASE_IMAGE:-pdd-base:bookworm}"
ca_bundle="${PDD_PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
dockerd_args="${PDD_DOCKERD_ARGS:---iptables=false --ip-forward=false --bridge=none}"
pytest_bin="${PYTEST:-.venv/bin/pytest}"
mkdir -p "$logs"

say() { echo "compose-test [$(( $(date +%s) - t0 ))s] $*"; }
fail() { echo "compose-test: $*" >&2; exit 1; }
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"

# 1. packages ---------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
    missing+=(docker-compose)
fi
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian's ${missing[*]}"
    timeout 600 $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 900 $sudo_cmd apt-get install -y -qq "${missing[@]}" \
        >"$logs/apt.log" 2>&1 || { tail -n 20 "$logs/apt.log" >&2; fail "apt-get install failed"; }
fi

# A docker CLI that builds with BuildKit: one with buildx, or a 20.10-22.x client (BuildKit
# built in, DOCKER_BUILDKIT=1). A newer client without buildx (a static one) cannot.
docker_bin=""
for candidate in ${DOCKER:-} docker /usr/bin/docker; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" buildx version >/dev/null 2>&1; then docker_bin="$candidate"; break; fi
    major="$("$candidate" --version | sed -E 's/^Docker version ([0-9]+).*/\1/')"
    if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 23 ]; then docker_bin="$candidate"; break; fi
done
[ -n "$docker_bin" ] || fail "no docker client that builds with BuildKit (install docker-buildx or docker.io)"
docker=("$docker_bin")
if docker compose version >/dev/null 2>&1; then
    compose_bin=(docker compose)
else
    compose_bin=(docker-compose)
fi

# 2. the Docker engine ------------------------------------------------------------------
dockerd_pid=""
stack_up=""
cleanup() {
    local rc=$?
    set +e
    if [ -n "$stack_up" ]; then
        timeout 60 "${compose[@]}" logs --no-color >"$logs/compose.log" 2>&1
        if [ "$rc" -ne 0 ]; then
            timeout 30 "${compose[@]}" ps >&2
            echo "--- last lines of the stack's logs ($logs/compose.log):" >&2
            tail -n 60 "$logs/compose.log" >&2
        fi
        say "removing the stack"
        timeout 180 "${compose[@]}" down --volumes --remove-orphans --timeout 10 \
            >>"$logs/compose-down.log" 2>&1 || echo "compose-test: compose down failed" >&2
    fi
    if [ -n "$dockerd_pid" ]; then
        say "stopping the dockerd started here (pid $dockerd_pid)"
        $sudo_cmd kill -TERM "$dockerd_pid" 2>/dev/null
        for _ in $(seq 1 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$dockerd_pid" 2>/dev/null; then
            echo "compose-test: dockerd did not stop in 30 s, killing it" >&2
            $sudo_cmd kill -KILL "$dockerd_pid" 2>/dev/null
        fi
    fi
    if [ "$rc" -eq 0 ]; then
        say "passed (logs in $logs)"
    else
        say "FAILED (exit $rc, logs in $logs)" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! timeout 20 "${docker[@]}" info >/dev/null 2>&1; then
    if [ -n "$sudo_cmd" ] && timeout 20 sudo "${docker[@]}" info >/dev/null 2>&1; then
        docker=(sudo "$docker_bin")
    else
        say "no Docker engine answers: starting dockerd $dockerd_args (log $logs/dockerd.log)"
        # shellcheck disable=SC2086  # the arguments are words
        $sudo_cmd dockerd $dockerd_args >"$logs/dockerd.log" 2>&1 &
        dockerd_pid=$!
        for _ in $(seq 1 120); do
            timeout 5 $sudo_cmd "$docker_bin" info >/dev/null 2>&1 && break
            kill -0 "$dockerd_pid" 2>/dev/null || break
            sleep 0.5
        done
        if ! timeout 10 $sudo_cmd "$docker_bin" info >/dev/null 2>&1; then
            tail -n 30 "$logs/dockerd.log" >&2
            kill -0 "$dockerd_pid" 2>/dev/null || dockerd_pid=""
            fail "dockerd did not come up in 60 s (log: $logs/dockerd.log)"
        fi
        [ -n "$sudo_cmd" ] && docker=(sudo "$docker_bin")
    fi
fi
[ "${docker[0]}" = sudo ] && compose_bin=(sudo "${compose_bin[@]}")
say "Docker engine $("${docker[@]}" version --format '{{.Server.Version}}'), storage driver $("${docker[@]}" info --format '{{.Driver}}')"

# 3. the base image ---------------------------------------------------------------------
DOCKER="${docker[*]}" timeout 1500 scripts/compose-base-image.sh

# 4. the image --------------------------------------------------------------------------
secret=()
[ -s "$ca_bundle" ] && secret=(--secret "id=pip_ca,src=$ca_bundle")
say "building $PDD_ROUTER_IMAGE FROM $PDD_BASE_IMAGE (log $logs/build.log)"
build_t0=$(date +%s)
if ! DOCKER_BUILDKIT=1 timeout 1800 "${docker[@]}" build --progress plain --network host \
        --build-arg "BASE_IMAGE=$PDD_BASE_IMAGE" "${secret[@]}" -t "$PDD_ROUTER_IMAGE" . \
        >"$logs/build.log" 2>&1; then
    tail -n 40 "$logs/build.log" >&2
    fail "docker build failed (log: $logs/build.log)"
fi
say "built in $(( $(date +%s) - build_t0 ))s"

# 5. the stack --------------------------------------------------------------------------
read -r port1 port2 redis_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
')
key="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
metrics_key="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
admin_key="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
export PDD_ROUTER_PORT_1="$port1" PDD_ROUTER_PORT_2="$port2" PDD_COMPOSE_REDIS_PORT="$redis_port"
export PDD_ROUTER_API_KEY="$key" PDD_ROUTER_METRICS_KEY="$metrics_key" PDD_ROUTER_ADMIN_KEY="$admin_key"
compose=("${compose_bin[@]}" -p "$project" -f docker-compose.yml -f deploy/compose.test.yml)

# a stack a killed run left behind
timeout 180 "${compose[@]}" down --volumes --remove-orphans --timeout 10 >"$logs/compose-down.log" 2>&1 || true
say "starting the stack (${compose_bin[*]}): routers on :$port1 and :$port2"
stack_up=1
if ! timeout 300 "${compose[@]}" up --detach --no-build >"$logs/compose-up.log" 2>&1; then
    tail -n 30 "$logs/compose-up.log" >&2
    fail "compose up failed (log: $logs/compose-up.log)"
fi
for service in router-1 router-2; do
    id="$(timeout 30 "${compose[@]}" ps -q "$service")"
    [ -n "$id" ] || fail "no container for $service"
    status=""
    for _ in $(seq 1 120); do
        status="$(timeout 10 "${docker[@]}" inspect -f '{{.State.Health.Status}}' "$id" || true)"
        [ "$status" = healthy ] && break
        [ "$status" = unhealthy ] && break
        sleep 0.5
    done
    [ "$status" = healthy ] || fail "$service is not healthy after 60 s (status: ${status:-none})"
done
say "both routers ready"

# 6. the checks -------------------------------------------------------------------------
export PDD_ROUTER_COMPOSE_URLS="http://127.0.0.1:$port1,http://127.0.0.1:$port2"
export PDD_ROUTER_COMPOSE_API_KEY="$key" PDD_ROUTER_COMPOSE_METRICS_KEY="$metrics_key"
export PDD_ROUTER_COMPOSE_ADMIN_KEY="$admin_key"
export PDD_ROUTER_COMPOSE_REDIS_URL="redis://127.0.0.1:$redis_port/0"
COLUMNS=100 timeout 300 "$pytest_bin" tests/e2e/test_compose_stack.py -p no:cacheprovider -v
