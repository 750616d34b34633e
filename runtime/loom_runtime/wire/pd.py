"""The P/D two-step's request bodies (docs/pd.md): exactly vLLM's disaggregated-serving contract.

Owns rewriting a client's body into the prefill step's and the decode step's; never sends one,
never picks workers and never judges a prefill's answer (the router does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from loom_runtime.wire.kv_transfer import FIELD, KVTransferParams

PDMode = Literal["remote-prefill", "local-prefill"]


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """Step 1: the client's request as a non-streamed one-token prefill for a remote decode.

    A min_tokens above 1 becomes 1 (it must not exceed max_tokens, and the prefill's token is
    never sent: the decode samples its own); n and best_of go (the prefill answers one lease;
    the decode samples every choice from the one prompt KV it pulls); any other value is left
    for the prefill to judge as the decode would.
    """
    out = dict(body)
    out[FIELD] = KVTransferParams.for_prefill().to_dict()
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    min_tokens = out.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens > 1:
        out["min_tokens"] = 1
    out.pop("stream_options", None)
    out.pop("return_token_ids", None)
    out.pop("n", None)
    out.pop("best_of", None)
    return out


def decode_body(body: Mapping[str, Any], params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Step 2: the client's original request plus the prefill's `kv_transfer_params` (None or
    empty: the decode prefills locally, and any params the client sent are dropped)."""
    out = dict(body)
    if params:
        out[FIELD] = dict(params)
    else:
        out.pop(FIELD, None)
    return out


def several_prompts(body: Mapping[str, Any]) -> bool:
    """A /v1/completions body with a list of more than one prompt (one choice each): it is
    prefilled where it is decoded, and its stream cannot resume elsewhere once started."""
    prompt = body.get("prompt")
    return (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(p, str | list) for p in prompt)
    )


def several_choices(body: Mapping[str, Any]) -> bool:
    """A body answered with more than one choice (several prompts, or n above 1): its streamed
    choices interleave, so a stream cannot resume elsewhere once started."""
    n = body.get("n")
    return several_prompts(body) or (isinstance(n, int) and not isinstance(n, bool) and n > 1)


def prefilled_where_decoded(body: Mapping[str, Any]) -> bool:
    """Whether a body skips the remote prefill (the router and the test proxy alike): several
    prompts (one KV lease answers one prompt), or prompt log-probs, on completions or chat
    (prompt_logprobs, or echo with logprobs: the logits are where the prompt is prefilled, and a
    decode that pulls the KV has none)."""
    echoed = body.get("echo") is True and body.get("logprobs") is not None
    return several_prompts(body) or echoed or body.get("prompt_logprobs") is not None
