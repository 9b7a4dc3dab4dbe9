"""Request limits at the ASGI layer: the body size, counted while the body streams in."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.service.deps import service_of
from router.service.errors import error_body
from router.service.schemas import use_input_limits

__all__ = ["BodyLimit", "BodyTooLarge"]


class BodyTooLarge(HTTPException):
    """The request body passed the limit; the connection closes after the 413 so that the
    client stops sending the rest."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes", {"Connection": "close"})


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 in OpenAI's error shape.

    A declared ``Content-Length`` over the limit is refused before anything is read.
    Otherwise (chunked or not) the bytes of ``http.request`` messages are counted as the
    handler receives them, and the message that passes the limit raises ``BodyTooLarge``
    instead of being delivered: nothing past the limit is buffered. The error handlers
    answer it; if it escapes them, this middleware answers it. Each request also runs
    with the service's input limits published for the request models
    (``schemas.use_input_limits``).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.limit:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with use_input_limits(service_of(scope)):
            try:
                await self.app(scope, counted_receive, tracked_send)
            except BodyTooLarge:
                if started:
                    raise
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        exc = BodyTooLarge(self.limit)
        response = JSONResponse(
            error_body(exc.detail, "invalid_request_error", None, 413),
            status_code=413,
            headers=exc.headers,
        )
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None
