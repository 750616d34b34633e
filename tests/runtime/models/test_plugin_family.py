"""The model-family registry is real: a family defined only here — its registration and a
two-layer model — is served through the engine (greedy tokens equal a plain recomputing forward),
through P/D (the decode continues from pulled KV with the aggregated tokens) and through `loom up`
with a prefill and a decode worker, while no file under runtime/, operator/ or router/ names it.

This module is also the plugin: `LOOM_PLUGINS=<this file>` makes every process `loom up` starts
load `LOOM_FAMILIES` from it (module-level code here only defines; nothing registers on import).
"""

from __future__ import annotations

import json
import math
import os
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from tests.runtime.pd.engine_workers import Workers, run, wait_for, whole

from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import run_fleet
from loom_runtime.card import families
from loom_runtime.card.errors import CardError
from loom_runtime.card.families import Family
from loom_runtime.card.load import parse_card
from loom_runtime.card.model_card import ModelCard
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.kv.cache import KVCacheSpec, KVStore, PagedKVCache
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.attention import paged_attention, plan_attention
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.family import FamilyRuntime
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny_files import random_weights, write_checkpoint
from loom_runtime.models.tiny_tokenizer import train_tiny_tokenizer
from loom_runtime.models.weights import copy_weights
from loom_runtime.testing import processes
from loom_runtime.testing.processes import WORKER_ENV, scrape
from loom_runtime.wire.kv_transfer import KVTransferParams
from loom_runtime.wire.metric_names import KV_PULLED_TOKENS

NAME = "two-layer-toy"
MODEL_TYPE = "two_layer_toy"
ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class ToyConfig:
    """Learned positions, two attention + GELU-MLP layers, no norms, no RoPE."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    hidden_size: int = 64
    num_heads: int = 4
    num_layers: int = 2
    max_position_embeddings: int = 1024
    model_type: str = MODEL_TYPE

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_parameters(self) -> int:
        h, v = self.hidden_size, self.vocab_size
        return 2 * v * h + self.max_position_embeddings * h + self.num_layers * 12 * h * h

    def kv_spec(
        self,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        fp8: Fp8Format | None = None,
    ) -> KVCacheSpec:
        return KVCacheSpec(
            self.num_layers, self.num_heads, self.head_dim, block_size, num_blocks, dtype, fp8
        )

    @classmethod
    def parse(
        cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None, where: str
    ) -> ToyConfig:
        return cls(vocab_size=int(raw["vocab_size"]), eos_token_ids=tuple(raw["eos_token_id"]))


class ToyModel:
    """The CausalLM protocol over the paged KV cache, weights as plain tensors."""

    def __init__(self, config: ToyConfig, dtype: torch.dtype, device: str | torch.device) -> None:
        self.config = config
        h, v = config.hidden_size, config.vocab_size

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.weights = {"embed": zeros(v, h), "pos": zeros(config.max_position_embeddings, h)}
        self.weights["head"] = zeros(v, h)
        for i in range(config.num_layers):
            for name, shape in (("qkv", (3 * h, h)), ("o", (h, h)), ("up", (4 * h, h))):
                self.weights[f"layers.{i}.{name}"] = zeros(*shape)
            self.weights[f"layers.{i}.down"] = zeros(h, 4 * h)

    @property
    def dtype(self) -> torch.dtype:
        return self.weights["embed"].dtype

    @property
    def device(self) -> torch.device:
        return self.weights["embed"].device

    def forward(self, batch: ForwardBatch, kv: KVStore) -> torch.Tensor:
        assert isinstance(kv, PagedKVCache)
        c, w = self.config, self.weights
        plan = plan_attention(batch, kv.spec.block_size, self.device)
        x = F.embedding(batch.input_ids, w["embed"]) + F.embedding(batch.positions, w["pos"])
        for i in range(c.num_layers):
            q, k, v = (
                t.view(-1, c.num_heads, c.head_dim)
                for t in F.linear(x, w[f"layers.{i}.qkv"]).chunk(3, dim=-1)
            )
            scale = c.head_dim**-0.5
            attn = paged_attention(q, k, v, kv, i, plan, batch.slot_mapping, scale)
            x = self._mlp(i, x + F.linear(attn.flatten(1), w[f"layers.{i}.o"]))
        logits = F.linear(x.index_select(0, batch.logits_indices), w["head"])
        return logits if logits.dtype == torch.float64 else logits.float()

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        w = self.weights
        return x + F.linear(F.gelu(F.linear(x, w[f"layers.{i}.up"])), w[f"layers.{i}.down"])

    def reference_logits(self, tokens: list[int]) -> torch.Tensor:
        """The last position's logits by plain causal attention over the whole sequence."""
        c, w = self.config, self.weights
        ids = torch.tensor(tokens, device=self.device)
        x = F.embedding(ids, w["embed"]) + F.embedding(torch.arange(len(tokens)), w["pos"])
        mask = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
        for i in range(c.num_layers):
            q, k, v = (
                t.view(-1, c.num_heads, c.head_dim).transpose(0, 1)
                for t in F.linear(x, w[f"layers.{i}.qkv"]).chunk(3, dim=-1)
            )
            scores = (q @ k.transpose(1, 2)) / math.sqrt(c.head_dim)
            attn = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = self._mlp(i, x + F.linear(attn.transpose(0, 1).flatten(1), w[f"layers.{i}.o"]))
        return F.linear(x[-1], w["head"])

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        copy_weights(self.weights, tensors, MODEL_TYPE, strict)


