"""The model runner: turns scheduled token work into one ForwardBatch and runs the model on it.

Owns batch layout (varlen prefill chunks and decode tokens flattened, slots, logits rows);
never decides what runs, never samples, and never changes a block table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from loom_runtime.engine.grammar.matcher import GrammarState
from loom_runtime.engine.sampler import TokenHistory
from loom_runtime.engine.types import SamplingParams
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.cache import KVStore
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.causal_lm import CausalLM

SERIAL_WORK = 64_000_000
"""Multiply-adds (tokens × parameters) below which a CPU forward runs on one thread: waking
another thread for each of its few hundred small ops costs more than it saves, and the thread
is better left to the server's event loop (bench/engine.py, single stream of the tiny model)."""

TOKEN_FORWARD = "token_forward"
"""Shape signature of every plan the runner can fold into one forward."""


@dataclass(frozen=True)
class TokenWork:
    """One sequence's share of a forward: run `token_ids` at positions start.. of the sequence.

    `table` is the owning loop state's live block table (read when the batch is built, after
    the scheduler grew it). `want_logits` asks for the last token's logits row, from which
    the step's one sampler draws with `sampling`, the state's own `generator` (None when
    greedy) and its `history` (the tokens so far). The runner itself reads none of them.

    With MTP speculation (engine/spec/forward.py) a decode work asks for up to `draft_tokens`
    drafts after its one token, and every work names the token after its chunk (`next_id`)
    when the loop knows it: the MTP layer's row at a position reads the next token.
    """

    request_id: str
    token_ids: tuple[int, ...]
    start: int
    table: BlockTable
    want_logits: bool
    sampling: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)
    history: TokenHistory | None = field(default=None, repr=False, compare=False)
    draft_tokens: int = 0  # a speculative decode: drafts to propose after token_ids' one token
    next_id: int | None = None  # the token after the last of token_ids, when already known
    prompt_logprobs: int | None = None  # every row's logits wanted (top alternatives to report)
    grammar: GrammarState | None = field(default=None, repr=False, compare=False)  # its mask

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


class TokenRunner(Protocol):
    """What executes a step's token works: ModelRunner in this process, TpRunner or
    RankedRunner on a worker's ranks (engine/ranks/)."""

    tokens_run: int

    def execute(self, works: Sequence[TokenWork]) -> list[torch.Tensor | None]: ...


class ModelRunner:
    """Runs one CausalLM over its paged KV cache. Counts what it ran (tokens, forwards)."""

    def __init__(self, model: CausalLM, cache: KVStore) -> None:
        self.model = model
        self.cache = cache
        self.block_size = cache.spec.block_size
        self.device = model.device
        self.tokens_run = 0  # tokens pushed through the model since construction
        self.forwards = 0
        self._pool_threads = torch.get_num_threads()
        self._params = model.config.num_parameters

    def set_threads(self, num_tokens: int) -> None:
        """CPU: a forward too small to share (see SERIAL_WORK) runs on one intra-op thread."""
        if self.device.type != "cpu" or self._pool_threads == 1:
            return
        want = 1 if num_tokens * self._params < SERIAL_WORK else self._pool_threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def build_batch(self, works: Sequence[TokenWork]) -> ForwardBatch:
        return build_forward_batch(works, self.block_size, self.device)

    @torch.inference_mode()
    def execute(self, works: Sequence[TokenWork]) -> list[torch.Tensor | None]:
        """One forward over all `works`; per work its logits (see logits_per_work) or None."""
        batch = self.build_batch(works)
        self.set_threads(batch.num_tokens)
        logits = self.model.forward(batch, self.cache)
        self.tokens_run += batch.num_tokens
        self.forwards += 1
        return logits_per_work(works, logits)


def logits_per_work(works: Sequence[TokenWork], logits: torch.Tensor) -> list[torch.Tensor | None]:
    """Per work its rows of a forward's logits (in the order build_forward_batch asked for
    them): the last token's row ([vocab]) if it wants one, every token's ([n, vocab]) if it
    asks for prompt log-probs, else None."""
    out: list[torch.Tensor | None] = []
    at = 0
    for w in works:
        if w.prompt_logprobs is not None:
            n = len(w.token_ids)
            out.append(logits[at : at + n])
            at += n
        elif w.want_logits:
            out.append(logits[at])
            at += 1
        else:
            out.append(None)
    return out


def build_forward_batch(
    works: Sequence[TokenWork], block_size: int, device: torch.device
) -> ForwardBatch:
    """The works as one forward: their tokens flattened, slots from their block tables."""
    if not works:
        raise ValueError("a forward batch needs at least one TokenWork")
    bs = block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    context_lens: list[int] = []
    tables: list[list[int]] = []
    logits_rows: list[int] = []
    for w in works:
        n = len(w.token_ids)
        if n == 0:
            raise ValueError(f"request {w.request_id!r}: TokenWork with no tokens")
        num_blocks = -(-w.end // bs)
        if num_blocks > len(w.table.block_ids):
            raise ValueError(
                f"request {w.request_id!r}: tokens up to {w.end} need {num_blocks} blocks, "
                f"table holds {len(w.table.block_ids)}"
            )
        table = w.table.block_ids[:num_blocks]
        ids.extend(w.token_ids)
        # plain ints: a decode step's few tokens cost less than building tensors per work
        span = range(w.start, w.end)
        positions.extend(span)
        slots.extend(table[p // bs] * bs + p % bs for p in span)
        query_start.append(query_start[-1] + n)
        context_lens.append(w.end)
        tables.append(table)
        if w.prompt_logprobs is not None:  # every row: the prompt's log-probs, chunk by chunk
            logits_rows.extend(range(query_start[-2], query_start[-1]))
        elif w.want_logits:
            logits_rows.append(query_start[-1] - 1)
    dev = device
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
        positions=torch.tensor(positions, dtype=torch.long, device=dev),
        query_start=query_start,
        context_lens=context_lens,
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
        logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=dev),
        request_ids=tuple(w.request_id for w in works),
    )
