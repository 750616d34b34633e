"""The LLM engine serves a chat on the MoT's text loop as it does on a llama model: the greedy
reply of `loom://tiny-mot` equals transformers' llama on the same text weights."""

from __future__ import annotations

import json

import torch
from tests.runtime.models.mot.test_ar_parity import transformers_llama

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.mot.tiny import init_tiny_mot

REPLY_TOKENS = 12


def test_the_engine_chats_on_the_tiny_mot_like_transformers_llama(tmp_path) -> None:
    root = init_tiny_mot(tmp_path / "tiny-mot")
    loaded = load_model(root, dtype=torch.float64)
    assert isinstance(loaded.model, MotForCausalLM)
    prompt = loaded.tokenizer.encode_chat([{"role": "user", "content": "Draw me a red fox."}])
    engine = Engine(loaded, EngineConfig(dtype=torch.float64, max_model_len=256, num_blocks=32))
    try:
        sampling = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0, ignore_eos=True)
        reply = engine.generate(prompt, sampling)
    finally:
        engine.shutdown()
    config = json.loads((root / "config.json").read_text())
    hf = transformers_llama(root, config, torch.float64)
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(REPLY_TOKENS):
            tokens.append(int(hf(torch.tensor([tokens])).logits[0, -1].argmax()))
    assert list(reply.output_token_ids) == tokens[len(prompt) :]
    assert reply.text == loaded.tokenizer.decode(list(reply.output_token_ids))
