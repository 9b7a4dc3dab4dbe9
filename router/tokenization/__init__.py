"""Chat and text prompts tokenized exactly as the engine tokenizes them.

Import what you need from its modules (``hf``, ``pool``, ``chat_template``,
``detokenizer``, ``prefix_cache``, ``engine``, ``settings``, ``factory``, ``builtin``):
the package itself imports nothing, so settings that name a tokenizer load no tokenizer
library until one is used.
"""
