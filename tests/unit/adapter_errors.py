"""An HTTP engine adapter's errors in unit tests: what generate and prefill raise when the
engine (mocked with respx) answers with an error or cannot be reached."""

from __future__ import annotations

import httpx
import pytest
import respx

from engines_adapter.contract import EngineAdapter, EngineError, GenerateRequest

__all__ = ["errors_of"]


async def errors_of(
    adapter: EngineAdapter,
    route: respx.Route,
    answer: httpx.Response | Exception,
    request: GenerateRequest,
) -> tuple[EngineError, EngineError]:
    """The EngineErrors a generation and a prefill of ``request`` raise when ``route``
    answers ``answer`` (a response, or an exception raised instead)."""
    if isinstance(answer, Exception):
        route.mock(side_effect=answer)
    else:
        route.mock(return_value=answer)
    with pytest.raises(EngineError) as from_generate:
        async for _ in adapter.generate(request):
            pass
    with pytest.raises(EngineError) as from_prefill:
        await adapter.prefill(request)
    return from_generate.value, from_prefill.value
