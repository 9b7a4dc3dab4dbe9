"""Small predictions every policy uses: prefill wait, WAN transfer, TTFT."""

from __future__ import annotations

from dataclasses import dataclass

from policies.types import ClusterView, InstanceLoad, LinkState, RequestView

__all__ = ["Placement", "hit_tokens", "link_between", "prefill_delay_s"]


def hit_tokens(request: RequestView, blocks: int, instance: InstanceLoad | None = None) -> int:
    """Prompt tokens covered by ``blocks`` leading blocks, as ``instance``'s engine would
    serve them from its cache: in whole blocks of its own size, and never the prompt's last
    token (vLLM computes it), when the engine reported its block size."""
    # min() and max() spelled out (this runs for every candidate of every decision)
    n = request.input_length
    tokens = blocks * request.block_size
    if n < tokens:
        tokens = n
    engine_block = instance.cache_block_tokens if instance is not None else None
    if engine_block:
        if n - 1 < tokens:
            tokens = n - 1
        tokens -= tokens % engine_block
    return 0 if tokens < 0 else tokens


def prefill_delay_s(instance: InstanceLoad, uncached_tokens: int, cluster: ClusterView) -> float:
    """Queueing plus compute on a prefill instance, from the tokens ahead of us and our own."""
    return (instance.queued_prefill_tokens + uncached_tokens) / cluster.prefill_tokens_per_s


def link_between(cluster: ClusterView, src: InstanceLoad, dst: InstanceLoad) -> LinkState:
    """RDMA inside a datacenter, the WAN across datacenters."""
    if src.datacenter == dst.datacenter or cluster.wan is None:
        return cluster.rdma
    return cluster.wan


@dataclass(frozen=True, slots=True)
class Placement:
    """A candidate decode instance with what shipping this request to it would cost."""

    instance: InstanceLoad
    hit_blocks: int
    transfer_bytes: float
    transfer_s: float
    score: float
