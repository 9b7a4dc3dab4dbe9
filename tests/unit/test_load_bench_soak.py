"""The soak's table: resident memory per process beside the blocks the index records."""

from __future__ import annotations

import io

from rich.console import Console

from bench.load_bench import PhaseResult, ReplicaRun, SoakResult, index_blocks_of
from bench.load_tables import render_soak

METRICS = """# HELP pdd_router_index_blocks Blocks the index records per instance
# TYPE pdd_router_index_blocks gauge
pdd_router_index_blocks{instance="p0"} 32768.0
pdd_router_index_blocks{instance="md0"} 1024.0
pdd_router_index_blocks_other 5.0
pdd_router_replicas 3.0
"""


def test_index_blocks_are_summed_over_instances() -> None:
    assert index_blocks_of(METRICS) == 33_792
    assert index_blocks_of("pdd_router_replicas 1.0\n") == 0


def test_the_memory_table_shows_the_index_blocks_and_their_growth() -> None:
    phase = PhaseResult(1_000, 0, 10.0, 100.0, 5.0, 9.0)
    soak = SoakResult(
        3.0, phase, phase, ["router1-0"], [(0.0, [150.0]), (60.0, [170.0]), (180.0, [171.5])],
        60.0, [1.5], 0, [1_000.0, 90_000.0, 91_000.0],
    )  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=120)
    for table in render_soak(ReplicaRun(1, "memory", soak=soak)):
        console.print(table)
    text = out.getvalue()
    assert "index blocks" in text
    assert "91,000" in text
    assert "+1,000" in text  # blocks from 60 s to the end
    assert "+1.5" in text
