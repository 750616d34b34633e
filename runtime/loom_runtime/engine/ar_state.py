"""One autoregressive request's state as the AR-decode loop keeps it: tokens, sampling
params, seeded generator, KV block table, text, log-probs, timestamps and grammar — and the whole
result it ends with.

Owns these records; never changes them (only `ARDecodeLoop` in ar_decode.py does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from loom_runtime.engine.grammar.matcher import GrammarState
from loom_runtime.engine.sampler import TokenHistory
from loom_runtime.engine.transfer_port import TransferParams
from loom_runtime.engine.types import EngineRequest, FinishReason, RequestMetrics
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.loop.contract import LoopContext
from loom_runtime.wire.openai.logprobs import TokenLogprob
from loom_runtime.wire.prefix_hash import BlockHash


class TextDecoder(Protocol):
    """Per-request incremental detokenizer (models.tokenizer.IncrementalDecoder fits)."""

    def step(self, token_id: int) -> str:
        """The text a new token completes ("" while a character is still incomplete)."""
        ...

    def flush(self) -> str:
        """Whatever text is left at the end of the stream."""
        ...


@dataclass(frozen=True)
class CompletedRequest:
    """The whole result of one request (what `finalize` and `Engine.generate` return)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    num_cached_tokens: int
    logprobs: tuple[TokenLogprob, ...]
    weights_version: str
    metrics: RequestMetrics
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # when asked: one per prompt token
    behaviour_logprobs: tuple[float, ...] = ()  # with a behaviour record: one per output token
    seed: int | None = None  # with a behaviour record: the generator's seed (None: greedy)


@dataclass(eq=False)
class ARDecodeState:
    """Everything one request owns. Mutated only by ARDecodeLoop methods; compared by identity."""

    request: EngineRequest
    ctx: LoopContext
    tokens: list[int]  # prompt, then output
    num_prompt_tokens: int
    table: BlockTable
    generator: torch.Generator | None
    decoder: TextDecoder
    history: TokenHistory  # what the sampler looks back at: `tokens` itself, and the stop ids
    num_computed: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int | None = None  # prefix hits at first admission
    text: str = ""  # detokenized output, cut at a stop string (after it, when included)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)  # with a behaviour record
    seed: int | None = None  # the generator's seed, when a behaviour record reports it
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt position, when asked
    prompt_logprobs_sent: bool = False
    finish_reason: FinishReason | None = None
    emitted_tokens: int = 0
    emitted_chars: int = 0
    arrival_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    inter_token_latencies: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    hashes: list[BlockHash] = field(default_factory=list)  # memo of full-block prefix hashes
    kv_transfer_params: TransferParams | None = None  # P/D prefill: the lease it answers with
    transfer_error: str | None = None  # P/D decode: why the request failed (policy "fail")
    grammar: GrammarState | None = None  # structured output: the matcher (None: free text)
    stale_kv: bool = False  # KV computed under older weights (a keep swap): never prefix-cached

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
