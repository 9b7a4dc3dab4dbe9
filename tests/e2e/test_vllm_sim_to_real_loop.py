"""The loop that makes the replay evidence, on a real engine (make test-vllm): a CPU vLLM
engine serving alone (prefill and decode, chunked prefill, prefix caching), calibrated
(`pdd-router calibrate`); a slice of the shipped conversation trace, scaled to the tiny
model, sent to it at the trace's rate and at twice it (`replay live`); the same slice
replayed on the calibrated colocated preset (`replay run`), once with decode memory taken
as tokens are generated (as vLLM does) and once with each request's whole output reserved
at admission (the replay's first model); `replay validate` on each pair.

The engine's KV memory is kept small (``BLOCKS``) so that it fills and vLLM preempts, as a
busy production engine does; that is where the two memory models part. vLLM's model
worker has the core its OpenMP threads are bound to to itself; its API server and engine
core share the other (``host_processes_off_the_worker``), as the host's CPUs do on a GPU server,
so what is measured is the engine's timing rather than the two cores' contention. The
client sending the trace may run on either core, and its session is scheduled ahead of
vLLM's (``client_scheduled_first``), so that it reads tokens as they come. The test
prints, beside the errors, vLLM's own mean latencies (its Prometheus histograms) against
the replay's and the client's, how late the client sent requests and read tokens (the
`client` section of `replay live`'s summary), the CPU time the hypervisor took (steal)
and the cores each process ran on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import cli
from vllm_loop_support import (
    ENGINE_LATENCIES,
    MAX_SEQS,
    REQUESTS,
    STEP_TOKENS,
    cpu_steal,
    engine_counters,
    errors,
    scaled_conversation,
)

from vllm_launcher import (
    VOCAB,
    Endpoint,
    client_scheduled_first,
    host_processes_off_the_worker,
    process_cores,
    random_model,
    vllm_python,
    vllm_servers,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_BLOCK = 128  # tokens per KV block of vLLM on the CPU
BLOCKS = 48  # 6,144 tokens of KV: the longest request fits, a busy minute does not


@pytest.fixture(scope="module")
def engine_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-loop") / "vllm-0.log"


@pytest.fixture(scope="module")
def engine(engine_log: Path) -> Iterator[Endpoint]:
    python = vllm_python()
    model = engine_log.parent
    random_model(python, model)
    extra = ["--num-gpu-blocks-override", str(BLOCKS), "--max-num-seqs", str(MAX_SEQS),
             "--max-num-batched-tokens", str(STEP_TOKENS)]  # fmt: skip
    with (
        vllm_servers(python, model, 1, extra_args=extra) as engines,
        host_processes_off_the_worker(engine_log),
        client_scheduled_first(),
    ):
        yield engines[0]


def test_a_calibrated_replay_of_a_real_vllm_engine(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    engine: Endpoint,
    engine_log: Path,
    conversation_trace: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    scaled_conversation(conversation_trace, trace, REQUESTS)
    calibrated = cli(capsys, "calibrate", "--url", engine.url, "--preset", "colocated-small",
        "--pool", "engines", "--out", str(tmp_path / "cluster.yaml"), "--vocab-size",
        str(VOCAB), "--max-prompt", "3072", "--max-batch", "8", "--repeats", "3",
        "--decode-tokens", "256", "--no-progress")  # fmt: skip
    # vLLM exports its requests' prefill and decode times: the calibration uses its clock
    assert "timed by the engine's clock" in calibrated, calibrated
    # long decode probes reach as far into the cut memory as it holds at each batch size
    # (2,816 + 256 tokens for one request, 384 + 256 for eight): vLLM would preempt beyond
    assert "8 x 2816 -> 384" in calibrated, calibrated
    pool = yaml.safe_load((tmp_path / "cluster.yaml").read_text())["pools"]["engines"]
    fitted = pool["fitted"]
    # the engine's KV layout, from its /metrics: 128-token blocks, all but vLLM's null block
    assert (pool["kv_block_tokens"], pool["kv_capacity_tokens"]) == (
        VLLM_BLOCK, (BLOCKS - 1) * VLLM_BLOCK
    )  # fmt: skip
    cluster = [
        "pools.engines.instances=1",
        f"pools.engines.max_batch={MAX_SEQS}",
        f"timing.step_tokens={STEP_TOKENS}",
    ]
    found: dict[str, Any] = {
        "calibration, ms": {k: round(v * 1e3, 6) for k, v in fitted.items()
                            if isinstance(v, float)},
        "calibration, outside the engine": next(
            line for line in calibrated.splitlines() if "timed by" in line
        ),
    }  # fmt: skip
    for load, rate in (("light", "1"), ("moderate", "2")):
        live = tmp_path / f"live-{load}"
        before, steal = engine_counters(engine.url), cpu_steal()
        cli(capsys, "replay", "live", str(trace), "--url", engine.url, "--rate-scale", rate,
            "--vocab-size", str(VOCAB), "--out", str(live), "--no-progress")  # fmt: skip
        steal_after = cpu_steal()
        client = json.loads((live / "summary.json").read_text())["client"]
        found[f"{load}, client's delays, ms"] = {  # how late it sent requests and read tokens
            "send P99": round(client["send_lag_s"]["p99"] * 1e3, 1),
            "loop stalled, %": round(client["loop_stalled_share"] * 100, 2),
            "loop stall max": round(client["loop_stall_s_max"] * 1e3, 1),
        }
        after = engine_counters(engine.url)
        deadline = time.monotonic() + 10  # the engine counts a request just after its end
        while after["e2e_s count"] - before["e2e_s count"] < REQUESTS:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
            after = engine_counters(engine.url)
        found[f"{load}, vLLM preemptions"] = after["preemptions"] - before["preemptions"]
        found[f"{load}, CPU steal"] = round(
            (steal_after[0] - steal[0]) / (steal_after[1] - steal[1]), 4
        )
        served = {k: after[f"{k} count"] - before[f"{k} count"] for k in ENGINE_LATENCIES}
        assert served["e2e_s"] == REQUESTS, served  # every request, and only these, served
        engine_mean = {k: (after[f"{k} sum"] - before[f"{k} sum"]) / served[k] for k in served}
        for memory in ("on-demand", "reserve-output"):
            sim = tmp_path / f"sim-{load}-{memory}"
            sets = [*cluster, f"memory.allocation={memory}"]
            cli(capsys, "replay", "run", str(trace), "--preset", str(tmp_path / "cluster.yaml"),
                "--rate-scale", rate, *(a for s in sets for a in ("--set", s)),
                "--out", str(sim), "--no-progress")  # fmt: skip
            out = tmp_path / f"validate-{load}-{memory}"
            cli(capsys, "replay", "validate", str(live), str(sim), "--out", str(out))
            found[f"{load}, {memory}"] = {
                **errors(out),
                "preemptions": json.loads((sim / "summary.json").read_text())["preemptions"],
            }
            # the replay's mean against vLLM's own (timed in its API server), and the
            # client's against vLLM's: what the client's view adds on this machine
            metrics = json.loads((out / "validate.json").read_text())["metrics"]
            found[f"{load}, {memory}, mean against vLLM's own"] = {
                k: round(metrics[k]["simulated"]["mean"] / engine_mean[k] - 1, 4)
                for k in ENGINE_LATENCIES
            }
        found[f"{load}, client's mean against vLLM's own"] = {
            k: round(metrics[k]["measured"]["mean"] / engine_mean[k] - 1, 4)
            for k in ENGINE_LATENCIES
        }
    found["cores"] = process_cores(engine_log)
    print("\nsim-to-real on a CPU vLLM engine, signed relative errors of the replay:")
    for key, row in found.items():
        print(f"  {key}: {json.dumps(row)}")
    # With the engine's blocks taken as vLLM takes them (shared whole, grown a block at a
    # time, less its null block) and decode probes that fit its memory, four runs gave, on
    # demand, every mean and P90 within 12% of the client's at both loads in two of them,
    # TPOT 8-26% short on the mean in all four, with 4 preemptions to vLLM's 3 (the
    # tables of docs/validation.md). The latency bound is a broken model's
    # (a decode fit near zero gave -97%; one ten times too slow, +900%): tighter bounds
    # failed in clean-clone runs, which print no errors. The memory must hold too: the
    # on-demand replay preempts where vLLM did, and reserving outputs never does.
    for load in ("light", "moderate"):
        row = found[f"{load}, on-demand"]
        assert -0.85 < row["e2e_s"]["mean"] < 2.0, (load, row)
        if found[f"{load}, vLLM preemptions"] > 0:  # memory ran out on the engine: in the
            assert row["preemptions"] > 0  # replay too, when memory grows as vLLM's does
        assert found[f"{load}, reserve-output"]["preemptions"] == 0
