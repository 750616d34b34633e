"""Token sampling: greedy, temperature, top-k, top-p, seeded draws and logprobs over logits rows.

Owns the arithmetic only; every random draw uses the row's own generator (held in the request's
loop state), never the global RNG, so a token never depends on who shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loom_runtime.engine.types import SamplingParams, TokenLogprob


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: TokenLogprob | None = None  # set when the request asked for logprobs


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own RNG: seeded when the request gives a seed, fresh entropy otherwise."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature == 0.0 or params.top_k == 1


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[SampledToken]:
    """One token per row of `logits` ([N, vocab]); row i uses params[i] and generators[i].

    Greedy rows take the first maximum (argmax); the others draw from the filtered softmax with
    their generator, which a greedy row may leave as None.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(
            f"sample needs [N, vocab] logits with N params and generators, got "
            f"{tuple(logits.shape)}, {len(params)} params, {len(generators)} generators"
        )
    greedy_ids = torch.argmax(logits, dim=-1).tolist() if len(params) else []
    out: list[SampledToken] = []
    for i, (p, gen) in enumerate(zip(params, generators, strict=True)):
        row = logits[i]
        if is_greedy(p):
            token_id = int(greedy_ids[i])
        else:
            if gen is None:
                raise ValueError(
                    f"row {i} samples with temperature {p.temperature}: needs a generator"
                )
            token_id = _draw(row, p, gen)
        lp = token_logprob(row, token_id, p.logprobs) if p.logprobs is not None else None
        out.append(SampledToken(token_id=token_id, logprob=lp))
    return out


def filtered_probs(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax of row / temperature after top-k and top-p filtering ([vocab], sums to 1)."""
    x = row.to(torch.float64) / params.temperature
    vocab = x.shape[0]
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
    return torch.softmax(x, dim=-1)


def _draw(row: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    probs = filtered_probs(row, params)
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
