"""`replay live` against `serve --demo`: token IDs within the vocabulary the demo's model
card gives, and, when told a wrong one, the router's reasons counted and a failing exit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from demo_support import Demo, demo_server
from tokenizers import Tokenizer

from router.service.demo import DEMO_MODEL
from router.tokenization.builtin import CHAT_TEMPLATE, VOCAB_SIZE

pytestmark = pytest.mark.slow

REQUESTS = 12


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    with demo_server(tmp_path_factory.mktemp("demo")) as demo:
        yield demo


def write_trace(path: Path) -> None:
    """Three sessions of four turns, each turn extending the previous one's blocks."""
    rows: list[dict[str, object]] = []
    for turn in range(4):
        for session in range(3):
            blocks = [session * 100 + k for k in range(turn + 1)]
            rows.append({"timestamp": 40 * len(rows), "input_length": 512 * len(blocks) - 30,
                         "output_length": 6, "hash_ids": blocks})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_the_printed_tokenizer_folder_is_the_demo_models(demo: Demo) -> None:
    assert demo.tokenizer.is_absolute()
    tokenizer = Tokenizer.from_file(str(demo.tokenizer / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    config = json.loads((demo.tokenizer / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert config["eos_token"] == "<|im_end|>"
    printed = demo.log.read_text()
    assert f"--model {DEMO_MODEL} --tokenizer {demo.tokenizer}" in printed


def test_live_replay_draws_token_ids_the_demo_takes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, demo: Demo
) -> None:
    write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "live"
    code, _, err = run_cli(
        capsys, "replay", "live", str(tmp_path / "trace.jsonl"), "--url", demo.url,
        "--model", DEMO_MODEL, "--rate-scale", "2", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    got = records(out)
    assert len(got) == REQUESTS
    assert all(r["reason"] == "" and r["e2e_s"] is not None for r in got)
    assert [r["tokens_md"] + r["tokens_rld"] for r in got] == [6] * REQUESTS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == REQUESTS
    assert not any("vocabulary" in w or "failed" in w for w in summary["warnings"])


def test_token_ids_outside_the_vocabulary_show_the_routers_reason_and_fail_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, demo: Demo
) -> None:
    write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "wrong-vocab"
    code, printed, err = run_cli(
        capsys, "replay", "live", str(tmp_path / "trace.jsonl"), "--url", demo.url,
        "--vocab-size", "32000", "--rate-scale", "4", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 1
    assert f"{REQUESTS} of {REQUESTS} requests failed" in err
    got = records(out)
    assert all(r["reason"].startswith("HTTP 400: prompt holds token id ") for r in got)
    assert all(f"outside [0, {VOCAB_SIZE})" in r["reason"] for r in got)
    summary = json.loads((out / "summary.json").read_text())
    failed = [w for w in summary["warnings"] if "failed" in w]
    assert len(failed) == 1  # one reason, whatever the token id each request named
    assert failed[0].startswith(f"{REQUESTS} requests failed: HTTP 400: prompt holds token id")
    assert f"{REQUESTS} requests failed: HTTP 400" in " ".join(printed.split())
    assert (out / "summary.json").is_file()  # what was measured is written all the same
