#!/usr/bin/env bash
# Make sure a redis-server answers at PDD_ROUTER_TEST_REDIS_URL's host and port
# (default 127.0.0.1:6379): install Debian's redis-server if it is missing and start it.
set -euo pipefail

url="${PDD_ROUTER_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}"
hostport="${url#redis://}"; hostport="${hostport%%/*}"; hostport="${hostport##*@}"
host="${hostport%%:*}"; port="${hostport##*:}"
[ "$port" = "$host" ] && port=6379

ping() {
    # Speak RESP over bash's /dev/tcp so no client is needed.
    exec 3<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
    printf 'PING\r\n' >&3
    local reply
    IFS= read -r -t 2 reply <&3 || { exec 3>&-; return 1; }
    exec 3>&-
    [[ "$reply" == +PONG* ]]
}

if ping; then
    echo "redis: answering at $host:$port"
    exit 0
fi

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis: redis-server not found, installing Debian's package"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq redis-server >/dev/null
fi

echo "redis: starting redis-server on $host:$port"
redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
    --dir /tmp --logfile "/tmp/pdd-router-redis-$port.log"

for _ in $(seq 1 50); do
    if ping; then echo "redis: answering at $host:$port"; exit 0; fi
    sleep 0.1
done
echo "redis: redis-server did not answer at $host:$port (log: /tmp/pdd-router-redis-$port.log)" >&2
exit 1
