"""Prompt log-probs come from the prefill: equal to a transformers forward of the same float64
checkpoint (1e-9), the same whether the prompt is prefilled in one chunk or many, beside batch
mates or after its prefix was cached; the sparse-mla family shares the path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from tests.runtime.engine.ranks_config import ranks_config
from tests.runtime.engine.sparse_mla_helpers import inner

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.engine.validate import check_prompt_logprobs
from loom_runtime.errors import InvalidRequestError
from loom_runtime.models.loader import LoadedModel
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.wire.kv_transfer import KVTransferParams
from loom_runtime.wire.openai.logprobs import TokenLogprob

TOL = 1e-9
ROUTER_TOL = 1e-6
"""sparse-mla routes its experts in float32, as transformers does, even in a float64 model: a
prefill chunked differently groups the router's rows differently, and on some CPUs (this AMD EPYC
one) the float32 matmul then rounds them apart (3e-8 measured; docs/rl.md: 1e-8 to 1e-7)."""
Prompt = Callable[[int, int], tuple[int, ...]]


def asked(k: int = 3, max_tokens: int = 2) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, prompt_logprobs=k
    )


def run(engine: Engine, reqs: list[EngineRequest]) -> dict[str, tuple[TokenLogprob | None, ...]]:
    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    while engine.step():
        pass
    return {k: c.result().prompt_logprobs for k, c in got.items()}


def reference(logits: torch.Tensor, prompt: tuple[int, ...]) -> torch.Tensor:
    """[len(prompt) - 1, vocab] log-probs of positions 1.. from a forward's logits."""
    return torch.log_softmax(logits[: len(prompt) - 1].to(torch.float64), dim=-1)


def assert_equal(
    got: tuple[TokenLogprob | None, ...], ref: torch.Tensor, prompt, k: int, tol: float = TOL
) -> None:
    assert len(got) == len(prompt) and got[0] is None
    for pos, entry in enumerate(got[1:], 1):
        assert entry is not None and entry.token_id == prompt[pos]
        row = ref[pos - 1]
        assert abs(entry.logprob - row[prompt[pos]].item()) < tol
        assert entry.rank == int((row > row[prompt[pos]]).sum()) + 1
        top = row.topk(k)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert (
            max(abs(lp - v) for (_, lp), v in zip(entry.top, top.values.tolist(), strict=True))
            < tol
        )


