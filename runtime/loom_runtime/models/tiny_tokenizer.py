"""The tiny checkpoint's tokenizer: byte-level BPE trained on the shipped corpus; its chat format.

Deterministic (same corpus -> same bytes); never downloads anything or touches weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = "tiny_corpus.txt"
TARGET_VOCAB = 8192  # an upper bound: the small corpus runs out of merges first (~4k tokens)
BOS = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (BOS, END_OF_TEXT, IM_START, IM_END)

# ChatML with a leading BOS; rejects unknown roles the way real templates do.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role'] + "
    "': use system, user, assistant or tool') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyTokenizer:
    """A trained tokenizer and the ids of its special tokens."""

    tokenizer: Tokenizer
    bos_id: int
    end_of_text_id: int
    im_end_id: int

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))


def corpus_text() -> str:
    """The small original English prose/code corpus that ships with Loom."""
    return resources.files("loom_runtime.models.data").joinpath(CORPUS).read_text("utf-8")


def train_tiny_tokenizer() -> TinyTokenizer:
    """Train byte-level BPE on the corpus; adds BOS on encode(add_special_tokens=True)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(keepends=True), trainer=trainer)
    ids = {token: _special_id(tok, token) for token in SPECIAL_TOKENS}
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, ids[BOS])],
    )
    return TinyTokenizer(
        tokenizer=tok, bos_id=ids[BOS], end_of_text_id=ids[END_OF_TEXT], im_end_id=ids[IM_END]
    )


def _special_id(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise RuntimeError(f"BPE training dropped the special token {token}")
    return int(token_id)


def tokenizer_config() -> dict[str, object]:
    """tokenizer_config.json: special tokens and the chat template (readable by transformers)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "add_bos_token": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": CHAT_TEMPLATE,
    }
