"""A trainer's push as an engine's worker receives it, in threads over a real gloo group: what
the engine tests swap in (the worker's transfer, not a stand-in)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.transfer.peer_rebuild import receive_from_peer, rendezvous, send_weights
from loom_runtime.transfer.weight_push import StagedPush
from loom_trainer.group import Rendezvous
from loom_trainer.protocol import pack, plan_buckets, spec_of, torch_dtype


def staged_push(engine: Engine, weights: Mapping[str, torch.Tensor], version: str) -> StagedPush:
    """Every tensor `engine.push_specs()` names, taken from `weights` in the dtype the engine
    serves, sent as rank 0 and staged by the engine's side (not swapped in)."""
    specs = engine.push_specs()
    pushed = {n: weights[n].to(torch_dtype(s.dtype)) for n, s in specs.items()}
    rv = rendezvous("127.0.0.1", f"u-{version}", 30.0)
    trainer = Rendezvous(rv.host, rv.port, 0, 2, rv.timeout_s, rv.update_id, rv.store_rank)

    def send() -> None:
        send_weights(trainer, pushed)

    return receive_from_peer(rv, version, specs, send)


def generate_around_a_push(
    engine: Engine, prompt: Sequence[int], sampling: SamplingParams, checkpoint: Path
) -> tuple[tuple[int, ...], CompletedRequest]:
    """`prompt`'s tokens before, and its output after, a push of `checkpoint`'s tensors as "v2"
    swapped in drained; the engine is shut down after."""
    try:
        before = engine.generate(prompt, sampling).output_token_ids
        staged = staged_push(engine, load_file(str(checkpoint / "model.safetensors")), "v2")
        assert engine.pause(timeout=30)
        engine.load_pushed(staged)
        staged.discard()
        engine.resume()
        return tuple(before), engine.generate(prompt, sampling)
    finally:
        engine.shutdown()


def stage(tensors: Mapping[str, torch.Tensor], version: str, directory: Path) -> StagedPush:
    """The tensors staged on disk as a received push would leave them (small buckets)."""
    directory.mkdir(parents=True)
    buckets = plan_buckets([spec_of(n, t) for n, t in tensors.items()], 1 << 20)
    staged = StagedPush("u1", version, directory, buckets, max(b.nbytes for b in buckets))
    for b in buckets:
        buf = torch.zeros(b.nbytes, dtype=torch.uint8)
        pack(b, tensors, buf)
        staged.bucket_file(b.index).write_bytes(buf.numpy().tobytes())
    return staged
