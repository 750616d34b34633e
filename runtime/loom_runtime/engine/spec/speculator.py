"""MTP speculative decoding of one sequence over contiguous caches: the MTP layer drafts k
tokens, the trunk verifies them in one forward, the verdict keeps the output exact.

Owns one sequence's draft–verify rounds and its statistics; never batches (the engine's batched
path is checked against this one) and never decides acceptance (engine/spec/accept.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from loom_runtime.engine.spec.accept import Verdict, accept_greedy, accept_sampled
from loom_runtime.models.sparse_mla.cache import SparseMlaCache
from loom_runtime.models.sparse_mla.hooks import LocalHooks
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM


class SequenceDrafter(Protocol):
    """Proposes the tokens after the sequence so far; told what the trunk committed."""

    def extend(self, normed: torch.Tensor, next_ids: list[int], start: int) -> None:
        """The trunk committed tokens at positions start.. with final-normed states `normed`
        ([m, hidden]); `next_ids` are the m tokens after each of them."""
        ...

    def propose(self, k: int) -> list[int]:
        """k drafts for the positions after the last committed token's successor."""
        ...


class MtpDrafter:
    """The model's first MTP layer, with its own cache: committed rows for every position the
    trunk committed, plus scratch rows for drafts 2..k, dropped after each proposal."""

    def __init__(self, model: SparseMlaForCausalLM, capacity: int) -> None:
        if not model.mtp:
            raise ValueError("the checkpoint has no MTP layer (num_nextn_predict_layers is 0)")
        self.model = model
        self.layer = model.mtp[0]
        self.cache: SparseMlaCache = model.new_mtp_cache(capacity)
        self._last: torch.Tensor | None = None  # the MTP output at the last committed position

    def extend(self, normed: torch.Tensor, next_ids: list[int], start: int) -> None:
        if start != self.cache.length:
            raise ValueError(f"MTP rows hold {self.cache.length} positions, extend at {start}")
        ids = torch.tensor(next_ids, dtype=torch.long, device=self.model.device)
        positions = torch.arange(start, start + len(next_ids), device=self.model.device)
        out = self.layer.forward(normed, ids, positions, LocalHooks(self.cache))
        self.cache.advance(len(next_ids))
        self._last = out[-1:]

    def propose(self, k: int) -> list[int]:
        if self._last is None:
            raise ValueError("propose before any committed position")
        committed = self.cache.length
        hidden, drafts = self._last, []
        for j in range(k):
            drafts.append(int(torch.argmax(self.layer.logits(hidden)[-1])))
            if j + 1 < k:  # the next draft reads this one from a scratch row
                pos = torch.tensor([committed + j], device=self.model.device)
                ids = torch.tensor([drafts[-1]], dtype=torch.long, device=self.model.device)
                hidden = self.layer.forward(hidden, ids, pos, LocalHooks(self.cache))
                self.cache.advance(1)
        self.cache.truncate(committed)
        return drafts


@dataclass
class SpecStats:
    """Per verify step, how many drafts it kept (vLLM's acceptance counts, per position too)."""

    num_draft_tokens: int
    accepted: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step (accepted drafts + the target's own), as vLLM reports."""
        return 1.0 + sum(self.accepted) / max(1, self.steps)

    def accepted_per_position(self) -> list[int]:
        """How often draft j (0-based) was kept."""
        return [sum(1 for a in self.accepted if a > j) for j in range(self.num_draft_tokens)]


@dataclass(frozen=True)
class SpecOutput:
    token_ids: tuple[int, ...]
    stats: SpecStats


class MtpSpeculator:
    """Greedy (temperature 0) or sampled speculative decoding of one sequence."""

    def __init__(
        self,
        model: SparseMlaForCausalLM,
        num_draft_tokens: int,
        capacity: int,
        drafter: SequenceDrafter | None = None,
    ) -> None:
        if num_draft_tokens < 1:
            raise ValueError(f"numDraftTokens must be at least 1, got {num_draft_tokens}")
        self.model = model
        self.k = num_draft_tokens
        self.capacity = capacity
        self.drafter = drafter or MtpDrafter(model, capacity)

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        gen: torch.Generator | None = None,
    ) -> SpecOutput:
        """`max_new_tokens` tokens after `prompt` (no stop tokens: the caller cuts them)."""
        if temperature > 0.0 and gen is None:
            raise ValueError("sampled speculative decoding needs a generator")
        cache = self.model.new_cache(self.capacity)
        stats = SpecStats(self.k)
        normed = self._forward(prompt, cache)
        out = [self._pick(self.model.head(normed[-1:])[0], temperature, gen)]
        self.drafter.extend(normed, [*prompt[1:], out[0]], 0)
        while len(out) < max_new_tokens:
            k = min(self.k, max_new_tokens - len(out))
            drafts = self.drafter.propose(k)
            start = cache.length  # the position of out[-1], whose KV is not cached yet
            normed = self._forward([out[-1], *drafts], cache)
            verdict = self._verdict(drafts, self.model.head(normed), temperature, gen)
            cache.truncate(start + 1 + verdict.accepted)
            stats.accepted.append(verdict.accepted)
            self.drafter.extend(normed[: verdict.accepted + 1], list(verdict.tokens), start)
            out.extend(verdict.tokens)
        return SpecOutput(tuple(out[:max_new_tokens]), stats)

    def _forward(self, ids: list[int], cache: SparseMlaCache) -> torch.Tensor:
        """The trunk over `ids` after the cache's tokens; their final-normed states."""
        cache.check_room(len(ids))
        tokens = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        positions = torch.arange(cache.length, cache.length + len(ids), device=self.model.device)
        hidden = self.model.hidden_states(tokens, positions, LocalHooks(cache))
        cache.advance(len(ids))
        return self.model.normed(hidden)

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> int:
        if temperature <= 0.0 or gen is None:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen).item())

    @staticmethod
    def _verdict(
        drafts: list[int], logits: torch.Tensor, temperature: float, gen: torch.Generator | None
    ) -> Verdict:
        if temperature <= 0.0 or gen is None:
            return accept_greedy(drafts, torch.argmax(logits, dim=-1).tolist())
        probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
        return accept_sampled(drafts, probs, gen)
