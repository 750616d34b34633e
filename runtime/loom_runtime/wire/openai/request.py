"""OpenAI request bodies (completions, chat, and vLLM's extension fields) as pydantic models,
parsed into typed errors; fields neither defines are ignored and named, or refused when strict.

Owns the types and ranges of the honoured fields (the value rules are fields.py's; which fields
are honoured, refused or meaningless is field_contract.py's); never touches the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.behaviour import RecordAsk
from loom_runtime.wire.openai.body import StrictBody
from loom_runtime.wire.openai.choices import MAX_N, MAX_SAMPLES
from loom_runtime.wire.openai.field_contract import CONTRACTS, Endpoint, refused_field
from loom_runtime.wire.openai.fields import (
    INT_MAX,
    MAX_LOGPROBS,
    MAX_MESSAGES,
    MAX_STOP_TOKEN_IDS,
    NO_MESSAGES,
    SEED_MAX,
    SEED_MIN,
    logit_bias_value,
    message_content,
    optional_content,
    prompt_value,
    required,
    stop_value,
)
from loom_runtime.wire.openai.structured import (
    GrammarSpec,
    ResponseFormat,
    StructuredOutputs,
    grammar_spec,
)
from loom_runtime.wire.openai.tools import ToolChoice, ToolDef, ToolPlan, tool_plan
from loom_runtime.wire.prompt import call_arguments

Prompts = Annotated[tuple[str | tuple[int, ...], ...], PlainValidator(prompt_value)]
Stop = Annotated[tuple[str, ...], PlainValidator(stop_value)]
Content = Annotated[str, PlainValidator(message_content)]
OptionalContent = Annotated[str | None, PlainValidator(optional_content)]


class StreamOptions(StrictBody):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM extension: usage on every chunk


class CalledFunction(StrictBody):
    name: str
    arguments: str  # JSON text, as the model's call had it


class ToolCall(StrictBody):
    """A call an earlier assistant message made (the history of a tool-calling chat)."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(StrictBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    tool_calls: list[ToolCall] | None = None  # assistant only
    content: OptionalContent = Field(None, validate_default=True)  # null only beside calls
    name: str | None = None
    tool_call_id: str | None = None  # tool only: the call this message answers

    @field_validator("content", mode="after")
    @classmethod
    def _content_unless_calls(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise ValueError(required("content") + " (null only beside an assistant's tool_calls)")
        return v

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls are an assistant message's, not a {self.role}'s")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers")
        for i, call in enumerate(self.tool_calls or ()):
            try:
                call_arguments(call.function.arguments)
            except ValueError as exc:
                raise ValueError(f"tool_calls[{i}].function.arguments: {exc}") from None
        return self


def _some_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    if not messages:
        raise ValueError(NO_MESSAGES)
    return messages


Messages = Annotated[
    list[ChatMessage], Field(max_length=MAX_MESSAGES), AfterValidator(_some_messages)
]
"""A chat's messages: at least one, at most MAX_MESSAGES."""


