"""What the router knows about a request when it picks: `RequestFeatures`, and how to build them.

Owns turning prompt tokens or text into index keys; never tokenizes or parses HTTP (the shell
does) and never routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loom_router.core.approx_index import CHARS_PER_TOKEN, text_keys
from loom_router.core.kv_events import index_key
from loom_runtime.wire.prefix_hash import PrefixHasher


@dataclass(frozen=True)
class RequestFeatures:
    """The routing-relevant facts of one request. Plain data: hashing is done before picking."""

    request_id: str
    prompt_tokens: int
    """Prompt length in tokens (estimated from the text when not tokenized)."""
    block_keys: tuple[int, ...] = ()
    """Engine block hashes of the prompt's full blocks (index keys), for the precise index."""
    text_keys: tuple[int, ...] = ()
    """Text block keys, for the approximate index."""
    session_token: str | None = None
    weights_version: str | None = None
    """Only endpoints on this version (a migrated request continues on its version)."""
    exclude: frozenset[str] = frozenset()
    """Endpoints not to use (the one a migrated request failed on)."""


def features_from_tokens(
    request_id: str,
    token_ids: Sequence[int],
    hasher: PrefixHasher,
    *,
    text: str | None = None,
    cache_salt: str | None = None,
    lora_name: str | None = None,
    session_token: str | None = None,
    weights_version: str | None = None,
    exclude: Iterable[str] = (),
) -> RequestFeatures:
    """Features of a tokenized prompt, its blocks hashed exactly as the engine hashes them.

    Costs one SHA-256 per full block (about 10 µs): call it off the event loop for long prompts.
    """
    hashes = hasher.hash_blocks(token_ids, cache_salt=cache_salt, lora_name=lora_name)
    return RequestFeatures(
        request_id=request_id,
        prompt_tokens=len(token_ids),
        block_keys=tuple(index_key(h) for h in hashes),
        text_keys=text_keys(text) if text is not None else (),
        session_token=session_token,
        weights_version=weights_version,
        exclude=frozenset(exclude),
    )


def features_from_text(
    request_id: str,
    text: str,
    *,
    session_token: str | None = None,
    weights_version: str | None = None,
    exclude: Iterable[str] = (),
) -> RequestFeatures:
    """Features of an untokenized prompt (approximate scoring): ~4 characters per token."""
    return RequestFeatures(
        request_id=request_id,
        prompt_tokens=-(-len(text) // CHARS_PER_TOKEN),
        text_keys=text_keys(text),
        session_token=session_token,
        weights_version=weights_version,
        exclude=frozenset(exclude),
    )
