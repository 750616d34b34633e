"""The engine's boundary records: what a request asks for and what the engine reports back.

Frozen dataclasses only; the server builds them from HTTP bodies and reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from loom_runtime.engine.transfer_port import TransferParams
from loom_runtime.wire.openai.logprobs import TokenLogprob
from loom_runtime.wire.openai.structured import GrammarSpec

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and render them; vLLM's SamplingParams semantics. temperature 0 is
    greedy; seed makes sampling reproducible. Every default changes nothing."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # drop tokens with prob < min_p * the top prob (after temperature); 0 = off
    repetition_penalty: float = 1.0  # over prompt + output ids: logit>0 divided, <0 multiplied
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS/stop ids masked and stop strings unmatched until this many tokens
    include_stop_str_in_output: bool = False  # keep the matched stop string (or stop token's text)
    skip_special_tokens: bool = True  # False: the text keeps special tokens
    logprobs: int | None = None  # number of top alternatives to report per token, None = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits
    prompt_logprobs: int | None = None  # top alternatives per prompt token's logprob, None = off
    grammar: GrammarSpec | None = None  # structured output: what the output must match
    behaviour: bool = False
    """A behaviour record: each output token's log-prob under the exact distribution it was
    drawn from (temperature, min-p/top-k/top-p, logit_bias, penalties and the grammar mask
    applied; 0.0 for a greedy pick), and the seed of the request's generator."""


@dataclass(frozen=True)
class DrawSpec:
    """A think-then-draw request's image half (engine/draw.py checks and seeds it): latents
    [C, height, width] from seeded noise, denoised in `num_steps` Euler steps that attend to
    the text KV its AR loop left."""

    height: int  # latent pixels, a positive multiple of the model's patch size
    width: int
    num_steps: int
    seed: int = 0  # the noise's generator seed


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0  # time.monotonic() at arrival; 0: when add_request is called
    kv_transfer: TransferParams | None = None  # P/D instructions (see engine/remote.py)
    shares_prompt_of: str | None = None
    """Another request of the same prompt (n > 1): this one waits until that one's prompt KV
    is computed, then takes its full blocks from the prefix cache instead of prefilling them."""
    draw: DrawSpec | None = None
    """The think-then-draw program: after its AR loop ends (EOS or max_tokens) the request's
    denoise loop draws conditioned on that loop's KV (engine/denoise_lane.py). None: text only."""


@dataclass(frozen=True)
class RequestMetrics:
    """When things happened to one request, in `time.monotonic()` seconds; on the final output.

    The server turns these into vLLM's latency histograms (TTFT, inter-token, e2e, queue,
    prefill, decode). Recomputed tokens after a preemption are not new tokens: they add no
    inter-token latency.
    """

    arrival_time: float
    scheduled_time: float | None  # first admission (end of queueing)
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float
    num_preemptions: int = 0
    inter_token_latencies: tuple[float, ...] = ()  # between consecutive output tokens

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled_time is None else self.scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def prefill_time(self) -> float | None:
        if self.first_token_time is None or self.scheduled_time is None:
            return None
        return self.first_token_time - self.scheduled_time

    @property
    def decode_time(self) -> float | None:
        if self.first_token_time is None or self.last_token_time is None:
            return None
        return self.last_token_time - self.first_token_time

    @property
    def e2e_latency(self) -> float:
        return self.finished_time - self.arrival_time


