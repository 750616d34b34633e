"""Prompt log-probs: from one prefill chunk's logits rows, each prompt token's log-prob under
the rows before it, and its top alternatives (vLLM's prompt_logprobs, OpenAI's echo).

Owns the arithmetic over one chunk's rows ([chunk tokens, vocab]: the peak is that block and its
log-softmax, never the whole prompt's); never picks rows (the runner does) nor keeps state.
"""

from __future__ import annotations

import torch

from loom_runtime.engine.runner import TokenWork
from loom_runtime.wire.openai.logprobs import TokenLogprob


def chunk_prompt_logprobs(work: TokenWork, rows: torch.Tensor) -> tuple[TokenLogprob, ...]:
    """Log-probs of the tokens at positions work.start + 1 .. (one per row whose next token is
    known: the chunk's own tokens after the first, then work.next_id), raw logits (no temperature
    or penalties, as vLLM), in the rows' precision (float64 for a float64 model)."""
    k = work.prompt_logprobs
    if k is None:
        raise ValueError(f"request {work.request_id!r}: its work asks for no prompt log-probs")
    targets = list(work.token_ids[1:])
    if work.next_id is not None:
        targets.append(work.next_id)
    if not targets:
        return ()
    dtype = torch.float64 if rows.dtype == torch.float64 else torch.float32
    logp = torch.log_softmax(rows[: len(targets)].to(dtype), dim=-1)
    index = torch.tensor(targets, dtype=torch.long, device=logp.device).unsqueeze(1)
    chosen_t = logp.gather(1, index)
    ranks = (logp > chosen_t).sum(dim=-1).add(1).tolist()
    chosen = chosen_t.squeeze(1).tolist()
    if k > 0:
        top_lp, top_ids = logp.topk(k, dim=-1)
        tops = [
            tuple(zip(i, v, strict=True))
            for i, v in zip(top_ids.tolist(), top_lp.tolist(), strict=True)
        ]
    else:
        tops = [()] * len(targets)
    return tuple(
        TokenLogprob(t, lp, top, rank)
        for t, lp, top, rank in zip(targets, chosen, tops, ranks, strict=True)
    )
