"""The model runner's batch layout: varlen chunks flattened, table slots, logits rows."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from loom_runtime.engine.runner import SERIAL_WORK, ModelRunner, TokenWork
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.cache import KVCacheSpec, PagedKVCache
from loom_runtime.models.batch import ForwardBatch


class EchoModel:
    """Test double of a CausalLM: logits row i is one-hot at the token id of logits index i."""

    def __init__(self, num_parameters: int = 1000) -> None:
        self.seen: list[ForwardBatch] = []
        self.threads: list[int] = []  # torch intra-op threads during each forward
        self.config = SimpleNamespace(num_parameters=num_parameters)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
        self.seen.append(batch)
        self.threads.append(torch.get_num_threads())
        ids = batch.input_ids[batch.logits_indices]
        return torch.nn.functional.one_hot(ids, 16).float()


def make_runner() -> tuple[ModelRunner, EchoModel]:
    model = EchoModel()
    cache = PagedKVCache(KVCacheSpec(1, 1, 2, block_size=4, num_blocks=8))
    return ModelRunner(model, cache), model  # type: ignore[arg-type]


def test_prefill_chunk_and_decode_share_one_forward() -> None:
    runner, model = make_runner()
    prefill = TokenWork("p", (1, 2, 3, 4, 5), 2, BlockTable(block_ids=[6, 3]), want_logits=False)
    decode = TokenWork("d", (9,), 4, BlockTable(block_ids=[0, 5]), want_logits=True)
    out = runner.execute([prefill, decode])
    batch = model.seen[0]
    assert batch.input_ids.tolist() == [1, 2, 3, 4, 5, 9]
    assert batch.positions.tolist() == [2, 3, 4, 5, 6, 4]
    assert batch.query_start == [0, 5, 6]
    assert batch.context_lens == [7, 5]
    assert batch.block_tables == [[6, 3], [0, 5]]
    # position p lives in block_ids[p // 4] at offset p % 4
    assert batch.slot_mapping.tolist() == [26, 27, 12, 13, 14, 20]
    assert batch.logits_indices.tolist() == [5]
    assert out[0] is None and out[1] is not None and int(out[1].argmax()) == 9
    assert runner.tokens_run == 6 and runner.forwards == 1


def test_a_table_too_short_for_the_chunk_is_refused() -> None:
    runner, _ = make_runner()
    with pytest.raises(ValueError, match="need 2 blocks"):
        runner.build_batch([TokenWork("p", (1, 2, 3), 3, BlockTable(block_ids=[1]), True)])


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_forwards_run_on_one_thread_and_large_ones_on_the_pool(two_threads: None) -> None:
    model = EchoModel(num_parameters=SERIAL_WORK // 4)  # 4 tokens or more: the pool
    cache = PagedKVCache(KVCacheSpec(1, 1, 2, block_size=4, num_blocks=8))
    runner = ModelRunner(model, cache)  # type: ignore[arg-type]
    table = BlockTable(block_ids=[0, 1])
    runner.execute([TokenWork("one", (1,), 0, table, want_logits=True)])
    runner.execute([TokenWork("four", (1, 2, 3, 4), 0, table, want_logits=True)])
    runner.execute([TokenWork("one", (5,), 4, table, want_logits=True)])
    assert model.threads == [1, 2, 1]
