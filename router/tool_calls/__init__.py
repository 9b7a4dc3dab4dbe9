"""Tool calls and reasoning in a model's output text, parsed into OpenAI's shapes.

The engines' own parsers live inside vLLM and SGLang (their serving processes), not in a
package that installs alone, and the router decodes the tokens itself (a response may come
from two engines after a handoff), so the router parses the text it decoded: one parser
per open model family's format (``formats.py``), streamed as OpenAI's chunks
(``stream.py``)."""
