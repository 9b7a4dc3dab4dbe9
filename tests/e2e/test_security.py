"""Access control: API keys, refused admin writes without one, engine URL checks, warnings."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from fastapi.testclient import TestClient
from service_support import PROMPT, Engines, make_client

KEY = "s3cret-key"
METRICS_KEY = "scrape-only"
TOPOLOGY = [
    {"instance_id": "p0", "tier": "p", "datacenter": "A", "adapter": "sim"},
    {"instance_id": "rld0", "tier": "rld", "datacenter": "A", "adapter": "sim"},
    {"instance_id": "md0", "tier": "md", "datacenter": "B", "adapter": "sim"},
]
OPEN = {"/healthz", "/readyz"}


def instances_file(tmp_path: Path, instances: list[dict[str, Any]] | None = None) -> str:
    """Instances as configuration (a file), which needs no key."""
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(TOPOLOGY if instances is None else instances))
    return str(path)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def assert_error(response: Any, status: int, type_: str) -> dict[str, Any]:
    """An error in the OpenAI shape with this status and type; returns its body."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == type_
    assert error["code"] == status
    return error


def md_hit(client: TestClient, headers: dict[str, str] | None = None) -> float:
    decision = client.post("/v1/route", json={"token_ids": PROMPT}, headers=headers or {})
    assert decision.status_code == 200, decision.text
    return float(decision.json()["predicted_hit"]["md"])


def warm_md(client: TestClient, headers: dict[str, str] | None = None) -> float:
    """Serve the prompt once and wait until md0's KV events make it a predicted MD hit."""
    body = {"prompt": PROMPT, "max_tokens": 2}
    assert client.post("/v1/completions", json=body, headers=headers or {}).status_code == 200
    deadline = time.time() + 5
    while (hit := md_hit(client, headers)) == 0.0 and time.time() < deadline:
        time.sleep(0.02)
    return hit


