"""loom_trainer.checksum: the push's piece hash equals its definition, computed in plain Python
here, and catches what it must."""

from __future__ import annotations

import pytest
import torch

from loom_trainer.checksum import KEYS, ROW_WORDS, checksum

MASK = (1 << 64) - 1
FOLD = 0x100000001B3


def random_bytes(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator)


def reference(data: bytes, running: int = 0) -> int:
    """The definition, word by word in Python ints: each row of ROW_WORDS little-endian words
    dotted with the keys mod 2^64, folded in order, then the tail bytes and the length."""
    keys = [k & MASK for k in KEYS.tolist()]
    words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data) // 8 * 8, 8)]
    acc = running & MASK
    for start in range(0, len(words), ROW_WORDS):
        row = words[start : start + ROW_WORDS]
        acc = (acc * FOLD + sum(w * k for w, k in zip(row, keys, strict=False))) & MASK
    acc = (acc * FOLD + int.from_bytes(data[len(words) * 8 :], "little")) & MASK
    acc = (acc * FOLD + len(data)) & MASK
    return acc - (1 << 64) if acc >> 63 else acc


@pytest.mark.parametrize("n", [0, 1, 7, 8, 8 * ROW_WORDS - 1, 8 * ROW_WORDS, 8 * ROW_WORDS + 9,
                               100_003, 8 * ROW_WORDS * 600 + 5])  # fmt: skip
def test_the_hash_equals_its_definition(n: int) -> None:
    data = random_bytes(n, n)
    assert checksum(data) == reference(data.numpy().tobytes())
    assert checksum(data, 12345) == reference(data.numpy().tobytes(), 12345)


def test_a_slice_not_aligned_in_memory_hashes_its_bytes() -> None:
    whole = random_bytes(9000, 1)
    assert checksum(whole[3:8195]) == reference(whole.numpy().tobytes()[3:8195])


def test_the_hash_is_the_same_on_any_number_of_threads() -> None:
    data = random_bytes(4 << 20, 2)
    threads = torch.get_num_threads()
    try:
        seen = set()
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            seen.add(checksum(data))
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 1


def test_a_changed_bit_swapped_words_or_reordered_pieces_change_it() -> None:
    data = random_bytes(64 << 10, 3)
    before = checksum(data)
    flipped = data.clone()
    flipped[40_000] ^= 1
    swapped = data.clone()
    words = swapped.view(torch.int64)
    words[[10, 900]] = words[[900, 10]]
    a, b = data[: 32 << 10], data[32 << 10 :]
    assert len({before, checksum(flipped), checksum(swapped)}) == 3
    assert checksum(b, checksum(a)) != checksum(a, checksum(b))


def test_trailing_zeros_change_it() -> None:
    data = torch.ones(24, dtype=torch.uint8)
    assert checksum(data) != checksum(torch.cat([data, torch.zeros(8, dtype=torch.uint8)]))
