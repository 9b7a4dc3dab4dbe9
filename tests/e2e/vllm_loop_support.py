"""What the sim-to-real loops on real vLLM engines share: the slice of the conversation
trace scaled to the tiny model, vLLM's own counters, the machine's CPU steal, and the
errors ``replay validate`` wrote."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

REQUESTS = 150  # the trace's first 54 s
TOKEN_SCALE = 32  # a 512-token block of the trace becomes one 16-token block
OUTPUT_SCALE = 2
MAX_LEN = 4096  # the engines' --max-model-len (vllm_launcher)
MAX_SEQS = 32  # the engines' --max-num-seqs
STEP_TOKENS = 2048  # and --max-num-batched-tokens


def scaled_conversation(conversation: Path, path: Path, requests: int) -> None:
    """The trace's first ``requests`` requests with prompts 32 times shorter and outputs
    twice shorter, as a Bailian-format trace: each 512-token block of the original is one
    16-token block, so the requests share exactly the prefixes they shared before."""
    rows = []
    with conversation.open() as trace:
        for i, line in enumerate(trace):
            if i == requests:
                break
            row = json.loads(line)
            output = max(1, min(row["output_length"] // OUTPUT_SCALE, 400))
            prompt = min(math.ceil(row["input_length"] / TOKEN_SCALE), MAX_LEN - output - 16)
            rows.append({"chat_id": i, "parent_chat_id": -1, "timestamp": row["timestamp"] / 1000,
                         "input_length": prompt, "output_length": output, "type": "text",
                         "turn": 1, "hash_ids": row["hash_ids"][: prompt // 16]})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# vLLM's own latency histograms, timed in its API server from a request's arrival there
ENGINE_LATENCIES = {
    "ttft_s": "vllm:time_to_first_token_seconds",
    "tpot_s": "vllm:request_time_per_output_token_seconds",
    "e2e_s": "vllm:e2e_request_latency_seconds",
}
ENGINE_PHASES = {
    "queue_s": "vllm:request_queue_time_seconds",  # waiting to be scheduled
    "prefill_s": "vllm:request_prefill_time_seconds",  # scheduled to its first token
}


def engine_counters(url: str) -> dict[str, float]:
    """The engine's own counters so far: ``preemptions`` (requests it preempted), and per
    latency of ``ENGINE_LATENCIES`` and ``ENGINE_PHASES`` its histogram's ``KEY sum`` and
    ``KEY count``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    names = {name: key for key, name in (ENGINE_LATENCIES | ENGINE_PHASES).items()}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:num_preemptions":
            found["preemptions"] = sum(s.value for s in family.samples if s.name.endswith("_total"))
        elif family.name in names:
            for part in ("sum", "count"):
                found[f"{names[family.name]} {part}"] = sum(
                    s.value for s in family.samples if s.name.endswith(f"_{part}")
                )
    missing = {"preemptions", *(f"{k} count" for k in ENGINE_LATENCIES)} - set(found)
    assert not missing, f"vLLM's /metrics lacks {sorted(missing)}"
    return found


def cpu_steal() -> tuple[int, int]:
    """(steal, all) jiffies of the machine so far (/proc/stat): time the hypervisor gave
    this machine's CPUs to others, which slows a run without anything here being busy."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    return fields[7], sum(fields)


def errors(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "validate.json").read_text())
    assert data["counts"]["compared"] == REQUESTS
    metrics = data["metrics"]
    return {
        key: {stat: metrics[key]["error"][stat] for stat in ("mean", "p50", "p90")}
        for key in ("ttft_s", "tpot_s", "e2e_s")
    }
