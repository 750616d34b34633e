"""Token sampling over logits rows: repetition penalty, logit_bias, min_tokens, greedy,
temperature, min-p/top-k/top-p, seeded draws and logprobs.

Owns the arithmetic only; every random draw uses the row's own generator and every look back
reads the row's own TokenHistory (both held in the request's loop state), never global state,
so a token never depends on who shares the batch.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from loom_runtime.engine.types import SamplingParams
from loom_runtime.wire.openai.logprobs import TokenLogprob


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: TokenLogprob | None = None  # set when the request asked for logprobs
    behaviour_logprob: float | None = None
    """With a behaviour record (SamplingParams.behaviour): the token's log-prob under the exact
    distribution it was drawn from (`processed_logprob`); 0.0 for a greedy pick."""


@dataclass(frozen=True)
class TokenHistory:
    """What a row's request has produced, for the rules that look back (repetition_penalty,
    min_tokens). `token_ids` is the loop state's own live list, read when the row is sampled."""

    token_ids: Sequence[int] = field(repr=False)  # prompt, then output
    num_prompt_tokens: int
    stop_token_ids: frozenset[int] = frozenset()  # EOS and the request's stop_token_ids

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own RNG: seeded when the request gives a seed, fresh entropy otherwise."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def generator_seed(params: SamplingParams) -> int | None:
    """The seed of a request's generator: its own, or, when a behaviour record must report one
    and it gave none, a fresh one in [0, 2**63) (so it can be sent back as `seed`); None for
    fresh entropy (or a greedy request, which draws nothing)."""
    if is_greedy(params):
        return None
    if params.seed is None and params.behaviour:
        return secrets.randbelow(2**63)
    return params.seed


SAMPLING_EPS = 1e-5
"""Temperatures below this are greedy, as in vLLM: dividing by a denormal one overflows the
logits to inf and the softmax to NaN."""


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < SAMPLING_EPS or params.top_k == 1


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    histories: Sequence[TokenHistory | None] | None = None,
) -> list[SampledToken]:
    """One token per row of `logits` ([N, vocab]); row i uses params[i], generators[i] and
    histories[i] (None: no look back; repetition_penalty and min_tokens then do nothing).

    Each row is first adjusted (`adjusted_logits`); greedy rows take its first maximum (argmax),
    the others draw from its filtered softmax with their generator, which a greedy row may leave
    as None. Logprobs are of the raw logits, as vLLM's default (raw_logprobs); a behaviour
    record's log-prob is of the distribution the token was drawn from.
    """
    if histories is None:
        histories = [None] * len(params)
    if (
        logits.dim() != 2
        or logits.shape[0] != len(params)
        or not len(params) == len(generators) == len(histories)
    ):
        raise ValueError(
            f"sample needs [N, vocab] logits with N params, generators and histories, got "
            f"{tuple(logits.shape)}, {len(params)} params, {len(generators)} generators, "
            f"{len(histories)} histories"
        )
    greedy_ids = torch.argmax(logits, dim=-1).tolist() if len(params) else []
    out: list[SampledToken] = []
    for i, (p, gen, history) in enumerate(zip(params, generators, histories, strict=True)):
        row = logits[i]
        x = adjusted_logits(row, p, history)
        behaviour: float | None = None
        if is_greedy(p):
            token_id = int(greedy_ids[i]) if x is row else int(torch.argmax(x))
            behaviour = 0.0 if p.behaviour else None  # drawn with certainty
        else:
            if gen is None:
                raise ValueError(
                    f"row {i} samples with temperature {p.temperature}: needs a generator"
                )
            kept = filtered_logits(x, p)
            token_id = _draw(torch.softmax(kept, dim=-1), gen)
            if p.behaviour:
                behaviour = processed_logprob(kept, token_id)
        lp = token_logprob(row, token_id, p.logprobs) if p.logprobs is not None else None
        out.append(SampledToken(token_id=token_id, logprob=lp, behaviour_logprob=behaviour))
    return out


def adjusted_logits(
    row: torch.Tensor, params: SamplingParams, history: TokenHistory | None
) -> torch.Tensor:
    """The row greedy and sampling both read: vLLM's repetition penalty over every id seen so
    far (prompt and output), the request's logit_bias added, and under min_tokens the stop ids
    masked. `row` itself (not a copy) when none applies, so the defaults change nothing."""
    penalty = 1.0 if history is None else params.repetition_penalty
    masked = [] if history is None else min_tokens_masked(params, history, row.shape[0])
    if penalty == 1.0 and not masked and not params.logit_bias:
        return row
    x = row.clone()
    if penalty != 1.0 and history is not None and history.token_ids:
        seen = torch.tensor(sorted(set(history.token_ids)), dtype=torch.long, device=row.device)
        values = x[seen]
        x[seen] = torch.where(values > 0, values / penalty, values * penalty)
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        at = torch.tensor(ids, dtype=torch.long, device=row.device)
        x[at] += torch.tensor(biases, dtype=x.dtype, device=row.device)
    if masked:
        x[torch.tensor(masked, dtype=torch.long, device=row.device)] = float("-inf")
    return x


def min_tokens_masked(params: SamplingParams, history: TokenHistory, vocab: int) -> list[int]:
    """The ids the next token may not be: EOS and the stop ids while fewer than min_tokens
    tokens were generated (vLLM masks EOS even under ignore_eos)."""
    if history.num_output_tokens >= params.min_tokens:
        return []
    return sorted(t for t in history.stop_token_ids if t < vocab)


def filtered_probs(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax of row / temperature after min-p, top-k and top-p filtering ([vocab], sums to
    1): the distribution a sampled token is drawn from."""
    return torch.softmax(filtered_logits(row, params), dim=-1)


def processed_logprob(kept: torch.Tensor, token_id: int) -> float:
    """A token's log-prob under the softmax of `kept` (filtered_logits' row): with temperature
    1 and no filter it is the raw log_softmax, with temperature T log_softmax(logits / T)."""
    return float(torch.log_softmax(kept, dim=-1)[token_id])


def filtered_logits(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """row / temperature in float64 with the tokens min-p, top-k and top-p drop set to -inf;
    min-p keeps the tokens whose probability is at least min_p times the top one's."""
    x = row.to(torch.float64) / params.temperature
    vocab = x.shape[0]
    if params.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
        drop_sorted = before >= params.top_p
        drop_sorted[0] = False  # the most likely token always survives
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    if probs.device != gen.device:
        probs = probs.to(gen.device)
    return int(torch.multinomial(probs, 1, generator=gen).item())


def token_logprob(row: torch.Tensor, token_id: int, top_n: int) -> TokenLogprob:
    """Logprob of the chosen token and the top_n alternatives, from the raw logits' log_softmax."""
    lp = torch.log_softmax(row.to(torch.float64), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        values, ids = torch.topk(lp, min(top_n, lp.shape[0]))
        top = tuple((int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id=token_id, logprob=float(lp[token_id]), top=top)