def _rms_norm_in_own_dtype(self: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    variance = h.pow(2).mean(-1, keepdim=True)
    return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(scope="module")
def hf_logits(tiny_dir: Path) -> Iterator[Callable[[tuple[int, ...]], torch.Tensor]]:
    """The float64 transformers forward of the tiny checkpoint. transformers' LlamaRMSNorm
    computes in float32 whatever the model's dtype (its one float32 island: ~1e-7 off a float64
    forward); the reference normalises in the model's dtype, as Loom does, and nothing else of
    the transformers forward changes (RoPE stays float32 in both)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float64)
    model.eval()

    @torch.no_grad()
    def forward(prompt: tuple[int, ...]) -> torch.Tensor:
        return model(torch.tensor([prompt])).logits[0]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms_norm_in_own_dtype)
        yield forward


@pytest.mark.parametrize("budget", [512, 7])  # one chunk; chunks of 7 tokens
def test_prompt_logprobs_equal_a_transformers_forward(
    tiny64: LoadedModel, hf_logits, prompt: Prompt, budget: int
) -> None:
    engine = Engine(tiny64, EngineConfig(dtype=torch.float64, max_model_len=256, num_blocks=64,
                                         max_num_batched_tokens=budget))  # fmt: skip
    p = prompt(41, 3)
    got = run(engine, [EngineRequest("a", p, asked(4))])["a"]
    assert_equal(got, reference(hf_logits(p), p), p, 4)


def test_chunks_batch_mates_and_a_cached_prefix_change_nothing(
    tiny64: LoadedModel, prompt: Prompt
) -> None:
    """Two prompts prefilled side by side in chunks of 9, then the first again (its prefix is in
    the cache: the request still computes every position), equal to each alone in one chunk."""
    p, q = prompt(37, 5), prompt(30, 6)

    def engine(budget: int) -> Engine:
        config = EngineConfig(dtype=torch.float64, max_model_len=256, num_blocks=64,
                              max_num_batched_tokens=budget)  # fmt: skip
        return Engine(tiny64, config)

    alone = {rid: run(engine(512), [EngineRequest(rid, ids, asked())])[rid]
             for rid, ids in (("p", p), ("q", q))}  # fmt: skip
    small = engine(9)
    together = run(small, [EngineRequest("p", p, asked()), EngineRequest("q", q, asked())])
    again = run(small, [EngineRequest("p2", p, asked())])["p2"]
    for got, want in (
        (together["p"], alone["p"]),
        (together["q"], alone["q"]),
        (again, alone["p"]),
    ):
        assert [e and (e.token_id, [t for t, _ in e.top], e.rank) for e in got] == [
            e and (e.token_id, [t for t, _ in e.top], e.rank) for e in want
        ]
        values = [(a.logprob, *(lp for _, lp in a.top), b.logprob, *(lp for _, lp in b.top))
                  for a, b in zip(got[1:], want[1:], strict=True) if a and b]  # fmt: skip
        half = len(values[0]) // 2
        assert max(abs(v[i] - v[i + half]) for v in values for i in range(half)) < TOL


def test_a_request_without_them_gets_none(tiny64: LoadedModel, prompt: Prompt) -> None:
    engine = Engine(tiny64, EngineConfig(dtype=torch.float64, max_model_len=256, num_blocks=64))
    plain = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    assert run(engine, [EngineRequest("a", prompt(20, 1), plain)])["a"] == ()


def test_sparse_mla_prompt_logprobs_equal_its_one_sequence_forward(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    """The sparse-mla family on the same path: equal to its one-sequence forward (the path its
    model tests prove equal to transformers), prefilled in chunks of 6."""
    engine = Engine(sparse64, EngineConfig(dtype=torch.float64, max_model_len=128, num_blocks=32,
                                           max_num_batched_tokens=6))  # fmt: skip
    p = prompt(23, 8)
    got = run(engine, [EngineRequest("a", p, asked(2))])["a"]
    model = inner(sparse64)
    logits = model.forward(torch.tensor(p), model.new_cache(len(p)))
    assert_equal(got, reference(logits, p), p, 2, ROUTER_TOL)


def test_prompt_logprobs_across_pd_or_on_an_unfit_forward_are_refused() -> None:
    req = EngineRequest("a", (1, 2, 3), asked())
    check_prompt_logprobs(req, served=True)
    with pytest.raises(InvalidRequestError, match="MTP"):
        check_prompt_logprobs(req, served=False)
    pd = EngineRequest("b", (1, 2, 3), asked(), kv_transfer=KVTransferParams(do_remote_decode=True))
    with pytest.raises(InvalidRequestError, match="kv_transfer_params") as err:
        check_prompt_logprobs(pd, served=True)
    assert err.value.param == "kv_transfer_params"


def test_tp2_ranks_give_the_one_rank_prompt_logprobs(
    tiny_dir: Path, tiny64: LoadedModel, prompt: Prompt
) -> None:
    """TP ranks return every row the leader asks for: chunked (96-token budget), the values are
    the one-rank engine's."""
    p = prompt(130, 9)
    one = Engine(tiny64, ranks_config(ParallelLayout()))
    try:
        want = run(one, [EngineRequest("a", p, asked())])["a"]
    finally:
        one.shutdown()
    tp = Engine.from_checkpoint(tiny_dir, ranks_config(ParallelLayout(tp=2)))
    try:
        got = run(tp, [EngineRequest("a", p, asked())])["a"]
    finally:
        tp.shutdown()
    assert [e and (e.token_id, e.rank) for e in got] == [e and (e.token_id, e.rank) for e in want]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(got[1:], want[1:], strict=True)
               if a and b) < TOL  # fmt: skip


def test_an_engine_on_pcp_ranks_refuses_them(sparse_dir: Path) -> None:
    """PCP/DCP/DP ranks return the rows they are built for, not every row: a clear 400."""
    engine = Engine.from_checkpoint(sparse_dir, ranks_config(ParallelLayout(pcp=2)))
    try:
        with pytest.raises(InvalidRequestError, match="ranks") as err:
            engine.add_request(EngineRequest("a", (1, 2, 3), asked()), lambda out: None)
        assert err.value.param == "prompt_logprobs"
    finally:
        engine.shutdown()
