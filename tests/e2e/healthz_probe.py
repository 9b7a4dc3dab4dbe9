"""A well-behaved client in a process of its own: ``python healthz_probe.py URL [HEADER=VALUE...]``
asks ``URL/healthz`` every 20 ms on one kept connection, prints ``ready`` after its first
answer, and when its standard input closes prints the seconds each answer took, as JSON.

It runs apart from the test process so that what it times is the router and the machine,
not the test's own threads (a hostile client's, a memory sampler's) holding its GIL.
"""

from __future__ import annotations

import http.client
import json
import select
import sys
import time
import urllib.parse

INTERVAL_S = 0.02


def main(argv: list[str]) -> None:
    url = urllib.parse.urlsplit(argv[0])
    headers = dict(arg.split("=", 1) for arg in argv[1:])
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    times: list[float] = []
    while True:
        started = time.perf_counter()
        conn.request("GET", "/healthz", headers=headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"/healthz answered {answer.status}")
        times.append(time.perf_counter() - started)
        if len(times) == 1:
            print("ready", flush=True)
        # stdin readable: closed (or a line) -> done
        if select.select([sys.stdin], [], [], INTERVAL_S)[0]:
            break
    print(json.dumps(times[1:]), flush=True)  # the first answer opened the connection


if __name__ == "__main__":
    main(sys.argv[1:])
