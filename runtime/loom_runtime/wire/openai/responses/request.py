"""A /v1/responses request and the chat request it runs as: instructions, the stored history of
`previous_response_id` and the input items become chat messages; function tools, tool_choice and
text.format become chat's tools, tool_choice and response_format.

Owns the Responses request shapes and that translation; never looks a response up (the caller
passes the history) and never builds a response (output.py does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter, ValidationError

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.body import StrictBody
from loom_runtime.wire.openai.field_contract import RESPONSES_AS_CHAT, Endpoint
from loom_runtime.wire.openai.fields import MAX_MESSAGES

MAX_METADATA = 16  # key-value pairs, as OpenAI allows
ChatMessageDict = dict[str, Any]


class TextPart(StrictBody):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # output_text's (none here); accepted as sent back
    logprobs: list[Any] | None = None  # output_text's, when a client sends an output back


class MessageItem(StrictBody):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )


class FunctionCallItem(StrictBody):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(StrictBody):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str
    id: str | None = None
    status: str | None = None


class ReasoningItem(StrictBody):
    """A past response's reasoning, sent back: not rendered (chat templates drop past
    thinking from the history, as they drop chat's reasoning)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
InputItem = Annotated[Item, Field(discriminator="type")]
_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


class FunctionTool(StrictBody):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(StrictBody):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(StrictBody):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # only the default: verbosity is not built


class ResponsesRequest(StrictBody):
    """The fields /v1/responses defines itself; the sampling fields it shares with chat
    (field_contract.RESPONSES) stay in `model_extra` and go to the chat request as sent."""

    ENDPOINT: ClassVar[Endpoint] = "responses"
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA)
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    top_p: float | None = None

    def items(
        self,
    ) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem]:
        """The input as items (a string is one user message); a 400 naming a bad item."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        if len(self.input) > MAX_MESSAGES:
            raise InvalidRequestError(f"input: at most {MAX_MESSAGES} items", param="input")
        raw = [{"type": "message", **i} if "type" not in i else i for i in self.input]
        try:
            return list(_ITEMS.validate_python(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            at = "input" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            raise InvalidRequestError(f"{at}: {err['msg']}", param="input") from None


def chat_messages(items: Sequence[object]) -> list[ChatMessageDict]:
    """Input items as chat messages: a function_call joins the assistant message before it
    (or starts one), a function_call_output is a tool message, reasoning is not rendered."""
    out: list[ChatMessageDict] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last.get("content") or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return out


def conversation(
    req: ResponsesRequest, history: Sequence[ChatMessageDict]
) -> list[ChatMessageDict]:
    """The turns `req` adds to `history` (the stored conversation it continues), without its
    instructions (they are not carried to a later response, as OpenAI's are not)."""
    return [*history, *chat_messages(req.items())]


def chat_body(req: ResponsesRequest, turns: Sequence[ChatMessageDict]) -> dict[str, Any]:
    """The chat request `req` runs as: its instructions, then `turns` (conversation())."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = [*system, *turns]
    if not messages:
        raise InvalidRequestError("input: give at least one item", param="input")
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    body |= {k: v for k, v in (req.model_extra or {}).items() if k in RESPONSES_AS_CHAT}
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [_chat_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        body["response_format"] = _chat_format(fmt)
    return body


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(exclude={"type"}, exclude_none=True)
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # chat judges the value
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequestError(
        f"tool_choice {json.dumps(choice)[:200]}: only auto, none, required or "
        '{"type": "function", "name": ...} (function tools are the only tools here)',
        param="tool_choice",
    )


def _chat_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.name is None or fmt.json_schema is None:
        raise InvalidRequestError(
            "text.format json_schema needs a name and a schema", param="text.format"
        )
    schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.json_schema}
    if fmt.description is not None:
        schema["description"] = fmt.description
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


CHAT_PARAMS = {
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
}
"""A chat error's param, as the Responses request names it."""


def responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    head = param.split("[")[0].split(".")[0]
    return CHAT_PARAMS.get(head, param)
