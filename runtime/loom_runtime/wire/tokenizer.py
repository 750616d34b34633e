"""A checkpoint's tokenizer (tokenizer.json + tokenizer_config.json) and streaming detokenization.

Wraps `tokenizers` and the chat template; never touches model weights or KV.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from loom_runtime.errors import CheckpointError, InvalidRequestError
from loom_runtime.wire.chat_template import ChatTemplate

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
# Tokens of context kept before the newest emitted text, so decoders that look at neighbours
# (e.g. SentencePiece's leading-space rule) render the delta the same as the whole text.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Tokenizer:
    """Text <-> token ids, chat prompts, and the ids that end a generation."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: Mapping[str, str | None],
        chat_template: ChatTemplate | None,
        extra_eos_token_ids: Sequence[int] = (),
    ) -> None:
        self._backend = backend
        self.special_tokens = dict(special_tokens)
        self.chat_template = chat_template
        eos = self.token_id(special_tokens.get("eos_token"))
        ids = ([] if eos is None else [eos]) + [i for i in extra_eos_token_ids if i != eos]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))
        self.bos_token_id = self.token_id(special_tokens.get("bos_token"))

    @classmethod
    def from_dir(cls, path: str | Path, extra_eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json and chat_template.jinja (if present) from a
        checkpoint directory (or from the directory of a given tokenizer.json)."""
        root = Path(path)
        if root.is_file():
            root = root.parent
        file = root / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(
                f"{file} is missing: Loom needs a fast (tokenizer.json) tokenizer"
            )
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise CheckpointError(f"{file} cannot be loaded: {exc}") from exc
        config = read_json_object(root / "tokenizer_config.json")
        special = {key: _token_text(config.get(key)) for key in SPECIAL_TOKEN_KEYS}
        source = _template_source(root, config)
        template = None if source is None else ChatTemplate(source, special)
        return cls(backend, special, template, extra_eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def vocabulary(self) -> list[str]:
        """Every id's vocabulary string, in id order (what a grammar engine indexes)."""
        backend = self._backend
        return [backend.id_to_token(i) or "" for i in range(self.vocab_size)]

    def backend_json(self) -> str:
        """The tokenizer.json this tokenizer was loaded from (its model type and decoders)."""
        return str(self._backend.to_str())

    def token_id(self, token: str | None) -> int | None:
        """The id of a token string, or None if it is not in the vocabulary."""
        return None if token is None else self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id's vocabulary string (HF's convert_ids_to_tokens), "" for an unknown id."""
        return [self._backend.id_to_token(i) or "" for i in ids]

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for a chat; InvalidRequestError on a malformed message. `extra`: the
        request's chat_template_kwargs."""
        if self.chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template; send a plain prompt to /v1/completions",
                param="messages",
            )
        return self.chat_template.render(messages, add_generation_prompt, tools, extra)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a chat prompt. The template writes BOS itself, so none is added here."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools, extra)
        return self.encode(text, add_special_tokens=False)

    def incremental_decoder(
        self, context: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> IncrementalDecoder:
        """A per-request streaming decoder; `context` = ids that precede the stream (the prompt)."""
        return IncrementalDecoder(self, context, skip_special_tokens)


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas that never split a character.

    A delta is emitted only once the text decodes without a trailing replacement character,
    so a UTF-8 character spread over several byte-level tokens arrives whole. The pieces from
    `step` plus `flush` concatenate to `decode(all ids)`. Keeps only a few tokens of state.
    """

    def __init__(
        self, tokenizer: Tokenizer, context: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(context[-_CONTEXT_TOKENS:])
        self._read = len(self._ids)  # ids before this index have been emitted (or are context)
        self._prefix_text = self._decode(self._ids)

    def step(self, token_id: int) -> str:
        """Add one token; return the newly completed text ("" while a character is incomplete)."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """Whatever is left at the end of the stream, even an incomplete character."""
        text = self._decode(self._ids)
        return self._emit(text) if len(text) > len(self._prefix_text) else ""

    def _emit(self, text: str) -> str:
        delta = text[len(self._prefix_text) :]
        # The tokens just emitted become the context of the next delta.
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)


def read_json_object(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file as a dict ({} when absent); CheckpointError when unreadable."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """Special tokens are saved as a string or as an AddedToken dict with 'content'."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_source(root: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # older format: named templates
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None
