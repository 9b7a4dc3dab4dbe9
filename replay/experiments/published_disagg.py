"""A published disaggregated run's deployment: a prefill pool and a decode pool in one
datacenter, the KV moved between them over the datacenter's fabric.

The run names each pool's workers, their tensor parallelism and batch (AIConfigurator's
``prefill_*`` and ``decode_*`` columns); the replay builds the same pools of the run's GPU,
model, quantization and engine from the packaged intra-datacenter preset ``idc-pd-small``
(routed by ``idc-pd``: every request prefilled on P, its KV copied to a decode instance).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset
from router.errors import UserError

if TYPE_CHECKING:
    from replay.experiments.published_run import PublishedRun

__all__ = ["NIC_GBPS", "disagg_overrides", "disagg_preset"]

NIC_GBPS = 400.0
"""One 400 Gb/s NIC per GPU, as in the DGX/HGX H100 and H200 systems the runs used
(a ConnectX-7 for each GPU): a prefill worker sends its KV over its own GPUs' NICs, so the
datacenter's fabric carries ``NIC_GBPS`` for each prefill GPU (shared by the transfers
in flight, as the simulator's links are)."""

_POOLS = ("prefill_workers", "prefill_tp", "prefill_batch", "decode_workers", "decode_tp",
          "decode_batch")  # fmt: skip


def disagg_overrides(run: PublishedRun, source: str) -> dict[str, Any]:
    """``idc-pd-small``'s keys set to ``run``'s pools (a ``PublishedRun`` of mode disagg).

    The prefill batch is the run's in requests of its input length (one request a pass
    when it is 1); a decode instance runs at most the run's decode batch."""
    sizes: dict[str, int | None] = {name: getattr(run, name) for name in _POOLS}
    missing = [name for name, value in sizes.items() if value is None]
    if missing:
        raise UserError(f"run {run.id}: a disaggregated run needs {', '.join(missing)}")
    size = {name: value for name, value in sizes.items() if value is not None}
    pools: dict[str, Any] = {}
    for pool, prefix in (("p", "prefill"), ("md", "decode")):
        pools |= {
            f"pools.{pool}.instances": size[f"{prefix}_workers"],
            f"pools.{pool}.hardware": run.hardware,
            f"pools.{pool}.gpus_per_instance": size[f"{prefix}_tp"],
            f"pools.{pool}.step_costs.source": source,
            f"pools.{pool}.step_costs.engine": run.engine,
        }
    batch = size["prefill_batch"]
    return {
        "model": run.model,
        **pools,
        "pools.md.max_batch": size["decode_batch"],
        "timing.prefill_batch_tokens": 0 if batch <= 1 else batch * run.isl,
        "links.rdma.bandwidth_gbps": NIC_GBPS * size["prefill_workers"] * size["prefill_tp"],
    }


def disagg_preset(run: PublishedRun, source: str) -> ClusterPreset:
    """The run's prefill and decode pools in one datacenter, priced by ``source``."""
    return load_preset("idc-pd-small", disagg_overrides(run, source))
