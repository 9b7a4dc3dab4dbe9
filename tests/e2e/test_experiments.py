"""Online experiments: a two-arm split against simulated engines, sticky and reported."""

from __future__ import annotations

from collections import defaultdict

from fastapi.testclient import TestClient
from service_support import VOCAB, Engines, make_client, register

TOPOLOGY = (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
ARMS = [
    {"name": "paper", "policy": "pdd", "weight": 1.0},
    # every request through RLD: a different pipeline mix, easy to tell apart
    {"name": "relay", "policy": "pdd", "params": {"wan_budget_s": 1e-9}, "weight": 1.0},
]


def prompt(session: int, turn: int) -> list[int]:
    base = [(session * 37 + i * 11) % VOCAB for i in range(256)]
    return base + [(turn * 13 + i) % VOCAB for i in range(16 * turn)]


def run_sessions(client: TestClient, sessions: int, turns: int) -> dict[str, set[str]]:
    """Send turns of each session; return the arms each session's requests were decided by."""
    seen: dict[str, set[str]] = defaultdict(set)
    for turn in range(turns):
        for s in range(sessions):
            body = {"prompt": prompt(s, turn), "max_tokens": 8, "session_id": f"s{s}"}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            pipeline = response.json()["pdd"]["decided_pipeline"]
            seen[f"s{s}"].add("relay" if pipeline == "P-RLD-MD" else "paper")
    return seen


def test_two_arm_experiment_splits_sticks_and_reports() -> None:
    with make_client(Engines(), api_key="k") as c:
        auth = {"authorization": "Bearer k"}
        register(c, *TOPOLOGY, key="k")
        assert c.post("/v1/experiments", json={"name": "x", "arms": ARMS}).status_code == 401
        c.headers.update(auth)  # with a key, completions and metrics need it too
        created = c.post("/v1/experiments", json={"name": "relay-vs-paper", "arms": ARMS},
                         headers=auth)  # fmt: skip
        assert created.status_code == 201
        exp_id = created.json()["id"]

        seen = run_sessions(c, sessions=40, turns=3)
        # sticky: every session's three requests were decided by one arm
        assert all(len(arms) == 1 for arms in seen.values())
        relay_sessions = sum(arms == {"relay"} for arms in seen.values())
        assert 10 <= relay_sessions <= 30  # 40 fair coin flips: outside this is < 0.3%

        report = c.get(f"/v1/experiments/{exp_id}", headers=auth).json()
        arms = {a["name"]: a for a in report["arms"]}
        assert arms["relay"]["requests"] == 3 * relay_sessions
        assert arms["paper"]["requests"] == 3 * (40 - relay_sessions)
        assert set(arms["relay"]["pipelines"]) <= {"P-RLD-MD", "P-RLD"}
        assert set(arms["paper"]["pipelines"]) == {"P-MD"}
        ttft = arms["relay"]["metrics"]["ttft_p50_s"]
        assert ttft["value"] > 0
        low, high = ttft["ci95"]
        assert low <= ttft["diff_vs_first"] <= high
        assert arms["paper"]["metrics"]["sla_attainment"]["value"] == 1.0

        metrics = c.get("/metrics").text
        assert 'arm="relay"' in metrics
        assert 'arm="paper"' in metrics

        listed = c.get("/v1/experiments", headers=auth).json()
        assert [e["id"] for e in listed] == [exp_id]
        stopped = c.post(f"/v1/experiments/{exp_id}/stop", headers=auth).json()
        assert stopped["status"] == "stopped"
        # after the stop, decisions use the default policy again: no relay for short prompts
        after = run_sessions(c, sessions=5, turns=1)
        assert all(arms == {"paper"} for arms in after.values())


def test_bad_experiments_are_refused() -> None:
    with make_client(Engines()) as c:
        one_arm = {"name": "x", "arms": ARMS[:1]}
        assert c.post("/v1/experiments", json=one_arm).status_code == 422
        unknown = {"name": "x", "arms": [ARMS[0], {"name": "b", "policy": "nope"}]}
        r = c.post("/v1/experiments", json=unknown)
        assert r.status_code == 422
        assert "valid policies" in r.json()["error"]["message"]
        assert c.get("/v1/experiments/none").status_code == 404
