"""The reference side of the C2 parity gate: a plain forward of a whole sequence (prompt +
sampled tokens) in float64, and each sampled token's log-prob under it.

Llama: `transformers`' LlamaForCausalLM in train mode, one forward of the sequence, with its
RMSNorm computing in the model's dtype (it upcasts to float32 otherwise, which caps a float64
comparison near 1e-7); sparse-mla: Loom's own model on one plain sequence (no paging, no
batching).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def float64_rms_norm() -> Iterator[None]:
    """transformers' LlamaRMSNorm computing in its input's dtype (float64 stays float64)."""
    from transformers.models.llama import modeling_llama

    cls = modeling_llama.LlamaRMSNorm
    original = cls.forward

    def forward(self: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    cls.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.forward = original  # type: ignore[method-assign]


def llama_logits(
    checkpoint: Path, ids: Sequence[int], state: Mapping[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """[T, vocab] float64 logits of transformers' forward of `ids` (`state`: weights that replace
    the checkpoint's, e.g. a pushed version)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float64)
    if state is not None:
        model.load_state_dict(dict(state), strict=False)
    model.train()  # a training forward (the tiny model has no dropout: the same numbers)
    with float64_rms_norm(), torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].to(torch.float64)


def sparse_mla_logits(
    checkpoint: Path, ids: Sequence[int], num_prompt: int, batch_invariant: bool = False
) -> torch.Tensor:
    """[T, vocab] float64 logits of Loom's sparse-mla model on one plain sequence (no paging,
    no batching): the prompt in one forward, then each later token in its own, as a sampler
    reads them. (One forward of the whole sequence differs by ~1e-7: the family routes its
    experts in float32, as its reference does, and float32 rounds a one-token matmul and a
    whole-sequence one differently.) `batch_invariant`: the model in batch-invariant mode, as
    a trainer sharing the sampler's invariant kernels runs it — one forward of the whole
    sequence, since then a token's rows round alike in any forward."""
    from loom_runtime.models.sparse_mla.loader import load_sparse_mla

    model = load_sparse_mla(checkpoint, dtype=torch.float64).model
    cache = model.new_cache(len(ids))
    if batch_invariant:
        model.set_batch_invariant(True)
        return model.forward(torch.tensor(list(ids)), cache).to(torch.float64)
    rows = [model.forward(torch.tensor(list(ids[:num_prompt])), cache)]
    rows += [model.forward(torch.tensor([t]), cache) for t in ids[num_prompt:]]
    return torch.cat(rows).to(torch.float64)


def sampled_logprobs(
    logits: torch.Tensor, num_prompt: int, output: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """Each output token's log-prob, log_softmax(logits / temperature), from the forward of
    prompt + output (row num_prompt - 1 + j predicts output token j)."""
    rows = logits[num_prompt - 1 : num_prompt - 1 + len(output)] / temperature
    lp = torch.log_softmax(rows, dim=-1)
    return [float(lp[j, t]) for j, t in enumerate(output)]
