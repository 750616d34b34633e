"""Request validation at the engine's door: every check that must fail with a 400, not a crash.

Pure checks over an EngineRequest and the engine's limits; never queues or touches state.
"""

from __future__ import annotations

import math

from loom_runtime.engine.types import EngineRequest
from loom_runtime.errors import InvalidRequestError

MAX_LOGPROBS = 20  # vLLM's default max_logprobs


def validate_request(req: EngineRequest, max_model_len: int, vocab_size: int) -> None:
    """Raise InvalidRequestError (with the offending parameter) if the engine cannot serve it."""
    rid, n, p = req.request_id, len(req.prompt_token_ids), req.sampling
    if not rid:
        raise InvalidRequestError("request_id must be non-empty", param="request_id")
    if n == 0:
        raise InvalidRequestError(f"request {rid!r}: the prompt is empty", param="prompt")
    if n > max_model_len - 1:
        raise InvalidRequestError(
            f"request {rid!r}: prompt of {n} tokens exceeds the limit of {max_model_len - 1} "
            f"(max_model_len {max_model_len} minus one generated token); shorten it",
            param="prompt",
        )
    bad = [t for t in req.prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"request {rid!r}: token id {bad[0]} is outside the vocabulary 0..{vocab_size - 1}",
            param="prompt",
        )
    if p.max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be >= 1, got {p.max_tokens}", "max_tokens")
    if n + p.max_tokens > max_model_len:
        raise InvalidRequestError(
            f"request {rid!r}: prompt ({n}) + max_tokens ({p.max_tokens}) exceeds "
            f"max_model_len {max_model_len}; lower max_tokens to at most {max_model_len - n}",
            param="max_tokens",
        )
    if math.isnan(p.temperature) or p.temperature < 0:
        raise InvalidRequestError(f"temperature must be >= 0, got {p.temperature}", "temperature")
    if math.isnan(p.top_p) or not 0 < p.top_p <= 1:
        raise InvalidRequestError(f"top_p must be in (0, 1], got {p.top_p}", "top_p")
    if p.top_k < 0:
        raise InvalidRequestError(f"top_k must be >= 0 (0 = off), got {p.top_k}", "top_k")
    if math.isnan(p.min_p) or not 0 <= p.min_p <= 1:
        raise InvalidRequestError(f"min_p must be in [0, 1] (0 = off), got {p.min_p}", "min_p")
    if not 0 < p.repetition_penalty < math.inf:
        raise InvalidRequestError(
            f"repetition_penalty must be > 0 (1 = off), got {p.repetition_penalty}",
            param="repetition_penalty",
        )
    if not 0 <= p.min_tokens <= p.max_tokens:
        raise InvalidRequestError(
            f"request {rid!r}: min_tokens must be in 0..max_tokens ({p.max_tokens}), got "
            f"{p.min_tokens}; lower min_tokens or raise max_tokens",
            param="min_tokens",
        )
    if p.logprobs is not None and not 0 <= p.logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"logprobs must be in 0..{MAX_LOGPROBS}, got {p.logprobs}", param="logprobs"
        )
    if p.prompt_logprobs is not None and not 0 <= p.prompt_logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"prompt_logprobs must be in 0..{MAX_LOGPROBS}, got {p.prompt_logprobs}",
            param="prompt_logprobs",
        )
    out_of_vocab = [t for t, _ in p.logit_bias if not 0 <= t < vocab_size]
    if out_of_vocab:
        raise InvalidRequestError(
            f"request {rid!r}: logit_bias names token {out_of_vocab[0]}, outside the vocabulary "
            f"0..{vocab_size - 1}",
            param="logit_bias",
        )
    if any(not s for s in p.stop):
        raise InvalidRequestError("stop strings must be non-empty", param="stop")


def check_prompt_logprobs(req: EngineRequest, served: bool) -> None:
    """Prompt log-probs need every prompt position computed here: not on an engine whose forward
    does not return every row (`served` False: MTP, PCP/DCP/DP ranks), and not across P/D (a
    decode pulls the prompt's KV; Loom's router prefills such requests where it decodes)."""
    if req.sampling.prompt_logprobs is None:
        return
    rid = req.request_id
    if not served:
        raise InvalidRequestError(
            f"request {rid!r}: prompt log-probs (prompt_logprobs, or echo with logprobs) are not "
            "served by this worker's forward (MTP speculation or PCP/DCP/DP ranks); send it to "
            "a worker without them",
            param="prompt_logprobs",
        )
    params = req.kv_transfer
    if params is not None and (params.do_remote_decode or params.do_remote_prefill):
        raise InvalidRequestError(
            f"request {rid!r}: prompt log-probs are computed where the prompt is prefilled and "
            "returned by that worker: send the request without kv_transfer_params (Loom's "
            "router prefills such requests on the decode worker)",
            param="kv_transfer_params",
        )
