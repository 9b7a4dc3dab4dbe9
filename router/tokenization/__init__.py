"""Chat and text prompts tokenized exactly as the engine tokenizes them."""

from __future__ import annotations

from router.tokenization.chat_template import ChatTemplate, ChatTemplateError, Message
from router.tokenization.detokenizer import IncrementalDetokenizer
from router.tokenization.engine import EngineTokenizeError, EngineTokenizer
from router.tokenization.factory import build_async_tokenizer, load_tokenizer
from router.tokenization.hf import HFTokenizer, resolve_model_dir
from router.tokenization.pool import AsyncTokenizer
from router.tokenization.prefix_cache import CachedChatEncoder, PrefixCache
from router.tokenization.protocol import AsyncTokenizerLike, Tokenizer
from router.tokenization.settings import ModelSettings, TokenizerSettings

__all__ = [
    "AsyncTokenizer",
    "AsyncTokenizerLike",
    "CachedChatEncoder",
    "ChatTemplate",
    "ChatTemplateError",
    "EngineTokenizeError",
    "EngineTokenizer",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "Message",
    "ModelSettings",
    "PrefixCache",
    "Tokenizer",
    "TokenizerSettings",
    "build_async_tokenizer",
    "load_tokenizer",
    "resolve_model_dir",
]
