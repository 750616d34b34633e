"""The tokenizer wrapper: round trips, chat templates like transformers, streaming that never
splits a character."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loom_runtime.errors import InvalidRequestError
from loom_runtime.models.tiny_tokenizer import SPECIAL_TOKENS
from loom_runtime.wire.tokenizer import Tokenizer

TEXTS = [
    "The lighthouse keeper counted the steps.",
    "naïve café, Grüße, ¿Cómo estás?",
    "こんにちは世界 and 你好 🙂🦜👩‍💻 ∑√∞",
    "  leading spaces\n\ttabs and\r\nnewlines  ",
    "",
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo 🙂"},
    {"role": "assistant", "content": "Hi."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
    },
]


@pytest.fixture(scope="module")
def tok(tiny_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.encode(text) == [tok.bos_token_id, *ids]


def test_vocabulary_and_special_ids(tok: Tokenizer) -> None:
    assert 4000 <= tok.vocab_size <= 8192
    assert tok.eos_token_ids == (tok.token_id("<|im_end|>"),)
    assert tok.bos_token_id == tok.token_id("<|begin_of_text|>")
    assert tok.decode([tok.bos_token_id, *tok.encode("x", False)]) == "x"
    with_bos = [tok.bos_token_id, *tok.encode("x", False)]
    assert tok.decode(with_bos, skip_special_tokens=False) == "<|begin_of_text|>x"


def test_chat_template_renders_like_transformers(tok: Tokenizer, tiny_dir) -> None:
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    hf_chat = [*CHAT[:3], {"role": "user", "content": "two\nparts"}]
    for gen_prompt in (True, False):
        text = tok.apply_chat_template(CHAT, add_generation_prompt=gen_prompt)
        assert text == hf.apply_chat_template(
            hf_chat, tokenize=False, add_generation_prompt=gen_prompt
        )
    expected_ids = hf.apply_chat_template(hf_chat, tokenize=True, add_generation_prompt=True)
    if isinstance(expected_ids, dict) or hasattr(expected_ids, "input_ids"):
        expected_ids = expected_ids["input_ids"]
    ids = tok.encode_chat(CHAT)
    assert ids == list(expected_ids)
    assert ids.count(tok.bos_token_id) == 1
    assert tok.apply_chat_template(CHAT).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hello", "messages"),
        ([{"content": "no role"}], "messages[0]"),
        (["not an object"], "messages[0]"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content",
        ),
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "beep"}], "messages"),
        ([{"role": "user", "content": "x", "extra": object()}], "messages[0].extra"),
    ],
)
def test_bad_messages_are_invalid_requests(tok: Tokenizer, messages, param) -> None:
    with pytest.raises(InvalidRequestError) as info:
        tok.apply_chat_template(messages)
    assert info.value.param == param


def test_template_cannot_escape_the_sandbox(tiny_dir, tmp_path) -> None:
    shutil.copytree(tiny_dir, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "chat_template.jinja").write_text(
        "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    )
    tok = Tokenizer.from_dir(tmp_path / "ckpt")
    with pytest.raises(InvalidRequestError):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_file_and_missing_template(tiny_dir, tmp_path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, root)
    (root / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}|{{ m.content | tojson }}]{% endfor %}"
    )
    tok = Tokenizer.from_dir(root)
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == '[user|"é"]'
    (root / "chat_template.jinja").unlink()
    config = json.loads((root / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidRequestError, match="no chat template"):
        Tokenizer.from_dir(root).apply_chat_template([{"role": "user", "content": "hi"}])


def stream(tok: Tokenizer, ids: list[int], context: list[int] | None = None) -> list[str]:
    decoder = tok.incremental_decoder(context or [])
    return [decoder.step(i) for i in ids] + [decoder.flush()]


def test_incremental_decoder_holds_split_characters(tok: Tokenizer) -> None:
    text = "naïve 🦜 café 日本語 done"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # some characters span several byte-level tokens
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces[:-1]  # at least one token completed no character and was held back
    # every piece ends on a character boundary: the prefix sums are prefixes of the text
    sofar = ""
    for piece in pieces:
        sofar += piece
        assert text.startswith(sofar)


def test_incremental_decoder_skips_special_tokens_and_uses_prompt_context(tok) -> None:
    prompt = tok.encode_chat([{"role": "user", "content": "hi"}])
    ids = [*tok.encode(" Hello there", add_special_tokens=False), tok.eos_token_ids[0]]
    pieces = stream(tok, ids, context=prompt)
    assert "".join(pieces) == " Hello there"
    assert pieces[-2:] == ["", ""]


def test_incremental_decoder_flushes_an_incomplete_character(tok: Tokenizer) -> None:
    ids = tok.encode("🦜", add_special_tokens=False)
    assert len(ids) > 1
    pieces = stream(tok, ids[:-1])
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == tok.decode(ids[:-1])  # flush hands over what there is


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=40))
def test_streamed_pieces_concatenate_to_the_text(tok: Tokenizer, text: str) -> None:
    # A special token's text (hypothesis finds them in the tokenizer's source) encodes to its id,
    # which streaming skips, as vLLM does with skip_special_tokens.
    assume(not any(s in text for s in SPECIAL_TOKENS))
    ids = tok.encode(text, add_special_tokens=False)
    pieces = stream(tok, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces) or "\ufffd" in text
