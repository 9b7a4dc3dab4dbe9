"""`pdd-router predictor train|eval|odd-traffic` on a modest replay, as a user runs them.

The replay is approximate mode (no KV events, an index not told the cache sizes) on
caches small enough that evictions matter: there the model must beat the raw match's
MAE by at least 30%, the claim docs/predictor.md makes at trace scale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic

from cli.app import main
from router.errors import UserError

SMALL_CACHES = (
    "--set", "pools.md.kv_capacity_tokens=400000",
    "--set", "pools.p.kv_capacity_tokens=250000",
)  # fmt: skip


@pytest.fixture(scope="module")
def replay_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("predictor")
    trace, log = folder / "agentic.jsonl", folder / "decisions.jsonl"
    synth_agentic(trace, seed=5, requests=1500)
    run = ["replay", "run", str(trace), "--preset", "pdd-small", "--policy", "pdd", *SMALL_CACHES]
    run += ["--index-mode", "approximate", "--index-capacity", "unbounded", "--no-progress"]
    assert main([*run, "--decision-log", str(log), "--out", str(folder / "run")]) == 0
    return log


@pytest.fixture(scope="module")
def model(replay_log: Path) -> Path:
    path = replay_log.parent / "model.skops"
    train = ["predictor", "train", str(replay_log), "--out", str(path), "--no-progress"]
    assert main([*train, "--param", "n_estimators=60"]) == 0
    return path


def test_the_model_beats_the_raw_match_by_30_percent_in_approximate_mode(
    capsys: pytest.CaptureFixture[str], replay_log: Path, model: Path
) -> None:
    scores = replay_log.parent / "eval.json"
    code, out, err = run_cli(
        capsys, "predictor", "eval", str(model), str(replay_log), "--json", str(scores)
    )
    assert code == 0, err
    assert "MAE by realized hit rate" in out
    assert "calibration of the model" in out
    body: dict[str, Any] = json.loads(scores.read_text())
    mae = {name: s["mae"] for name, s in body["scores"].items()}
    assert mae["model"] <= 0.7 * mae["index match"]
    assert mae["approximate-mode match"] == mae["index match"]  # the index is the record
    assert set(body["versions"]) >= {"scikit-learn", "skops"}
    assert body["rows"] > 500
    # a lower error reads as a negative change of the MAE, as in cross-eval
    change = f"{(mae['model'] / mae['index match'] - 1) * 100:+.1f}%"
    assert change.startswith("-")
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    model_row = next("│".join(r) for r in rows if len(r) > 2 and r[1].strip() == "model")
    assert change in model_row
    assert "MAE vs index" in out


def test_a_replay_routes_with_the_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, replay_log: Path, model: Path
) -> None:
    trace = replay_log.parent / "agentic.jsonl"
    log = tmp_path / "with-model.jsonl"
    code, _, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", "pdd-small", *SMALL_CACHES,
        "--index-mode", "approximate", "--index-capacity", "unbounded", "--policy",
        "pdd-adaptive", "--predictor", str(model), "--decision-log", str(log),
        "--out", str(tmp_path / "run"), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    first = json.loads(log.read_text().splitlines()[0])
    assert first["decision"]["policy"] == "pdd-adaptive"
    assert set(first["prediction"]) == {"p", "rld", "md"}


def test_odd_traffic_precision_and_recall(
    capsys: pytest.CaptureFixture[str], replay_log: Path
) -> None:
    code, out, err = run_cli(capsys, "predictor", "odd-traffic", str(replay_log))
    assert code == 0, err
    assert "1500 requests" in out
    assert "precision" in out
    assert "recall" in out


def test_bad_inputs_are_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, replay_log: Path, model: Path
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases = [
        (["predictor", "train", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "m")],
         "no such decision log"),
        (["predictor", "train", str(empty), "--out", str(tmp_path / "m")], "nothing to learn"),
        (["predictor", "eval", str(replay_log), str(replay_log)], "not a skops model file"),
        (["predictor", "eval", str(tmp_path / "m.skops"), str(replay_log)], "no such model"),
        (["predictor", "eval", str(model), str(replay_log), "--split", "1.5"], "--split"),
        (["predictor", "train", str(replay_log), "--out", str(tmp_path / "m"), "--param",
          "nonsense=1"], "bad training parameter"),
    ]  # fmt: skip
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, argv
        assert message in err
        assert len(err.strip().splitlines()) == 1


def test_the_service_decides_with_a_configured_model(model: Path) -> None:
    from fastapi.testclient import TestClient
    from service_support import PROMPT, Engines, register

    from router.service.app import create_app
    from router.settings import Settings

    service = {"vocab_size": 512, "predictor_model": str(model),
               "allow_unauthenticated_admin": True, "show_shared_predictions": True}  # fmt: skip
    settings = Settings(service=service)
    with TestClient(create_app(settings, adapter_factory=Engines())) as client:
        register(client, ("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
        body = {"prompt": PROMPT, "max_tokens": 4, "session_id": "s1"}
        first = client.post("/v1/completions", json=body)
        assert first.status_code == 200
        decision = client.post("/v1/route", json={"token_ids": PROMPT}).json()
        assert 0.0 <= decision["predicted_hit"]["md"] <= 1.0
        assert client.post("/v1/completions", json=body).status_code == 200
    bad = Settings(service={"predictor_model": str(model.parent / "missing.skops")})
    with pytest.raises(UserError, match="no such model file"), TestClient(create_app(bad)):
        pass


def test_experiment_arms_decide_as_the_service_does(model: Path, tmp_path: Path) -> None:
    """An online A/B arm in approximate mode records its routes and uses the trained model,
    as the service's own scheduler does (arms used to be built without either)."""
    from fastapi.testclient import TestClient
    from service_support import PROMPT, Engines, register

    from router.service.app import create_app
    from router.settings import Settings

    log = tmp_path / "decisions.jsonl"
    service = {"vocab_size": 512, "predictor_model": str(model), "approximate_index": True,
               "decision_log": str(log), "allow_unauthenticated_admin": True}  # fmt: skip
    arms = [{"name": "a", "policy": "pdd"}, {"name": "b", "policy": "pdd-adaptive"}]
    with TestClient(create_app(Settings(service=service), adapter_factory=Engines())) as client:
        register(client, ("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
        created = client.post("/v1/experiments", json={"name": "ab", "arms": arms})
        assert created.status_code == 201, created.text
        body = {"prompt": PROMPT, "max_tokens": 4, "session_id": "s1"}
        for _ in range(2):
            assert client.post("/v1/completions", json=body).status_code == 200
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    decisions = [d for d in lines if d["kind"] == "decision"]
    assert len(decisions) == 2
    assert {d["experiment"] for d in decisions} == {created.json()["id"]}
    assert all(d["index_mode"] == "approximate" for d in decisions)
    assert all("prediction" in d for d in decisions)  # the model predicted every candidate
    first, second = decisions
    md = second["decision"]["md_instance"] or second["decision"]["rld_instance"]
    assert first["matches"]["md"] == {} or max(first["matches"]["md"].values()) == 0
    # the arm stored the first request's chain on the instances it chose: a full match now
    chosen_tier = "md" if second["decision"]["md_instance"] else "rld"
    assert second["matches"][chosen_tier][md] == len(PROMPT) // 16
