"""OpenAI request bodies (completions, chat) as pydantic models, parsed into typed errors.

Owns field names, ranges and what Loom refuses to pretend to support; never touches the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.prompt import join_text_parts

MAX_LOGPROBS = 20  # top alternatives per token, as vLLM allows
MAX_STOP_SEQUENCES = 16


def _prompt(value: object) -> str | tuple[int, ...]:
    """A completion prompt: a string or token ids, or a batch of exactly one of them."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    elif isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        raise ValueError(
            f"batched prompts ({len(value)}) are not supported: send one request per prompt"
        )
    if isinstance(value, str):
        if not value:
            raise ValueError("prompt is empty")
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError("prompt is empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
            raise ValueError("a token-id prompt must be a list of non-negative integers")
        return tuple(value)
    raise ValueError("prompt must be a string or a list of token ids")


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise ValueError("stop must be a non-empty string or a list of non-empty strings")
    if len(items) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(items)}")
    return tuple(items)


def _message_content(value: object) -> str:
    """Message content: a string, or a list of text parts that is joined into one."""
    return join_text_parts(value)


Prompt = Annotated[str | tuple[int, ...], PlainValidator(_prompt)]
Stop = Annotated[tuple[str, ...], PlainValidator(_stop)]
Content = Annotated[str, PlainValidator(_message_content)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Content
    name: str | None = None


class _SamplingRequest(_Strict):
    """Fields shared by completions and chat. Defaults are OpenAI's."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM extension; 0 or -1 = off
    n: int = 1
    seed: int | None = None
    stop: Stop = ()
    stop_token_ids: tuple[int, ...] = ()  # vLLM extension
    ignore_eos: bool = False  # vLLM extension
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored, as OpenAI does for abuse tracking
    kv_transfer_params: dict[str, Any] | None = None  # P/D (vLLM NixlConnector's object)
    return_token_ids: bool = False  # vLLM extension: prompt_token_ids + token_ids answered

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"only n=1 is supported (got {n}): send separate requests instead")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError("penalties are not supported by this server yet; leave them at 0")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported by this server")
        return v

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        return self

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingRequest):
    prompt: Prompt
    max_tokens: int | None = Field(None, ge=1)  # None = 16, as OpenAI
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported: the prompt is not repeated in the output")
        return v

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError(f"best_of={v} is not supported: send separate requests instead")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported")
        return v


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)  # None = the rest of the context
    max_completion_tokens: int | None = Field(None, ge=1)  # newer name; wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none"] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _some_messages(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("at least one message is required")
        return v

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v:
            raise ValueError("tool calling is not supported by this server")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") != "text":
            raise ValueError("only response_format {'type': 'text'} is supported")
        return v

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """Top alternatives to report per token, None when logprobs are off."""
        return (self.top_logprobs or 0) if self.logprobs else None


R = TypeVar("R", bound=_SamplingRequest)


def _param(loc: tuple[int | str, ...]) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or None


def _message(err: Any, param: str | None) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unsupported field {param!r}: this server does not implement it"
    if err["type"] == "missing":
        return f"{param} is required"
    return f"{param}: {msg}" if param else msg


def parse_request(cls: type[R], body: bytes) -> R:
    """Parse a JSON body, or raise InvalidRequestError naming the first bad field."""
    try:
        return cls.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "json_invalid":
            raise InvalidRequestError(
                f"the request body is not valid JSON ({err['msg']})", param=None
            ) from None
        if err["type"] == "model_type":
            raise InvalidRequestError("the request body must be a JSON object", None) from None
        param = _param(tuple(err["loc"]))
        raise InvalidRequestError(_message(err, param), param=param) from None
