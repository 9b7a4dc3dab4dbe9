"""A tokenizer from a model directory: ``tokenizer.json`` (HF tokenizers) and its config."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, processors

from router.tokenization.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    ContentFormat,
    Message,
    normalize_messages,
    select_template,
)
from router.tokenization.protocol import Tools, TooManyTokens

__all__ = ["COMPILED_TEMPLATES_KEPT", "HFTokenizer", "TokenizerFiles", "resolve_model_dir"]

COMPILED_TEMPLATES_KEPT = 16
"""Compiled chat templates a tokenizer keeps (the least recently used beyond them are
dropped): the model's own few, and literal ones a caller passes."""

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")  # fmt: skip
# tokenizer classes whose transformers implementation rebuilds the post-processor from
# ``add_bos_token`` / ``add_eos_token`` (the generic fast tokenizer keeps tokenizer.json's)
_REBUILDS_POST_PROCESSOR = (
    "LlamaTokenizer",
    "LlamaTokenizerFast",
    "CodeLlamaTokenizer",
    "CodeLlamaTokenizerFast",
    "GemmaTokenizer",
    "GemmaTokenizerFast",
)


def resolve_model_dir(path: str | Path) -> Path:
    """A directory holding ``tokenizer.json``: ``path`` itself, or, for a Hugging Face
    cache entry (``.../models--org--name``), the snapshot ``refs/main`` names (else the
    only snapshot). Nothing is downloaded."""
    root = Path(path).expanduser()
    if (root / "tokenizer.json").is_file():
        return root
    snapshots = root / "snapshots"
    if snapshots.is_dir():
        ref = root / "refs" / "main"
        if ref.is_file():
            chosen = snapshots / ref.read_text().strip()
            if (chosen / "tokenizer.json").is_file():
                return chosen
        found = sorted(p for p in snapshots.iterdir() if (p / "tokenizer.json").is_file())
        if len(found) == 1:
            return found[0]
        if found:
            raise FileNotFoundError(f"{root}: several snapshots and no refs/main")
    raise FileNotFoundError(f"no tokenizer.json in {root}")