@dataclass(frozen=True)
class RequestOutput:
    """One increment of a request's result; the last one has finished=True."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_output_tokens: int = 0  # total generated so far
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # final output: one per prompt token
    weights_version: str = ""  # the weights that generated this increment's tokens
    behaviour_logprobs: tuple[float, ...] = ()  # with a behaviour record: one per new token
    seed: int | None = None  # with a behaviour record: the generator's seed (None: greedy)
    metrics: RequestMetrics | None = None  # set on the final output only
    kv_transfer_params: TransferParams | None = None  # final output of a P/D prefill: the lease
    transfer_error: str | None = None  # final output of a decode whose KV pull failed ("fail")
    latents: torch.Tensor | None = None  # final output of a think-then-draw: the image latents


@dataclass(frozen=True)
class RankKVStats:
    """What one rank of a parallel engine holds (engine/ranks/ranked_runner.py)."""

    rank: int
    kv_bytes_per_token: int  # bytes of one token's rows where a rank keeps them (all layers)
    kv_tokens: int  # tokens whose rows this rank holds now (a DCP rank: its share)
    kv_bytes: int  # those rows' bytes, in whole blocks per sequence
    sequences: int  # live sequences on the rank
    device_kv_bytes: int = 0  # HiSparse ranks: their sequences' device keys and hot buffers


@dataclass(frozen=True)
class SpecDecodeStats:
    """vLLM's spec-decode counters: verify steps that had drafts, drafts proposed, drafts
    accepted, and how often draft position j was accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    def add(self, proposed: int, accepted: int) -> SpecDecodeStats:
        per_pos = list(self.accepted_per_pos)
        for j in range(accepted):
            per_pos[j] += 1
        return SpecDecodeStats(
            self.num_drafts + 1,
            self.num_draft_tokens + proposed,
            self.num_accepted_tokens + accepted,
            tuple(per_pos),
        )

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verify step emits on average (accepted drafts + the target's own)."""
        return 1.0 + self.num_accepted_tokens / max(1, self.num_drafts)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and the control service."""

    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks in use, 0..1
    num_blocks: int
    num_free_blocks: int
    block_size: int
    admission_open: bool
    weights_version: str
    num_preemptions: int = 0
    prefill_backlog_tokens: int = 0  # prompt tokens of queued and running requests not yet computed
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of those, tokens found
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests, once each (counter)
    num_prompt_tokens_arrived: int = 0  # prompt tokens of requests as they arrive (counter)
    num_generation_tokens: int = 0  # output tokens generated (counter)
    num_tokens_computed: int = 0  # tokens run through the model (prefill + decode + recompute)
    num_requests_finished: int = 0  # finished with stop or length (vllm:request_success)
    num_requests_aborted: int = 0
    num_kv_leases: int = 0  # prefill: KV leases waiting for a remote decode to pull them
    num_kv_pulls: int = 0  # decode: requests waiting for blocks to pull into, or pulling
    kv_expired: int = 0  # prefill: leases that expired unpulled (counter)
    kv_transfer_failures: int = 0  # decode: pulls that failed (counter)
    kv_pulled_tokens: int = 0  # decode: prompt tokens whose KV came from a prefill (counter)
    kv_pulled_bytes: int = 0  # decode: KV bytes pulled from prefills (counter)
    drains: int = 0  # drains completed: admission closed until idle (counter)
    drain_seconds: float = 0.0  # seconds those drains took (counter)
    last_drain_seconds: float = 0.0  # how long the latest completed drain took
    kv_cache_bytes: int = 0  # bytes of this rank's KV pool (every block, used or free)
    kv_bytes_per_token: int = 0  # KV bytes one cached token costs on this rank, all layers
    kv_offload_capacity_bytes: int = 0  # CPU KV offload: bytes of the host tier (0: off)
    kv_offload_used_bytes: int = 0  # of those, bytes holding blocks now
    kv_offloaded_blocks: int = 0  # evicted device blocks copied to the host tier (counter)
    kv_reload_tokens: int = 0  # prompt tokens reloaded from the host tier, not recomputed
    kv_reload_bytes: int = 0  # bytes copied back from the host tier (counter)
    hisparse_host_pool_bytes: int = 0  # HiSparse: bytes of the host pool of latent rows (0: off)
    hisparse_hot_hits: int = 0  # decode-selected rows found in a hot buffer (counter)
    hisparse_hot_misses: int = 0  # decode-selected rows copied in from the host pool (counter)
    hisparse_resident_rows: int = 0  # decode-selected rows computed in the same step (counter)
    hisparse_h2d_bytes: int = 0  # bytes of those misses' host -> device copies (counter)
    hisparse_prefill_h2d_bytes: int = 0  # prefill chunks' one-step host -> device bytes (counter)
    hisparse_keys_h2d_bytes: int = 0  # pulled or reloaded blocks' keys host -> device (counter)
    hisparse_hot_requests: int = 0  # requests holding a hot buffer now
    ranks: tuple[RankKVStats, ...] = ()  # a parallel engine's ranks (none on one rank)
    spec: SpecDecodeStats | None = None  # MTP speculation's counters (None: speculation off)
