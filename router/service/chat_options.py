"""The option fields of a chat request that take objects: ``tool_choice`` and
``response_format`` (OpenAI's shapes), and the bound on ``top_logprobs``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

__all__ = [
    "MAX_TOP_LOGPROBS",
    "FunctionName",
    "JsonSchemaFormat",
    "NamedToolChoice",
    "ResponseFormat",
    "ToolChoice",
]

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (vLLM's default limit)."""


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming the function the model must call."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str = "output"
    schema_: dict[str, Any] = Field(alias="schema", default_factory=dict)
    strict: StrictBool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: text, any JSON object, or JSON a schema describes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type json_schema, and only then")
        return self
