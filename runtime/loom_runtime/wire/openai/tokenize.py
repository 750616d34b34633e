"""vLLM's /tokenize and /detokenize request bodies as pydantic models (vLLM 0.33.0's
serve/tokenize/protocol.py): a prompt or chat messages to token ids, token ids to text.

Owns those fields and what Loom refuses of them; never tokenizes (serve/tokenize_api.py does).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.body import StrictBody
from loom_runtime.wire.openai.fields import INT_MAX
from loom_runtime.wire.openai.request import Messages
from loom_runtime.wire.openai.tools import ToolDef


class TokenizeCompletionRequest(StrictBody):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # e.g. BOS, as /v1/completions adds them
    return_token_strs: bool | None = False


class TokenizeChatRequest(StrictBody):
    model: str | None = None
    messages: Messages
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    add_special_tokens: bool = False  # on top of the ones the template writes
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None  # rendered by the template, as the chat route does
    media_io_kwargs: dict[str, Any] | None = None  # meaningless: the messages are text only
    mm_processor_kwargs: dict[str, Any] | None = None  # meaningless, as media_io_kwargs

    @model_validator(mode="after")
    def _refused(self) -> TokenizeChatRequest:
        """The chat fields /v1/chat/completions refuses (docs/openai-fields.md), refused here
        too: /tokenize must count what the chat route would run."""
        for name in ("continue_final_message", "chat_template"):
            if getattr(self, name):
                raise InvalidRequestError(
                    f"{name} is not supported: /v1/chat/completions refuses it, so /tokenize "
                    "does too (docs/openai-fields.md)",
                    param=name,
                )
        return self


class DetokenizeRequest(StrictBody):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT_MAX)]]
