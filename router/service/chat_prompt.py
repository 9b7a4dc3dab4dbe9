"""A chat request's prompt token IDs: its size checked first, then rendered with the
model's chat template (or, when the service allows it, the request's own template in
the sandbox) and tokenized off the event loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.service.errors import ApiError
from router.service.prompt_budget import check_prompt_chars, over_token_limit, text_chars
from router.service.schemas import ChatRequest
from router.tokenization.chat_template import ChatTemplateError, normalize_messages
from router.tokenization.pool import AsyncTokenizer
from router.tokenization.protocol import AsyncTokenizerLike, TooManyTokens
from router.tokenization.template_sandbox import TemplateSandbox, is_literal_template

__all__ = ["chat_prompt", "template_field"]


def template_field(body: ChatRequest) -> str | None:
    """The field that holds a template of the request's own (jinja source, not the name of
    one of the model's templates), or None."""
    if is_literal_template(body.chat_template):
        return "chat_template"
    if is_literal_template((body.chat_template_kwargs or {}).get("chat_template")):
        return "chat_template_kwargs.chat_template"
    return None


async def chat_prompt(
    body: ChatRequest, tokenizer: AsyncTokenizerLike, char_limit: int,
    sandbox: TemplateSandbox | None,
) -> Sequence[int]:  # fmt: skip
    """The prompt's token IDs (ApiError 400 naming the field for text over ``char_limit``
    characters, a template of the request's own while ``sandbox`` is None (turned off) or
    failing in it, or messages the template cannot render)."""
    kwargs = dict(body.chat_template_kwargs or {})
    if body.chat_template is not None:
        kwargs["chat_template"] = body.chat_template
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    messages = _as_system(body.messages)
    check_prompt_chars(text_chars([body.messages, body.tools, kwargs]), char_limit, "messages")
    field = template_field(body)
    if field is not None and sandbox is None:
        raise ApiError(
            400, f"{field}: chat templates supplied by requests are turned off on this service "
            "(service.request_templates.allow); name one of the model's templates or leave "
            "it out", param=field,
        )  # fmt: skip
    try:
        if field is not None and sandbox is not None and isinstance(tokenizer, AsyncTokenizer):
            return await _sandboxed(sandbox, tokenizer, body, messages, kwargs)
        # the model's own template, or an engine that renders (its own limits apply there)
        return await tokenizer.encode_chat(
            messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools,
            **kwargs,
        )  # fmt: skip
    except ChatTemplateError as exc:
        where = field or "messages"
        raise ApiError(400, f"{where}: {exc}", param=where) from exc
    except TooManyTokens as exc:
        raise over_token_limit(exc, "messages") from None
    except (ValueError, TypeError) as exc:
        raise ApiError(400, f"messages: {exc}", param="messages") from exc


def _as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's ``developer`` messages as ``system`` ones (what chat templates know)."""
    if not any(m.get("role") == "developer" for m in messages):
        return messages
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


async def _sandboxed(
    sandbox: TemplateSandbox, tokenizer: AsyncTokenizer, body: ChatRequest,
    messages: list[dict[str, Any]], kwargs: dict[str, Any],
) -> list[int]:  # fmt: skip
    """The request's template rendered in the sandbox (time, output and memory budgets),
    then tokenized in the tokenizer's threads."""
    source = str(kwargs.pop("chat_template"))
    tok = tokenizer.tokenizer
    messages = normalize_messages(messages, getattr(tok, "content_format", "string"))
    text = await sandbox.render(
        source, messages, special_tokens=getattr(tok, "special_tokens", None),
        add_generation_prompt=body.add_generation_prompt, tools=body.tools, **kwargs,
    )  # fmt: skip
    return await tokenizer.encode_text(text, add_special_tokens=False)