def _token_text(value: Any) -> str | None:
    """A special token in tokenizer_config.json: a string or an AddedToken mapping."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """What a model directory says about its tokenizer."""

    directory: Path
    config: dict[str, Any]
    templates: str | dict[str, str] | None

    @classmethod
    def read(cls, path: str | Path) -> TokenizerFiles:
        directory = resolve_model_dir(path)
        config_path = directory / "tokenizer_config.json"
        config: dict[str, Any] = (
            json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        )
        return cls(directory, config, _templates(directory, config))


def _templates(directory: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """The chat templates, looked up as transformers does: ``chat_template.jinja`` (with
    ``additional_chat_templates/*.jinja`` as named ones) over tokenizer_config.json's
    ``chat_template`` (a string or a list of ``{name, template}``), then
    ``chat_template.json``."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        default = jinja.read_text(encoding="utf-8")
        extra_dir = directory / "additional_chat_templates"
        if not extra_dir.is_dir():
            return default
        named = {p.stem: p.read_text(encoding="utf-8") for p in sorted(extra_dir.glob("*.jinja"))}
        return {"default": default, **named}
    value = config.get("chat_template")
    if value is None:
        legacy = directory / "chat_template.json"
        if legacy.is_file():
            value = json.loads(legacy.read_text(encoding="utf-8")).get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return {str(item["name"]): str(item["template"]) for item in value}
    raise ChatTemplateError(f"chat_template of {directory} is neither a string nor a list")


class HFTokenizer:
    """The Tokenizer protocol over HF ``tokenizers`` and the model's chat template.

    Thread-safe for encoding and decoding; encoding goes through ``encode_batch_fast``, which
    releases the GIL (``encode`` does not), so worker threads run beside the event loop.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: Mapping[str, Any] | None = None,
        templates: str | Mapping[str, str] | None = None,
        *,
        name: str = "tokenizer",
        content_format: ContentFormat = "string",
        max_tokens: int | None = None,
    ) -> None:
        self._tok = tokenizer
        self.max_tokens = max_tokens  # a text encoding to more is refused (TooManyTokens)
        self._config = dict(config or {})
        self._templates = templates if isinstance(templates, str | None) else dict(templates)
        self._compiled: OrderedDict[str, ChatTemplate] = OrderedDict()  # an LRU
        self._name = name
        self.content_format: ContentFormat = content_format
        self.special_tokens: dict[str, Any] = {}
        for key in _SPECIAL_KEYS:
            text = _token_text(self._config.get(key))
            if text is not None:
                self.special_tokens[key] = text
        extra = self._config.get("additional_special_tokens")
        if isinstance(extra, list):
            self.special_tokens["additional_special_tokens"] = [
                t for t in (_token_text(v) for v in extra) if t is not None
            ]
        self._maybe_rebuild_post_processor()
        added = tokenizer.get_added_tokens_decoder().values()
        self._added: tuple[AddedToken, ...] = tuple(t for t in added if t.content)
        self._splitting = tuple(t.content for t in self._added if not t.lstrip and not t.normalized)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, name: str | None = None, max_tokens: int | None = None
    ) -> HFTokenizer:
        """Load from a model directory or a Hugging Face cache entry (no download)."""
        files = TokenizerFiles.read(path)
        tok = Tokenizer.from_file(str(files.directory / "tokenizer.json"))
        return cls(tok, files.config, files.templates, name=name or files.directory.name,
                   max_tokens=max_tokens)  # fmt: skip

    def _maybe_rebuild_post_processor(self) -> None:
        """BOS/EOS from ``add_bos_token`` / ``add_eos_token`` for the tokenizer classes
        whose transformers implementation rebuilds its post-processor from them."""
        if self._config.get("tokenizer_class") not in _REBUILDS_POST_PROCESSOR:
            return
        ends: dict[str, tuple[str, int]] = {}
        for key, flag, default in (("bos_token", "add_bos_token", True),
                                   ("eos_token", "add_eos_token", False)):  # fmt: skip
            text = self.special_tokens.get(key)
            token_id = None if text is None else self._tok.token_to_id(text)
            if bool(self._config.get(flag, default)):
                if text is None or token_id is None:
                    raise ValueError(f"{flag} is set but the tokenizer has no {key}")
                ends[key] = (text, token_id)
        bos, eos = ends.get("bos_token"), ends.get("eos_token")

        def seq(piece: str, i: int) -> list[str]:
            return [
                *([f"{bos[0]}:{i}"] if bos else []),
                f"{piece}:{i}",
                *([f"{eos[0]}:{i}"] if eos else []),
            ]

        self._tok.post_processor = processors.TemplateProcessing(
            single=seq("$A", 0),
            pair=seq("$A", 0) + seq("$B", 1),
            special_tokens=list(ends.values()),
        )

    # ------------------------------------------------------------------ the protocol

    @property
    def name(self) -> str:
        return self._name

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def _special_id(self, key: str) -> int | None:
        text = self.special_tokens.get(key)
        return None if not isinstance(text, str) else self._tok.token_to_id(text)

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # without offsets: dropping a million tokens' offsets and strings holds the GIL
        # for about 45 ms (about 6 ms without); only the IDs are used
        (encoding,) = self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        # counted before the IDs become a Python list (a conversion holding the GIL)
        count = len(encoding)
        if self.max_tokens is not None and count > self.max_tokens:
            del encoding  # freed here, in the worker: a traceback would keep it alive
            raise TooManyTokens(count, self.max_tokens)
        ids: list[int] = encoding.ids  # a new list each time
        return ids

    def template_source(self, *, has_tools: bool = True) -> str | None:
        """The source of the template a request (with tools, by default) is rendered with
        (None: the tokenizer has none); the tool-call format is read from it."""
        try:
            return select_template(self._templates, None, has_tools=has_tools)
        except ChatTemplateError:
            return None

    def template(self, name: str | None = None, *, has_tools: bool = False) -> ChatTemplate:
        """The compiled chat template (``name``: a named one, or a literal template)."""
        source = select_template(self._templates, name, has_tools=has_tools)
        compiled = self._compiled.pop(source, None) or ChatTemplate(source, self.special_tokens)
        self._compiled[source] = compiled
        while len(self._compiled) > COMPILED_TEMPLATES_KEPT:
            self._compiled.popitem(last=False)
        return compiled

    def render_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render; ``chat_template`` in ``template_kwargs`` picks a named template (or
        gives one), ``continue_final_message`` and ``documents`` are passed on."""
        name = template_kwargs.pop("chat_template", None)
        template = self.template(name, has_tools=tools is not None)
        return template.render(
            normalize_messages(messages, self.content_format),
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **template_kwargs,
        )

    def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt, tools, **template_kwargs)
        return self.encode_text(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def boundary_safe(self, left: str, right: str) -> bool:
        """Safe when ``right`` starts with an added token that is matched before
        normalization and does not strip whitespace on its left, and no added token
        straddles the boundary: the text is split at added tokens before anything else
        runs, so each side is tokenized on its own either way."""
        if not left or not right:
            return True
        if not any(right.startswith(content) for content in self._splitting):
            return False
        for token in self._added:
            c = token.content
            for i in range(1, len(c)):
                if left.endswith(c[:i]) and right.startswith(c[i:]):
                    return False
        return True
