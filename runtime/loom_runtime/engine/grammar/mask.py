"""The batched grammar mask: one bitmask for the step's constrained rows, applied to their
logits in place; rows without a grammar are not touched.

Owns the bitmask layout and its application; never advances a matcher (the loop does, with the
token it got).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from loom_runtime.engine.grammar.matcher import GrammarState

_BITS = 32


def apply_grammar_masks(logits: torch.Tensor, grammars: Sequence[GrammarState | None]) -> None:
    """Set to -inf, in `logits` ([N, vocab]), every id that row i's grammar forbids next; rows
    whose grammar is None keep every bit."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return
    vocab = logits.shape[1]
    bitmask = xgr.allocate_token_bitmask(len(rows), vocab)
    for j, i in enumerate(rows):
        state = grammars[i]
        assert state is not None
        state.fill(bitmask, j)
    allowed = unpack_bitmask(bitmask.to(logits.device), vocab)
    at = torch.tensor(rows, dtype=torch.long, device=logits.device)
    logits[at] = logits[at].masked_fill(~allowed, float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[K, ceil(vocab / 32)] int32 words -> [K, vocab] bool (bit b of word w is id 32w + b)."""
    shifts = torch.arange(_BITS, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
