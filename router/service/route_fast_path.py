"""``POST /v1/route`` answered straight from ASGI: the router's hottest call, without the
web framework's per-request machinery.

Routing, dependency resolution, the request object and response-model validation cost
about as much as the decision of an 8K-token prompt. This middleware answers a route
request itself when everything about it is ordinary: the API key (if one is set) is
right, and the body decodes cleanly (``decode_route_body``). It then runs the very same
``decide_route`` as the FastAPI endpoint and sends the Decision as JSON; an ``ApiError``
(no instance to route to, a token beyond the vocabulary) is answered in the same shape
as the endpoint's. Anything else (a missing key, a body to refuse, another path) goes to
the application with its body intact, so the endpoint stays the reference behaviour and
the OpenAPI contract, and only one of the two ever decides a request.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.service.api import decide_route
from router.service.auth import ServiceAuth
from router.service.deps import generation_of
from router.service.errors import ApiError, error_body
from router.service.route_body import decode_route_body
from router.service.schemas import input_limits
from router.service.tenancy import decision_json, shows_predictions

__all__ = ["RouteFastPath"]

PATH = "/v1/route"


class RouteFastPath:
    """ASGI middleware: ordinary ``POST /v1/route`` requests decided without the framework."""

    def __init__(self, app: ASGIApp, auth: ServiceAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        gen = generation_of(scope)
        authorization = _header(scope, b"authorization")
        if gen is None or not self.auth.accepts(authorization):
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        if body is None:  # the client left
            return
        fast = decode_route_body(body, input_limits())
        if fast is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            decision = await decide_route(gen, fast)
        except ApiError as exc:
            payload = json.dumps(error_body(exc.message, exc.type, exc.param, exc.code))
            await _respond(send, exc.status, payload.encode(), exc.headers)
            return
        visible = shows_predictions(gen.service, fast.cache_salt)
        await _respond(send, 200, decision_json(decision, visible), None)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _read_body(receive: Receive) -> tuple[bytes | None, list[Message]]:
    """The whole body and the messages that carried it (None: the client disconnected)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] == "http.disconnect":
            return None, messages
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out the messages already read, then the client's own."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _respond(send: Send, status: int, body: bytes, headers: dict[str, str] | None) -> None:
    raw: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": raw}
    await send(start)
    await send({"type": "http.response.body", "body": body})