class _SamplingRequest(StrictBody):
    """Fields shared by completions and chat. Defaults are OpenAI's."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=INT_MAX)  # vLLM extension; 0 or -1 = off
    min_p: float = Field(0.0, ge=0.0, le=1.0)  # vLLM extension; 0 = off
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(1, ge=1, le=MAX_N)  # choices per prompt, each sampled on its own
    stop: Stop = ()
    stop_token_ids: tuple[Annotated[int, Field(ge=0, le=INT_MAX)], ...] = Field(
        (), max_length=MAX_STOP_TOKEN_IDS
    )  # vLLM extension
    ignore_eos: bool = False  # vLLM extension
    min_tokens: int = Field(0, ge=0, le=INT_MAX)  # vLLM extension
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0)  # vLLM extension; 1 = off
    skip_special_tokens: bool = True  # vLLM extension
    spaces_between_special_tokens: bool = True  # vLLM extension
    include_stop_str_in_output: bool = False  # vLLM extension
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None  # token id -> bias in [-100, 100]
    user: str | None = None  # accepted and ignored, as OpenAI does for abuse tracking
    kv_transfer_params: dict[str, Any] | None = None  # P/D (vLLM NixlConnector's object)
    return_token_ids: bool = False  # vLLM extension: prompt_token_ids + token_ids answered
    return_weight_versions: bool = False  # vLLM extension: each choice's weight_versions spans
    return_behaviour: bool = False  # Loom: the behaviour record (wire/openai/behaviour.py)
    response_format: ResponseFormat | None = None  # text, json_object or json_schema
    structured_outputs: StructuredOutputs | None = None  # vLLM extension (structured.py)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return None if v is None else logit_bias_value(v)

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        return self

    @model_validator(mode="after")
    def _one_grammar(self) -> _SamplingRequest:
        grammar_spec(self.response_format, self.structured_outputs)  # a 400 when malformed
        return self

    @property
    def samples(self) -> int:
        """Samples run per prompt: n (completions' best_of may ask for more)."""
        return self.n

    @property
    def record(self) -> RecordAsk:
        """What the client asked of the behaviour record (return_behaviour: all of it)."""
        behaviour = self.return_behaviour
        return RecordAsk(self.return_weight_versions or behaviour, behaviour)

    @property
    def wants_token_ids(self) -> bool:
        """vLLM's return_token_ids, which a behaviour record implies (its sampled ids)."""
        return self.return_token_ids or self.return_behaviour

    @property
    def grammar(self) -> GrammarSpec | None:
        """What the output must match (response_format / structured_outputs), None if free."""
        return grammar_spec(self.response_format, self.structured_outputs)

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats: every chunk carries the usage so far (needs
        include_usage, as in vLLM)."""
        opts = self.stream_options
        return self.include_usage_chunk and opts is not None and opts.continuous_usage_stats


class CompletionRequest(_SamplingRequest):
    ENDPOINT: ClassVar[Endpoint] = "completion"
    prompt: Prompts  # one or more prompts: one choice each, `index` in this order
    max_tokens: int | None = Field(None, ge=0, le=INT_MAX)  # None = 16, as OpenAI; 0 needs echo
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt (and with logprobs its log-probs) before the output
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM extension
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # samples run; the n likeliest returned

    @property
    def samples(self) -> int:
        return self.n if self.best_of is None else self.best_of

    @model_validator(mode="after")
    def _choice_rules(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequestError(
                f"best_of ({self.best_of}) must be at least n ({self.n})", param="best_of"
            )
        if self.samples > self.n and self.stream:
            raise InvalidRequestError(
                "best_of above n cannot be streamed (the kept samples are known only at the "
                "end): send stream false",
                param="best_of",
            )
        if len(self.prompt) * self.samples > MAX_SAMPLES:
            raise InvalidRequestError(
                f"{len(self.prompt)} prompts x {self.samples} samples is more than "
                f"{MAX_SAMPLES} sequences in one request",
                param="best_of" if self.best_of is not None else "n",
            )
        return self

    @model_validator(mode="after")
    def _echo_rules(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError(
                "max_tokens must be >= 1 (0 is allowed only with echo: the prompt alone)",
                param="max_tokens",
            )
        return self

    @property
    def num_prompt_logprobs(self) -> int | None:
        """Top alternatives per prompt token to compute, None when nobody asked: echo with
        logprobs asks for `logprobs` of them, prompt_logprobs for its own count."""
        asked = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None)
                 if k is not None]  # fmt: skip
        return max(asked) if asked else None


class ChatCompletionRequest(_SamplingRequest):
    ENDPOINT: ClassVar[Endpoint] = "chat"
    messages: Messages
    max_tokens: int | None = Field(None, ge=1, le=INT_MAX)  # None = the rest of the context
    max_completion_tokens: int | None = Field(None, ge=1, le=INT_MAX)  # wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None  # None: auto with tools, else none (OpenAI's)
    parallel_tool_calls: bool | None = None  # false: one call at most
    include_reasoning: bool = True  # vLLM extension: false drops the reasoning
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM extension
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM extension: the template's variables

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self) -> ChatCompletionRequest:
        if self.prompt_logprobs is not None and self.stream:
            raise InvalidRequestError(
                "prompt_logprobs is not streamed by Loom on chat: send it with stream false",
                param="prompt_logprobs",
            )
        return self

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatCompletionRequest:
        plan = self.tool_plan  # a 400 when they contradict each other
        if plan.grammar is not None and self.grammar is not None:
            raise InvalidRequestError(
                f"tool_choice {plan.mode!r} holds the output to the call's schema, so "
                f"{self.grammar.param} cannot also constrain it: send one of them",
                param="tool_choice",
            )
        return self

    @property
    def tool_plan(self) -> ToolPlan:
        """How the output is read for tool calls (wire/openai/tools.py)."""
        return tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls)

    @property
    def output_grammar(self) -> GrammarSpec | None:
        """What the output must match: the structured-output fields' or a forced call's."""
        return self.grammar or self.tool_plan.grammar

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


R = TypeVar("R", bound=BaseModel)


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
        return required(str(param))
    return f"{param}: {msg}" if param else msg


def unknown_fields(model: BaseModel, prefix: str = "") -> tuple[str, ...]:
    """Paths of every field in `model` (nested models included) that neither the schema nor
    the endpoint's field contract defines, in body order: ('frobnicate', 'stream_options.x',
    'messages[0].tool_calls')."""
    endpoint: Endpoint | None = getattr(type(model), "ENDPOINT", None)
    contract = {} if endpoint is None else CONTRACTS[endpoint]
    found = [f"{prefix}{key}" for key in (model.model_extra or {}) if key not in contract]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list | tuple) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                at = f"{name}[{i}]" if item is not value else name
                found.extend(unknown_fields(item, f"{prefix}{at}."))
    return tuple(found)


def parse_request(cls: type[R], body: bytes, strict_fields: bool = False) -> R:
    """Parse a JSON body, or raise InvalidRequestError naming the first bad field.

    A field the endpoint's contract refuses (field_contract.py) is an error naming it. Fields
    neither defines are ignored (see `unknown_fields`), as vLLM does; with `strict_fields` the
    first of them is refused instead.
    """
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            f"the request body is not UTF-8 (invalid byte at offset {exc.start})", param=None
        ) from None
    try:
        parsed = cls.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "json_invalid":
            raise InvalidRequestError(
                f"the request body is not valid JSON ({err['msg']})", param=None
            ) from None
        if err["type"] == "model_type" and not err["loc"]:
            raise InvalidRequestError("the request body must be a JSON object", None) from None
        param = _param(tuple(err["loc"]))
        raise InvalidRequestError(_message(err, param), param=param) from None
    endpoint: Endpoint | None = getattr(cls, "ENDPOINT", None)
    refused = None if endpoint is None else refused_field(endpoint, parsed.model_extra or {})
    if refused is not None:
        raise refused
    if strict_fields:
        unknown = unknown_fields(parsed)
        if unknown:
            raise InvalidRequestError(
                f"unsupported field {unknown[0]!r}: this server does not implement it",
                param=unknown[0],
            )
    return parsed
