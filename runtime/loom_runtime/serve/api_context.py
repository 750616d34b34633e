"""What the OpenAI routes need of the worker: the engine and tokenizer they drive, the model's
limits, metrics and settings, as one ApiContext under the app's API_CONTEXT key.

Owns those Protocols and the context; never handles a request (openai_api.py does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from loom_runtime.card.chat_parsers import ChatParsers
from loom_runtime.engine.grammar.compiler import GrammarCompiler
from loom_runtime.serve.bridge import Mailbox, RequestSink
from loom_runtime.serve.metrics import ServerMetrics
from loom_runtime.serve.prepare import ModelLimits, PromptTokenizer


class ServingTokenizer(PromptTokenizer, Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> Sequence[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str: ...

    def token_strings(self, ids: Sequence[int]) -> list[str]: ...


class ServingEngine(RequestSink, Protocol):
    """What the routes need of the engine (the Engine satisfies it)."""

    @property
    def tokenizer(self) -> ServingTokenizer: ...

    @property
    def grammars(self) -> GrammarCompiler: ...


@dataclass(frozen=True)
class ApiContext:
    engine: ServingEngine
    limits: ModelLimits
    metrics: ServerMetrics
    stall_timeout_s: float  # longest wait for the engine's next output before giving up
    started: int  # unix time the worker started (the model's `created`)
    strict_fields: bool = False  # refuse fields the schema does not define (else: ignore, name)
    mailbox: Mailbox | None = None  # the server's: a step's outputs wake the event loop once
    chat_parsers: ChatParsers = field(default_factory=ChatParsers)  # how chat output is read


API_CONTEXT = web.AppKey("api_context", ApiContext)
