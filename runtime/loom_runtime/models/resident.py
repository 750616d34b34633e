"""Resident parameter bytes: how much memory a set of weight tensors really holds, each storage
counted once however many tensors (views, tied weights, shared components) point into it.

Owns that count; never copies, moves or frees a tensor.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def resident_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages under `tensors` (meta tensors hold none)."""
    storages: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if tensor.device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())