def write_toy_checkpoint(root: Path, seed: int = 0) -> Path:
    tiny = train_tiny_tokenizer()
    eos = [tiny.im_end_id, tiny.end_of_text_id]
    config = ToyConfig(vocab_size=tiny.vocab_size, eos_token_ids=tuple(eos))
    shapes = {n: tuple(t.shape) for n, t in ToyModel(config, torch.float32, "cpu").weights.items()}
    raw = {"model_type": MODEL_TYPE, "vocab_size": tiny.vocab_size, "eos_token_id": eos}
    return write_checkpoint(root, raw, random_weights(shapes, seed, 0.2), tiny, eos, "toy\n")


TOY = Family(
    name=NAME,
    model_types=(MODEL_TYPE,),
    loops=("ar_decode",),
    runtime=FamilyRuntime(read_config=ToyConfig.parse, build=ToyModel),
    attention="gqa",
)
LOOM_FAMILIES = (TOY,)


CARD = processes.CARD.format(name="toy", path="/nowhere").replace(
    "family: llama", f"family: {NAME}"
)


@pytest.fixture
def toy() -> Iterator[Family]:
    with families.registered(TOY) as family:
        yield family


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_toy_checkpoint(tmp_path_factory.mktemp("toy"))


def test_no_file_of_loom_names_the_family() -> None:
    for package in ("runtime", "operator", "router"):
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yaml", ".json", ".md", ".txt"):
                text = path.read_text("utf-8", errors="replace")
                assert NAME not in text and MODEL_TYPE not in text, path


def test_an_unregistered_family_is_refused_with_the_registered_ones_named() -> None:
    with pytest.raises(CardError, match=rf"no model family '{NAME}' \(registered: llama,"):
        parse_card(ModelCard, yaml.safe_load(CARD))


def test_the_card_takes_the_family_once_registered(toy: Family) -> None:
    assert parse_card(ModelCard, yaml.safe_load(CARD)).spec.family == NAME


def test_the_engine_serves_it_token_identical_to_a_plain_forward(
    toy: Family, checkpoint: Path
) -> None:
    config = EngineConfig(dtype=torch.float64, block_size=16, max_model_len=256, num_blocks=64)
    engine = Engine.from_checkpoint(checkpoint, config)
    reference = load_model(checkpoint, dtype=torch.float64).model
    assert isinstance(reference, ToyModel)
    prompt = [5, 17, 300, 42, 7, 99, 1000, 3] * 5  # 40 tokens: three blocks, one partial
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    out = engine.generate(prompt, greedy).output_token_ids
    tokens = list(prompt)
    for _ in range(12):
        tokens.append(int(reference.reference_logits(tokens).argmax()))
    assert list(out) == tokens[len(prompt) :]
    assert engine.generate(prompt, greedy).output_token_ids == out  # from the prefix cache
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_pd_decode_continues_from_pulled_kv_with_the_aggregated_tokens(
    toy: Family, checkpoint: Path
) -> None:
    workers = Workers(load_model(checkpoint, dtype=torch.float64))
    try:
        aggregated, _ = workers.engine()
        prefill, _ = workers.engine("prefill", block_size=32)
        decode, _ = workers.engine("decode", block_size=16)
        prompt = tuple(range(20, 120))
        expected = run(aggregated, "a", prompt, 8).result().output_token_ids
        final = run(prefill, "p", prompt, 1, KVTransferParams.for_prefill()).outputs[-1]
        assert final.kv_transfer_params is not None
        answer = KVTransferParams.parse(final.kv_transfer_params.to_dict())
        assert run(decode, "d", prompt, 8, answer).result().output_token_ids == expected
        assert decode.stats().kv_pulled_tokens == len(prompt) - 1
        wait_for(lambda: whole(prefill) and whole(decode), "both pools to be whole")
    finally:
        workers.close()


@pytest.mark.slow
def test_loom_up_serves_it_over_prefill_and_decode_workers(
    checkpoint: Path, tmp_path: Path
) -> None:
    text = card_text(f"file://{checkpoint}", name="toy", roles={"prefill": 1, "decode": 1})
    card = tmp_path / "card.yaml"
    card.write_text(text.replace("family: llama", f"family: {NAME}"))
    env = {
        **os.environ,
        **WORKER_ENV,
        "LOOM_CACHE": str(tmp_path / "cache"),
        families.PLUGINS_ENV: str(Path(__file__).resolve()),
    }
    with run_fleet(card, tmp_path / "state", env) as fleet:
        body = {"model": "tiny", "prompt": "hello toy", "max_tokens": 8, "temperature": 0}
        request = urllib.request.Request(
            f"{fleet.endpoint}/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            reply = json.loads(resp.read())
        assert reply["usage"]["completion_tokens"] == 8
        status = fleet.status()
        assert status is not None
        decode = next(w for w in status.workers if w.role == "decode")
        pulled = scrape(f"http://{decode.address}")
        assert any(k.startswith(KV_PULLED_TOKENS) and v > 0 for k, v in pulled.items()), pulled
