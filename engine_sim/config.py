"""How a simulated engine behaves (its model, cache, limits and timing) and the faults it
can be told to inject."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["SimEngineConfig", "SimFaults"]


class SimEngineConfig(BaseModel):
    """How a simulated engine behaves; every instance of one deployment shares the model."""

    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(16, gt=0)
    vocab_size: int = Field(512, ge=2)
    cache_blocks: int = Field(4096, gt=0)  # KV capacity in blocks
    max_running: int = Field(64, gt=0)  # more requests than this wait
    prefill_s_per_token: float = Field(0.0, ge=0)  # per uncached prompt token
    decode_s_per_token: float = Field(0.0, ge=0)
    eos_token_id: int | None = None  # None: never stops before max_tokens
    # the token IDs generation draws from, uniformly (repeat one to make it likelier; include
    # eos_token_id to stop); None: the whole vocabulary
    output_token_ids: list[int] | None = Field(None, min_length=1)
    model_seed: int = 0  # the toy model; equal on every instance of a deployment
    hash_seed: int = Field(0, ge=0)  # the cache's own block hashes, like an engine's
    event_queue_size: int = Field(10_000, gt=0)  # per KV-event subscriber

    @model_validator(mode="after")
    def _outputs_in_vocabulary(self) -> SimEngineConfig:
        bad = [t for t in self.output_token_ids or () if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"output_token_ids: {bad[0]} is not below vocab_size")
        return self


HOLD_POLL_S = 0.01
"""How often a request held by the ``hold`` fault looks whether it was lifted."""


class SimFaults(BaseModel):
    """Faults to inject; change them on a running engine (``engine.faults.refuse = True``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    healthy: bool = True  # what health() reports
    refuse: bool = False  # every new request fails with a retryable EngineError
    fail_after_tokens: int | None = Field(None, ge=0)  # streams fail after this many tokens
    hang: bool = False  # requests stall until aborted
    hold: bool = False  # admitted requests wait, before their prefill, until it is false again
    busy_next: int = Field(0, ge=0)  # the server answers this many next completions 429
