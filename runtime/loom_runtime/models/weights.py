"""Copy Hugging Face-named checkpoint tensors into a model's weight tensors, atomically.

Checks names and shapes of everything before copying anything; never reads files.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from loom_runtime.errors import CheckpointError


@torch.no_grad()
def copy_weights(
    targets: Mapping[str, torch.Tensor],
    tensors: Mapping[str, torch.Tensor],
    what: str,
    strict: bool = True,
) -> None:
    """Fill each target from the tensor of its name; CheckpointError lists what does not fit.

    Unknown names and wrong shapes always fail; missing names fail when `strict`.
    """
    unknown = sorted(set(tensors) - set(targets))
    missing = sorted(set(targets) - set(tensors)) if strict else []
    wrong = [
        f"{n} {tuple(t.shape)} != {tuple(targets[n].shape)}"
        for n, t in tensors.items()
        if n in targets and t.shape != targets[n].shape
    ]
    problems = [
        f"{label}: {', '.join(items[:5])}{' …' if len(items) > 5 else ''}"
        for label, items in (("unknown", unknown), ("missing", missing), ("shape", wrong))
        if items
    ]
    if problems:
        raise CheckpointError(
            f"weights do not fit the {what} config ({'; '.join(problems)}): "
            "check that config.json belongs to these weights"
        )
    for name, tensor in tensors.items():
        targets[name].copy_(tensor)
