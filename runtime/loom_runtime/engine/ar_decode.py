"""The autoregressive-decode loop: prefill the prompt, then one token per step until a stop.

Owns the rules that fold a step's result into a request's state (`ar_state.py`: stop tokens and
strings, min_tokens, what text is kept) and what the engine reports of it; never batches or
schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from loom_runtime.engine.ar_state import ARDecodeState, CompletedRequest, TextDecoder
from loom_runtime.engine.grammar.matcher import CompileGrammar, request_grammar
from loom_runtime.engine.runner import TOKEN_FORWARD, TokenWork
from loom_runtime.engine.sampler import (
    SampledToken,
    TokenHistory,
    generator_seed,
    is_greedy,
    make_generator,
)
from loom_runtime.engine.scheduler import RunningSeq, WaitingSeq
from loom_runtime.engine.stop import find_stop, holdback
from loom_runtime.engine.token_forward import TokenResult
from loom_runtime.engine.types import (
    EngineRequest,
    RequestMetrics,
    RequestOutput,
)
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.loop.contract import Done, LoopContext, ResourceRequest, WorkPlan
from loom_runtime.wire.openai.logprobs import TokenLogprob
from loom_runtime.wire.prefix_hash import BlockHash


class ARDecodeLoop:
    """The AR-decode loop over one KV allocator (bound at construction). Its plans are
    TOKEN_FORWARD plans, run by the engine's TokenForward executor.

    Besides the loop contract it offers the engine the KV steps that change a state's blocks
    (admit, grow, preempt) and the views and outputs the engine reads. `new_decoder(prompt ids,
    skip_special_tokens)` makes a request's detokenizer (Tokenizer.incremental_decoder fits).

    With `draft_tokens` k > 0 (MTP speculation) a decode plan verifies up to k drafts after its
    token: it asks for 1 + k tokens of budget and blocks (fewer when max_tokens is near, and a
    split verifies fewer drafts), and its result may emit several tokens.
    """

    kind = "ar_decode"

    def __init__(
        self,
        kv: KVAllocator,
        new_decoder: Callable[[Sequence[int], bool], TextDecoder],
        eos_token_ids: Sequence[int] = (),
        prefix_caching: bool = True,
        on_free: Callable[[str], None] | None = None,
        draft_tokens: int = 0,
        grammars: CompileGrammar | None = None,
    ) -> None:
        """`on_free(request_id)` runs whenever a state's blocks are freed (finish, abort,
        preemption), just before: per-request device state kept beside the blocks goes with
        them (and may still write them). `grammars` compiles a structured output's spec."""
        self.grammars = grammars
        self.kv = kv
        self.on_free = on_free
        self.new_decoder = new_decoder
        self.eos_token_ids = frozenset(eos_token_ids)
        self.prefix_caching = prefix_caching
        self.block_size = kv.block_size
        self.draft_tokens = draft_tokens

    # --- the loop contract ------------------------------------------------------------------

    def init(self, req: EngineRequest, ctx: LoopContext) -> ARDecodeState:
        params = req.sampling
        seed = generator_seed(params)
        gen = None if is_greedy(params) else make_generator(seed)
        tokens = list(req.prompt_token_ids)
        stop_ids = self.eos_token_ids.union(params.stop_token_ids)
        return ARDecodeState(
            request=req,
            ctx=ctx,
            tokens=tokens,
            num_prompt_tokens=len(tokens),
            table=BlockTable(),
            generator=gen,
            decoder=self.new_decoder(req.prompt_token_ids, params.skip_special_tokens),
            history=TokenHistory(tokens, len(tokens), stop_ids),
            arrival_time=req.arrival_time or ctx.clock(),
            prompt_logprobs=None if params.prompt_logprobs is None else [None] * len(tokens),
            grammar=request_grammar(req, self.grammars),
            seed=seed if params.behaviour else None,
        )

    def next(self, state: ARDecodeState) -> WorkPlan[TokenResult] | Done:
        if state.finished:
            return Done(reason=str(state.finish_reason))
        drafts = self._draft_budget(state)
        if drafts:
            return self._verify_plan(state, 1 + drafts)
        return self._plan(state, len(state.tokens) - state.num_computed)

    def advance(self, state: ARDecodeState, result: TokenResult) -> ARDecodeState:
        if result.prompt_logprobs and state.prompt_logprobs is not None:
            first = state.num_computed + 1  # the work's rows score the tokens after its first
            for pos, entry in enumerate(result.prompt_logprobs, first):
                if pos < state.num_prompt_tokens:  # a recompute's output tokens are not scored
                    state.prompt_logprobs[pos] = entry
        for tok in result.drafted:  # accepted drafts: their rows are among num_tokens
            if not state.finished:
                self._append(state, tok)
        state.num_computed += result.num_tokens
        if state.finished:  # a draft ended it: the rows after the stop are not its tokens
            state.num_computed = min(state.num_computed, len(state.tokens))
        if state.num_computed > len(state.tokens):
            raise ValueError(f"request {state.request_id!r}: computed past its tokens")
        if (
            self._caching(state)
            and state.num_computed // self.block_size > state.table.num_committed
        ):
            self.kv.commit(state.table, state.tokens[: state.num_computed])
        if result.sampled is not None and not state.finished:
            self._append(state, result.sampled)
        return state

    def finalize(self, state: ARDecodeState) -> CompletedRequest:
        """Release the blocks and stamp the end; the state must not be run again."""
        self._free(state)
        state.grammar = None  # the matcher goes with the request
        if state.finish_reason is None:
            state.finish_reason = "abort"
        if state.finished_time is None:
            state.finished_time = state.ctx.clock()
        return CompletedRequest(
            request_id=state.request_id,
            prompt_token_ids=tuple(state.tokens[: state.num_prompt_tokens]),
            output_token_ids=tuple(state.tokens[state.num_prompt_tokens :]),
            text=state.text,
            finish_reason=state.finish_reason,
            num_cached_tokens=state.num_cached_tokens or 0,
            logprobs=tuple(state.logprobs),
            weights_version=state.ctx.weights_version,
            metrics=self.metrics(state),
            prompt_logprobs=tuple(state.prompt_logprobs or ()),
            behaviour_logprobs=tuple(state.behaviour_logprobs),
            seed=state.seed,
        )

    # --- plans --------------------------------------------------------------------------------

    def _plan(self, state: ARDecodeState, num_tokens: int) -> WorkPlan[TokenResult]:
        start = state.num_computed
        end = start + num_tokens
        work = TokenWork(
            request_id=state.request_id,
            token_ids=tuple(state.tokens[start:end]),
            start=start,
            table=state.table,
            want_logits=end == len(state.tokens),
            sampling=state.request.sampling,
            generator=state.generator,
            history=state.history,
            next_id=state.tokens[end] if end < len(state.tokens) else None,
            prompt_logprobs=self._prompt_logprobs(state, start),
            grammar=state.grammar,
        )
        decode = num_tokens == 1 and end == len(state.tokens) and end > state.num_prompt_tokens
        new_blocks = max(0, self.kv.blocks_for(end) - len(state.table.block_ids))
        return WorkPlan(
            kind="decode_token" if decode else "prefill_chunk",
            shape=TOKEN_FORWARD,
            resources=ResourceRequest(compute_tokens=num_tokens, cache_blocks=new_blocks),
            work=work,
            split=partial(self._plan, state) if num_tokens > 1 else None,
            request_id=state.request_id,
        )

    @staticmethod
    def _prompt_logprobs(state: ARDecodeState, start: int) -> int | None:
        """A chunk's ask for every row's logits: when it holds prompt tokens and they were asked
        for (a recompute after preemption scores them again, to the same values)."""
        wanted = state.prompt_logprobs is not None and start < state.num_prompt_tokens
        return state.request.sampling.prompt_logprobs if wanted else None

    def _draft_budget(self, state: ARDecodeState) -> int:
        """Drafts a decode step may verify now: up to draft_tokens, and never more tokens than
        max_tokens leaves (0 outside decoding, or with speculation off)."""
        if not self.draft_tokens:
            return 0
        decoding = (
            state.num_computed == len(state.tokens) - 1
            and len(state.tokens) > state.num_prompt_tokens
        )
        left = state.request.sampling.max_tokens - state.num_output_tokens - 1
        return max(0, min(self.draft_tokens, left)) if decoding else 0

    def _verify_plan(self, state: ARDecodeState, num_tokens: int) -> WorkPlan[TokenResult]:
        """A speculative decode: the last token and num_tokens - 1 drafts, proposed and
        verified by the executor (engine/spec/forward.py) in this step."""
        start = state.num_computed
        work = TokenWork(
            request_id=state.request_id,
            token_ids=(state.tokens[start],),
            start=start,
            table=state.table,
            want_logits=True,
            sampling=state.request.sampling,
            generator=state.generator,
            history=state.history,
            draft_tokens=num_tokens - 1,
        )
        new_blocks = max(0, self.kv.blocks_for(start + num_tokens) - len(state.table.block_ids))
        return WorkPlan(
            kind="decode_token",
            shape=TOKEN_FORWARD,
            resources=ResourceRequest(compute_tokens=num_tokens, cache_blocks=new_blocks),
            work=work,
            split=partial(self._verify_plan, state) if num_tokens > 1 else None,
            request_id=state.request_id,
        )

    # --- folding a token in -------------------------------------------------------------------

    def _append(self, state: ARDecodeState, tok: SampledToken) -> None:
        now = state.ctx.clock()
        if state.last_token_time is not None:
            state.inter_token_latencies.append(now - state.last_token_time)
        if state.first_token_time is None:
            state.first_token_time = now
        state.last_token_time = now
        state.tokens.append(tok.token_id)
        if state.grammar is not None:
            state.grammar.accept(tok.token_id)
        if tok.logprob is not None:
            state.logprobs.append(tok.logprob)
        if tok.behaviour_logprob is not None:
            state.behaviour_logprobs.append(tok.behaviour_logprob)
        params = state.request.sampling
        # before min_tokens no stop id ends the request (the sampler masks them, as vLLM)
        stop_token = state.num_output_tokens >= params.min_tokens and (
            tok.token_id in params.stop_token_ids
            or (not params.ignore_eos and tok.token_id in self.eos_token_ids)
        )
        # a stop token's own text is kept only with include_stop_str_in_output (as vLLM)
        detokenize = not stop_token or params.include_stop_str_in_output
        piece = state.decoder.step(tok.token_id) if detokenize else ""
        if self._add_text(state, piece):
            return
        # At the end of the stream a trailing incomplete character still belongs to it.
        stop_token = stop_token or (state.grammar is not None and state.grammar.terminated)
        ends = stop_token or state.num_output_tokens >= params.max_tokens
        if ends and not self._add_text(state, state.decoder.flush()):
            state.finish_reason = "stop" if stop_token else "length"

    def _add_text(self, state: ARDecodeState, piece: str) -> bool:
        """Append detokenized text; on a stop string cut it there (after it, with
        include_stop_str_in_output) and finish. True if stopped.

        As in vLLM, the text of the first min_tokens tokens is never searched: a stop string
        ends the request only if it ends in the text of a later token.
        """
        if not piece:
            return False
        params = state.request.sampling
        searched = len(state.text)
        state.text += piece
        if not params.stop or state.num_output_tokens <= params.min_tokens:
            return False
        found = find_stop(state.text, params.stop, searched)
        if found is None:
            return False
        cut = found.end if params.include_stop_str_in_output else found.start
        state.text = state.text[: max(cut, state.emitted_chars)]
        state.finish_reason = "stop"
        return True

    def abort(self, state: ARDecodeState) -> None:
        if state.finish_reason is None:
            state.finish_reason = "abort"

    # --- KV steps the engine takes ------------------------------------------------------------

    def admission_view(self, state: ARDecodeState) -> WaitingSeq:
        """What admitting this state would cost now: cached tokens and free blocks consumed."""
        n = len(state.tokens)
        if not self._caching(state):
            return WaitingSeq(state.request_id, n, 0, self.kv.blocks_for(n))
        cached, consumed = self.kv.admission_cost(state.tokens, n, self._prompt_hashes(state))
        return WaitingSeq(state.request_id, n, cached, consumed)

    def admit(self, state: ARDecodeState) -> bool:
        """Reserve blocks for all its tokens (taking prefix hits); False changes nothing."""
        n = len(state.tokens)
        if self._caching(state):
            if not self.kv.admit(state.table, state.tokens, n, self._prompt_hashes(state)):
                return False
            state.num_computed = state.table.num_cached_tokens
        else:
            if not self.kv.grow(state.table, n):
                return False
            state.num_computed = 0
        if state.num_cached_tokens is None:
            state.num_cached_tokens = state.num_computed
        if state.scheduled_time is None:
            state.scheduled_time = state.ctx.clock()
        return True

    def reload_now(self, state: ARDecodeState) -> None:
        """Copy a just-admitted state's host-tier prefix on this thread, if it has one (a P/D
        decode's admission: its pull starts after the prefix, so it cannot wait)."""
        job = state.table.reload
        if job is not None and self.kv.host is not None:
            self.kv.host.copy(job)
            self.reloaded(state, copied=True)

    def reloaded(self, state: ARDecodeState, copied: bool) -> None:
        """Its host-tier prefix was copied in (`copied`; else it failed and is recomputed):
        the prefix cache holds it, and computation starts after it."""
        if copied:
            self.kv.finish_reload(state.table, state.tokens)
        else:
            self.kv.abandon_reload(state.table)
        state.num_computed = state.table.num_cached_tokens
        if state.num_preemptions == 0:  # its first admission: these count as cached tokens
            state.num_cached_tokens = state.num_computed

    def running_view(
        self, state: ARDecodeState, plan: WorkPlan[TokenResult], exact_free: bool
    ) -> RunningSeq:
        """The scheduler's view of a running state and its next plan; `exact_free` counts
        unshared blocks (else assumes all are)."""
        held = state.table.block_ids
        pool = self.kv.pool
        freeable = sum(1 for b in held if pool.ref_count(b) == 1) if exact_free else len(held)
        work = plan.work
        return RunningSeq(
            request_id=state.request_id,
            num_new_tokens=plan.resources.compute_tokens,
            context_len=state.num_computed,
            blocks_held=len(held),
            freeable_blocks=freeable,
            num_draft_tokens=work.draft_tokens if isinstance(work, TokenWork) else 0,
            replica=state.table.replica,
        )

    def grow(self, state: ARDecodeState, num_new_tokens: int) -> bool:
        return self.kv.grow(state.table, state.num_computed + num_new_tokens)

    def preempt(self, state: ARDecodeState) -> None:
        """Free its blocks; its output so far is kept and recomputed as prompt on readmission."""
        self._free(state)
        state.num_computed = 0
        state.num_preemptions += 1
        state.stale_kv = False  # recomputed on readmission, under the weights it then runs

    def rebase(self, state: ARDecodeState, version: str) -> None:
        """New weights are in under this state (a keep swap): its next tokens carry `version`;
        KV it already holds was computed under the old weights, so it never enters the prefix
        cache (its blocks were uncached by the swap; later ones attend to them)."""
        state.ctx = replace(state.ctx, weights_version=version)
        if state.num_computed or state.table.block_ids:
            state.stale_kv = True

    def _caching(self, state: ARDecodeState) -> bool:
        """Prefix caching for this state: not for one that asks for prompt log-probs, whose
        every prompt position must be computed (as vLLM skips the cache for them), nor for one
        whose KV is partly of older weights (a keep swap)."""
        return self.prefix_caching and state.prompt_logprobs is None and not state.stale_kv

    def _free(self, state: ARDecodeState) -> None:
        if self.on_free is not None:  # the state beside the blocks goes first (it may write them)
            self.on_free(state.request_id)
        self.kv.free(state.table)

    def _prompt_hashes(self, state: ARDecodeState) -> list[BlockHash]:
        # At least one token must be computed to produce logits: hash below len(tokens).
        full = max(len(state.tokens) - 1, 0) // self.block_size
        if len(state.hashes) < full:
            done = len(state.hashes)
            state.hashes.extend(
                self.kv.hasher.hash_blocks(
                    state.tokens[: full * self.block_size],
                    parent=state.hashes[-1] if done else None,
                    start_block=done,
                    cache_salt=state.table.cache_salt,
                    lora_name=state.table.lora_name,
                )
            )
        return state.hashes[:full]

    # --- what the engine reports --------------------------------------------------------------

    def take_output(self, state: ARDecodeState) -> RequestOutput | None:
        """The increment since the last call; the final one (after finalize) has finished=True.

        While running, text that could be the start of a stop string is held back (unless the
        stop string would be kept in the output anyway, as vLLM does).
        """
        final = state.finished_time is not None
        first_new = state.num_prompt_tokens + state.emitted_tokens
        new_tokens = tuple(state.tokens[first_new:])
        end = len(state.text)
        params = state.request.sampling
        if not final and params.stop and not params.include_stop_str_in_output:
            end = max(state.emitted_chars, end - holdback(state.text, params.stop))
        new_text = state.text[state.emitted_chars : end]
        if not final and not new_tokens and not new_text:
            return None
        new_logprobs = tuple(state.logprobs[state.emitted_tokens :]) if state.logprobs else ()
        behaviour = tuple(state.behaviour_logprobs[state.emitted_tokens :])
        prompt_lps: tuple[TokenLogprob | None, ...] = ()
        sent = state.prompt_logprobs_sent
        if state.prompt_logprobs is not None and not sent and state.first_token_time is not None:
            prompt_lps = tuple(state.prompt_logprobs)  # the whole prompt was computed
            state.prompt_logprobs_sent = True
        state.emitted_tokens += len(new_tokens)
        state.emitted_chars = end
        return RequestOutput(
            request_id=state.request_id,
            new_token_ids=new_tokens,
            new_text=new_text,
            finished=final,
            finish_reason=state.finish_reason if final else None,
            num_prompt_tokens=state.num_prompt_tokens,
            num_cached_tokens=state.num_cached_tokens or 0,
            num_output_tokens=state.num_output_tokens,
            logprobs=new_logprobs,
            prompt_logprobs=prompt_lps,
            weights_version=state.ctx.weights_version,
            behaviour_logprobs=behaviour,
            seed=state.seed,
            metrics=self.metrics(state) if final else None,
            kv_transfer_params=state.kv_transfer_params if final else None,
            transfer_error=state.transfer_error if final else None,
        )

    def metrics(self, state: ARDecodeState) -> RequestMetrics:
        return RequestMetrics(
            arrival_time=state.arrival_time,
            scheduled_time=state.scheduled_time,
            first_token_time=state.first_token_time,
            last_token_time=state.last_token_time,
            finished_time=state.finished_time if state.finished_time is not None else -1.0,
            num_preemptions=state.num_preemptions,
            inter_token_latencies=tuple(state.inter_token_latencies),
        )
