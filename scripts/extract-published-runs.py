#!/usr/bin/env python3
"""Write replay/published/silicon.csv: the measured runs of real engines that
`pdd-router replay validate-costs` replays, selected from the silicon benchmark sample
that AIConfigurator publishes in its package (aiconfigurator-core, Apache-2.0,
aiconfigurator_core/systems/silicon_sample.csv). Run it again after upgrading the
dependency to refresh the selection; the replay itself reads only the copy.
"""

from __future__ import annotations

import csv
import re
import sys
from importlib import metadata, resources
from pathlib import Path

# (engine, model as the sample names it, GPU system) -> the project's model preset
MODELS = {
    "Qwen/Qwen3-32B": "qwen3-32b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
}
SYSTEMS = {"h100_sxm": "h100", "h200_sxm": "h200"}
ENGINES = ("vllm", "sglang", "trtllm")
COLUMNS = [
    "id", "engine", "engine_version", "model", "model_path", "hardware", "quant", "mode",
    "isl", "osl", "concurrency", "tp", "prefill_workers", "prefill_tp", "prefill_batch",
    "decode_workers", "decode_tp", "decode_batch", "ttft_ms", "tpot_ms", "measured",
]  # fmt: skip


def _concurrency(row: dict[str, str]) -> str:
    found = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
    if found:
        return found.group(1)
    if row["mode"] == "agg":
        return row["batch_size"]
    # A disaggregated run that does not record its clients: every decode slot of every
    # decode worker (batch x workers x attention-DP ranks), the sample's own convention;
    # it holds for every disaggregated row of the sample that records both.
    slots = [int(row[f"decode_{k}"] or 1) for k in ("batch_size", "num_workers")]
    return str(slots[0] * slots[1] * int(row["decode_attention_dp_size"] or 1))


def _measured(row: dict[str, str]) -> str:
    found = re.search(r"measured=([0-9-]{10})", row["silicon_data_source"])
    return found.group(1) if found else ""


def _keep(row: dict[str, str]) -> bool:
    return (
        row["backend"] in ENGINES
        and row["model_path"] in MODELS
        and row["system"] in SYSTEMS
        and row["mode"] in ("agg", "disagg")
        and (row["mode"] == "disagg" or int(row["tp_size"] or 0) >= 1)
    )


def _out(row: dict[str, str]) -> dict[str, str]:
    disagg = row["mode"] == "disagg"
    return {
        "id": row["id"],
        "engine": row["backend"],
        "engine_version": row["backend_version"],
        "model": MODELS[row["model_path"]],
        "model_path": row["model_path"],
        "hardware": SYSTEMS[row["system"]],
        "quant": row["gemm_quant_mode"] or "bfloat16",
        "mode": row["mode"],
        "isl": row["isl"],
        "osl": row["osl"],
        "concurrency": _concurrency(row),
        "tp": "" if disagg else row["tp_size"],
        "prefill_workers": row["prefill_num_workers"] if disagg else "",
        "prefill_tp": row["prefill_tp_size"] if disagg else "",
        "prefill_batch": row["prefill_batch_size"] if disagg else "",
        "decode_workers": row["decode_num_workers"] if disagg else "",
        "decode_tp": row["decode_tp_size"] if disagg else "",
        "decode_batch": row["decode_batch_size"] if disagg else "",
        "ttft_ms": f"{float(row['silicon_ttft_ms']):.3f}",
        "tpot_ms": f"{float(row['silicon_tpot_ms']):.4f}",
        "measured": _measured(row),
    }


def main() -> int:
    sample = resources.files("aiconfigurator_core").joinpath("systems", "silicon_sample.csv")
    with sample.open(encoding="utf-8") as f:
        rows = [_out(r) for r in csv.DictReader(f) if _keep(r)]
    target = Path(__file__).resolve().parent.parent / "replay" / "published" / "silicon.csv"
    version = metadata.version("aiconfigurator-core")
    with target.open("w", encoding="utf-8", newline="") as f:
        f.write(f"# aiconfigurator-core {version}, systems/silicon_sample.csv (Apache-2.0)\n")
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} runs to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