def every_route(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every endpoint the app serves (those of its OpenAPI schema and the
    documentation itself), path parameters filled in."""
    app: Any = client.app
    routes = [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")]
    for path, operations in app.openapi()["paths"].items():
        path = path.replace("{instance_id}", "p0").replace("{experiment_id}", "x")
        routes += [(method.upper(), path) for method in sorted(operations)]
    return routes


def test_without_a_key_state_changes_are_refused_and_change_nothing(tmp_path: Path) -> None:
    """The default deployment: reads and routing work, every admin write gets 403 naming
    how to enable it, and the index, the pool and the experiments stay as they were."""
    with make_client(
        Engines(), allow_unauthenticated_admin=False, instances_file=instances_file(tmp_path)
    ) as c:
        hit = warm_md(c)
        assert hit > 0.5  # md0 holds the prompt: the value a forged event would change

        cleared = {"instance_id": "md0", "events": [{"type": "AllBlocksCleared"}]}
        error = assert_error(c.post("/v1/kv-events", json=cleared), 403, "permission_error")
        assert "PDD_ROUTER_SERVICE__API_KEY" in error["message"]
        assert "PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN=true" in error["message"]
        assert md_hit(c) == hit

        intruder = {"instance_id": "evil", "tier": "md", "datacenter": "B", "adapter": "vllm",
                    "url": "http://203.0.113.9:8000"}  # fmt: skip
        assert_error(c.post("/v1/instances", json=intruder), 403, "permission_error")
        assert_error(c.delete("/v1/instances/md0"), 403, "permission_error")
        listed = c.get("/v1/instances")
        assert listed.status_code == 200
        assert [i["instance_id"] for i in listed.json()] == ["md0", "p0", "rld0"]

        arms = [{"name": "a", "policy": "pdd"}, {"name": "b", "policy": "pdd-adaptive"}]
        created = c.post("/v1/experiments", json={"name": "x", "arms": arms})
        assert_error(created, 403, "permission_error")
        assert_error(c.post("/v1/experiments/x/stop"), 403, "permission_error")
        assert c.get("/v1/experiments").json() == []

        assert c.get("/metrics").status_code == 200
        assert c.get("/openapi.json").status_code == 200


def test_the_explicit_setting_opens_admin_writes_without_a_key(tmp_path: Path) -> None:
    with make_client(
        Engines(), allow_unauthenticated_admin=True, instances_file=instances_file(tmp_path)
    ) as c:
        hit = warm_md(c)
        assert hit > 0.5
        cleared = {"instance_id": "md0", "events": [{"type": "AllBlocksCleared"}]}
        assert c.post("/v1/kv-events", json=cleared).status_code == 202
        assert md_hit(c) == 0.0


def test_with_a_key_every_endpoint_but_the_health_checks_needs_it(tmp_path: Path) -> None:
    with make_client(
        Engines(), api_key=KEY, allow_unauthenticated_admin=False,
        instances_file=instances_file(tmp_path),
    ) as c:  # fmt: skip
        routes = every_route(c)
        paths = {path for _, path in routes}
        # the endpoints that used to be open with a key set are among those checked
        assert {"/v1/route", "/v1/completions", "/metrics", "/docs", "/redoc",
                "/openapi.json", "/v1/kv-events", "/v1/instances"} <= paths  # fmt: skip
        for method, path in routes:
            if path in OPEN:
                continue
            for headers in ({}, bearer("wrong"), bearer(KEY + "x"), {"authorization": KEY}):
                response = c.request(method, path, json={}, headers=headers)
                assert_error(response, 401, "authentication_error")
                assert response.headers["www-authenticate"] == "Bearer", (method, path)

        for path in sorted(OPEN):
            assert c.get(path).status_code == 200, path

        hit = warm_md(c, bearer(KEY))
        assert hit > 0.5
        assert "pdd_router_decisions_total" in c.get("/metrics", headers=bearer(KEY)).text
        assert "/v1/completions" in c.get("/openapi.json", headers=bearer(KEY)).json()["paths"]
        assert "swagger-ui" in c.get("/docs", headers=bearer(KEY)).text
        assert c.get("/redoc", headers=bearer(KEY)).status_code == 200

        # the key opens admin writes (no 403 without the explicit setting)
        cleared = {"instance_id": "md0", "events": [{"type": "AllBlocksCleared"}]}
        forged = c.post("/v1/kv-events", json=cleared, headers=bearer("wrong"))
        assert forged.status_code == 401
        assert md_hit(c, bearer(KEY)) == hit
        applied = c.post("/v1/kv-events", json=cleared, headers=bearer(KEY))
        assert applied.status_code == 202, applied.text
        assert md_hit(c, bearer(KEY)) == 0.0


def test_the_metrics_key_opens_metrics_only(tmp_path: Path) -> None:
    with make_client(
        Engines(), api_key=KEY, metrics_key=METRICS_KEY, instances_file=instances_file(tmp_path)
    ) as c:
        scrape = bearer(METRICS_KEY)
        metrics = c.get("/metrics", headers=scrape)
        assert metrics.status_code == 200
        assert "pdd_router_decision_seconds" in metrics.text
        assert c.get("/metrics", headers=bearer(KEY)).status_code == 200
        assert_error(c.get("/metrics"), 401, "authentication_error")
        for method, path in every_route(c):
            if path in OPEN or path == "/metrics":
                continue
            response = c.request(method, path, json={}, headers=scrape)
            assert_error(response, 403, "permission_error")  # a known key, of another role


def test_a_metrics_key_alone_guards_metrics_and_leaves_the_rest_as_without_a_key() -> None:
    with make_client(Engines(), metrics_key=METRICS_KEY, allow_unauthenticated_admin=False) as c:
        assert_error(c.get("/metrics"), 401, "authentication_error")
        assert c.get("/metrics", headers=bearer(METRICS_KEY)).status_code == 200
        assert c.get("/v1/instances").status_code == 200
        body = {"instance_id": "p0", "tier": "p", "adapter": "sim"}
        refused = c.post("/v1/instances", json=body, headers=bearer(METRICS_KEY))
        assert_error(refused, 403, "permission_error")


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://10.0.0.1/engine", "gopher://10.0.0.1:70/", "http://",
     "10.0.0.1:8000", "http://10.0.0.1:99999"],
)  # fmt: skip
def test_instance_urls_other_than_http_are_refused_naming_the_field(url: str) -> None:
    with make_client(Engines()) as c:
        body = {"instance_id": "md9", "tier": "md", "adapter": "vllm", "url": url}
        error = assert_error(c.post("/v1/instances", json=body), 422, "invalid_request_error")
        assert error["param"] == "url"
        assert error["message"].startswith("url: ")
        assert c.get("/v1/instances").json() == []


def test_http_and_https_instance_urls_are_accepted() -> None:
    with make_client(Engines()) as c:
        for iid, url in (("md1", "http://10.0.0.1:8100"), ("md2", "https://engine.internal")):
            body = {"instance_id": iid, "tier": "md", "adapter": "vllm", "url": url}
            created = c.post("/v1/instances", json=body)
            assert created.status_code == 201, created.text
            assert created.json()["url"] == url


def test_an_instance_file_with_a_file_url_does_not_start(tmp_path: Path) -> None:
    bad = [{**TOPOLOGY[0], "adapter": "vllm", "url": "file:///etc/passwd"}]
    client = make_client(Engines(), instances_file=instances_file(tmp_path, bad))
    with pytest.raises(Exception, match="url"), client:
        pass


def test_instances_outside_the_allowed_networks_are_refused() -> None:
    networks = ["10.0.0.0/8", "fd00::/8"]
    with make_client(Engines(), instance_networks=networks) as c:

        def register(iid: str, url: str, **extra: str) -> Any:
            body = {"instance_id": iid, "tier": "md", "adapter": "vllm", "url": url, **extra}
            return c.post("/v1/instances", json=body)

        assert register("md1", "http://10.2.3.4:8100").status_code == 201
        assert register("md2", "http://[fd00::5]:8100").status_code == 201

        outside = assert_error(register("md3", "http://192.168.1.5:8100"), 400,
                               "invalid_request_error")  # fmt: skip
        assert outside["param"] == "url"
        assert "192.168.1.5" in outside["message"]
        assert "10.0.0.0/8" in outside["message"]

        # a name is resolved, and judged by the addresses it resolves to
        named = assert_error(register("md4", "http://localhost:8100"), 400,
                             "invalid_request_error")  # fmt: skip
        assert "'localhost' resolves to" in named["message"]

        events = assert_error(
            register("md5", "http://10.2.3.5:8100", kv_events_endpoint="tcp://8.8.8.8:5557"),
            400, "invalid_request_error",
        )  # fmt: skip
        assert events["param"] == "kv_events_endpoint"

        listed = [i["instance_id"] for i in c.get("/v1/instances").json()]
        assert listed == ["md1", "md2"]


def test_the_allowlist_does_not_apply_to_the_instances_file(tmp_path: Path) -> None:
    """The file is the operator's own configuration, like the allowlist itself."""
    configured = [{**TOPOLOGY[2], "adapter": "vllm", "url": "http://192.168.1.5:8100"}]
    with make_client(
        Engines(), instance_networks=["10.0.0.0/8"],
        instances_file=instances_file(tmp_path, configured),
    ) as c:  # fmt: skip
        assert [i["instance_id"] for i in c.get("/v1/instances").json()] == ["md0"]


def serve(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[dict[str, Any], str]:
    """``pdd-router serve ARGS`` up to the point it would listen: uvicorn's arguments and
    what was printed on stderr."""
    import uvicorn

    from cli import serve_cmd

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(serve_cmd, "_check_free", lambda host, port: None)  # listens on nothing
    code, _, err = run_cli(capsys, "serve", *args)
    assert code == 0, err
    return seen, err


def test_serve_listens_on_loopback_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("HOST", "API_KEY", "ADMIN_KEY", "ALLOW_UNAUTHENTICATED_ADMIN"):
        monkeypatch.delenv(f"PDD_ROUTER_SERVICE__{name}", raising=False)
    seen, err = serve(monkeypatch, capsys)
    assert seen["host"] == "127.0.0.1"
    assert "warning" not in err


def test_serve_warns_in_one_line_when_exposed_without_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("API_KEY", "ADMIN_KEY", "ALLOW_UNAUTHENTICATED_ADMIN"):
        monkeypatch.delenv(f"PDD_ROUTER_SERVICE__{name}", raising=False)
    seen, err = serve(monkeypatch, capsys, "--host", "0.0.0.0", "--port", "8123")
    assert seen["host"] == "0.0.0.0"
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1
    assert "0.0.0.0:8123 without an API key" in lines[0]
    assert "PDD_ROUTER_SERVICE__API_KEY" in lines[0]
    assert "instance registration" not in lines[0]  # admin writes stay refused

    monkeypatch.setenv("PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN", "true")
    _, err = serve(monkeypatch, capsys, "--host", "0.0.0.0")
    assert "including instance registration and KV events" in err

    monkeypatch.setenv("PDD_ROUTER_SERVICE__API_KEY", KEY)
    _, err = serve(monkeypatch, capsys, "--host", "0.0.0.0")
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1  # the one key is the admin key too
    assert "PDD_ROUTER_SERVICE__ADMIN_KEY" in lines[0]

    monkeypatch.setenv("PDD_ROUTER_SERVICE__ADMIN_KEY", "another")
    _, err = serve(monkeypatch, capsys, "--host", "0.0.0.0")
    assert "warning" not in err
