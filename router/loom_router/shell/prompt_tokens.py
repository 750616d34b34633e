"""The prompt's token ids as the engine will see them, for the precise prefix scorer.

Owns loading the checkpoint's tokenizer (tokenizer.json, tokenizer_config.json, chat template)
and rendering prompts the way the runtime does; never tokenizes for migration (that replays the
worker's own ids) and never raises on a prompt it cannot render (it answers None: the worker
validates requests, the router only routes them). Calls are CPU-bound: run them in a thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from loom_router.errors import RouterConfigError

logger = logging.getLogger(__name__)

_SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")
MAX_PROMPT_CHARS = 4 << 20
"""Longer prompts are not tokenized by the router (the worker refuses them anyway)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class PromptTokenizer:
    """Token ids of completion prompts and chat messages, like the runtime's tokenizer."""

    def __init__(self, path: Path) -> None:
        root = path if path.is_dir() else path.parent
        file = path if path.is_file() else root / "tokenizer.json"
        try:
            self._backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise RouterConfigError(f"tokenizer_path: cannot load {file}: {exc}") from exc
        config = _read_json(root / "tokenizer_config.json")
        self._special = {key: _token_text(config.get(key)) for key in _SPECIAL}
        self._template = _compile(_template_source(root, config))

    def completion_ids(self, prompt: Any) -> list[int] | None:
        """A completion prompt's ids: token ids as given, text encoded with special tokens."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
            return list(prompt)
        if isinstance(prompt, str) and 0 < len(prompt) <= MAX_PROMPT_CHARS:
            return list(self._backend.encode(prompt, add_special_tokens=True).ids)
        return None

    def chat_ids(self, messages: Any) -> list[int] | None:
        """A chat's ids: the template rendered with a generation prompt, encoded without
        special tokens (the template writes BOS itself); None if it cannot be rendered."""
        if self._template is None or not isinstance(messages, list) or not messages:
            return None
        plain = [_message(m) for m in messages]
        if any(m is None for m in plain):
            return None
        try:
            text = self._template.render(
                **self._special, messages=plain, add_generation_prompt=True, tools=None
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            logger.debug("chat template rejected the messages: %s", exc)
            return None
        if len(text) > MAX_PROMPT_CHARS:
            return None
        return list(self._backend.encode(text, add_special_tokens=False).ids)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _message(message: Any) -> dict[str, Any] | None:
    """A message as the runtime hands it to the template (text parts joined), or None."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        return None
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, Mapping) else None for p in content]
        if not all(isinstance(p, str) for p in parts):
            return None
        content = "".join(str(p) for p in parts)
    if not isinstance(content, str):
        return None
    out: dict[str, Any] = {"role": message["role"], "content": content}
    if isinstance(message.get("name"), str) and message["name"]:
        out["name"] = message["name"]
    return out


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise RouterConfigError(f"tokenizer_path: {path} is not readable JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _template_source(root: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text("utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile(source: str | None) -> jinja2.Template | None:
    if source is None:
        return None
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        logger.warning("chat template does not compile; chats are routed by text: %s", exc)
        return None
