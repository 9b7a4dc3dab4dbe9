"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.tokenization.engine import EngineTokenizeError

__all__ = [
    "ApiError",
    "LastResort",
    "engine_tokenize_error",
    "error_body",
    "install_error_handlers",
]

log = logging.getLogger("pdd_router.service")

BAD_VALUE_ERRORS = frozenset(
    {"over_limit", "json_invalid", "unsupported", "not_finite", "router_owned"}
)
"""Validation errors answered with 400 (a value over a configured limit, malformed JSON, a
number that is not finite, a field only the router may set); every other validation error
is a 422."""


class ApiError(Exception):
    """An error the API reports to the client with a status code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        """``code``: OpenAI's error code (e.g. ``model_not_found``); default, the status."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.headers = headers or {}
        self.code: int | str = code if code is not None else status


def error_body(message: str, type_: str, param: str | None, code: int | str) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def engine_tokenize_error(exc: EngineTokenizeError) -> ApiError:
    """An engine that tokenizes for a model: its refusal of the request (400) passed on,
    else a 502 naming it."""
    if exc.status == 400:
        return ApiError(400, str(exc))
    return ApiError(502, f"the engine that tokenizes for this model failed: {exc}",
                    type_="engine_error")  # fmt: skip


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: API errors, validation errors (422 naming the field,
    400 for the kinds in ``BAD_VALUE_ERRORS``), HTTP errors, and (``LastResort``) a JSON
    500 for anything unexpected, on a connection that stays open."""
    app.add_middleware(LastResort)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            error_body(exc.message, exc.type, exc.param, exc.code),
            status_code=exc.status,
            headers=exc.headers,
        )

    @app.exception_handler(EngineTokenizeError)
    async def _engine_tokenize(request: Request, exc: EngineTokenizeError) -> JSONResponse:
        return await _api_error(request, engine_tokenize_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first: dict[str, Any] = _relevant(errors) if errors else {"msg": "invalid request"}
        status = 400 if first.get("type") in BAD_VALUE_ERRORS else 422
        body_message = _body_error(first, request.headers.get("content-type"))
        if body_message is not None:
            return JSONResponse(
                error_body(body_message, "invalid_request_error", None, status), status_code=status
            )
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _union_branch(p)]
        ctx: dict[str, Any] = first.get("ctx") or {}
        param = ".".join(loc) or ctx.get("param") or None
        reason = str(first["msg"]).removeprefix("Value error, ")  # pydantic's, for a check's
        message = f"{param}: {reason}" if param else reason
        return JSONResponse(
            error_body(message, "invalid_request_error", param, status), status_code=status
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return JSONResponse(
            error_body(str(exc.detail), "invalid_request_error", None, exc.status_code),
            status_code=exc.status_code,
            headers=headers,
        )


_SCALAR_BRANCHES = frozenset({"str", "int", "float", "bool", "bytes", "none"})


def _union_branch(part: object) -> bool:
    """A part of an error's location that names the branch of a union pydantic tried
    (``str``, ``list[str]``, ``function-after[...]``, a model's class name), not a field."""
    return isinstance(part, str) and (
        part in _SCALAR_BRANCHES or "[" in part or "-" in part or part[:1].isupper()
    )


def _field_of(error: Mapping[str, Any]) -> tuple[Any, ...]:
    loc = tuple(error.get("loc", ()))
    cut = next((i for i, part in enumerate(loc) if _union_branch(part)), len(loc))
    return loc[:cut]


def _relevant(errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The first field's error a client can act on. A value of a union type (``stop``: a
    string or a list of strings) fails once per branch; the branch of the value's own
    shape says what is wrong with it (``stop.0``: too short; ``stop.1``: not a string),
    where the others only say it is not of their type. When every branch says only
    that, they are said together."""
    first = dict(errors[0])
    field = _field_of(first)
    same = [e for e in errors if _field_of(e) == field]
    if len(same) == 1:
        return first
    inside = [e for e in same if len(e.get("loc", ())) > len(field) + 1]  # in a branch's item
    shaped = inside or [e for e in same if not str(e.get("type", "")).endswith("_type")]
    if shaped:
        return dict(shaped[0])
    wanted = list(dict.fromkeys(str(e["msg"]).removeprefix("Input should be ") for e in same))
    return {**first, "loc": field, "msg": "Input should be " + ", or ".join(wanted)}


_WHOLE_BODY_ERRORS = frozenset({"missing", "model_attributes_type", "model_type", "dict_type"})
"""Validation errors at the body itself: none was sent, or it is not a JSON object."""


def _body_error(error: dict[str, Any], content_type: str | None) -> str | None:
    """What is wrong with the request body as a whole (not valid JSON, missing, not a JSON
    object), said in words; None when the error is about one field."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error") or "malformed"
        where = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return f"the request body is not valid JSON: {reason}{where}"
    if loc != ("body",) or error.get("type") not in _WHOLE_BODY_ERRORS:
        return None
    if error.get("type") == "missing":
        return "the request body is empty: send a JSON object (Content-Type: application/json)"
    media = (content_type or "").split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        return (
            "the request body must be a JSON object sent with Content-Type: "
            f"application/json, not {media}"
        )
    return "the request body must be a JSON object"


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves at this path (starlette names only the first route's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


class LastResort:
    """Answer an exception no handler took with a JSON 500 in OpenAI's shape, and log it.

    Starlette's outermost middleware answers such an exception too, but then re-raises it,
    and the server closes the connection; here it ends with the response, so a keep-alive
    connection stays usable. An HTTP exception raised outside the routes (by a middleware)
    gets its own status. An exception after the response started is re-raised: the
    response cannot be completed.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except StarletteHTTPException as exc:  # raised outside the routes (a middleware)
            if started:
                raise
            body = error_body(str(exc.detail), "invalid_request_error", None, exc.status_code)
            await JSONResponse(body, exc.status_code, exc.headers)(scope, receive, send)
        except Exception:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            body = error_body("internal error", "server_error", None, 500)
            await JSONResponse(body, 500)(scope, receive, send)
