"""`loom model init-tiny`: deterministic tiny checkpoints, and model source URIs -> paths
(`loom://tiny`, `loom://tiny-wan`, `loom://tiny-sparse-mla` and `loom://tiny-mot` are generated
on first use; `pvc://claim/path` is read where the pod mounts the claim).

Writes random (nonsense-producing) weights from a fixed seed; never downloads real weights.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from loom_runtime.card import families
from loom_runtime.card.source import PVC_ROOT, Source
from loom_runtime.errors import CheckpointError
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.family import runtime_of
from loom_runtime.models.llama import LlamaForCausalLM
from loom_runtime.models.tiny_files import random_weights as random_tensors
from loom_runtime.models.tiny_files import write_checkpoint
from loom_runtime.models.tiny_tokenizer import train_tiny_tokenizer

logger = logging.getLogger(__name__)

TINY_URI = "loom://tiny"
INIT_STD = 0.02

README = """# Loom tiny checkpoint (random weights)

This directory was written by `loom model init-tiny` (seed {seed}). It is a real llama-style
checkpoint in Hugging Face format -- config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with a ChatML chat template) and generation_config.json -- but its
~{millions:.1f}M weights are **random numbers** drawn from a fixed seed. It produces
**nonsense text**. It exists so that tests, benchmarks and `make run` exercise the whole
serving path (tokenizer, paged KV cache, batching, streaming, P/D transfer) in seconds on a
CPU, with byte-identical files on every machine.

The tokenizer is a real byte-level BPE ({vocab} tokens) trained on a small English text
that ships with Loom, so any UTF-8 text round-trips.

To serve a real model, point the component's source in your ModelCard at a Hugging Face
checkpoint directory (llama, mistral, qwen2 or qwen3 with safetensors weights and a
tokenizer.json), for example:

```yaml
components:
  - name: decoder
    kind: transformer
    source: {{uri: "file:///models/Qwen3-0.6B"}}
```
"""


def tiny_config_dict(vocab_size: int, bos_id: int, eos_ids: list[int]) -> dict[str, Any]:
    """config.json of the tiny model (legacy rope_theta layout, as real checkpoints have)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
    }


def random_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """N(0, 0.02) matrices and unit norm weights, drawn in sorted-name order from one generator."""
    shapes = {name: tuple(t.shape) for name, t in LlamaForCausalLM(config).targets().items()}
    return random_tensors(shapes, seed, INIT_STD)


def init_tiny(dir: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint into `dir` (created if needed); same bytes on every run."""
    root = Path(dir)
    tiny = train_tiny_tokenizer()
    eos_ids = [tiny.im_end_id, tiny.end_of_text_id]
    raw = tiny_config_dict(tiny.vocab_size, tiny.bos_id, eos_ids)
    config = ModelConfig.from_dict(raw)
    readme = README.format(seed=seed, millions=config.num_parameters / 1e6, vocab=tiny.vocab_size)
    write_checkpoint(root, raw, random_weights(config, seed), tiny, eos_ids, readme)
    logger.info("wrote tiny checkpoint", extra={"path": str(root), "seed": seed})
    return root


def cache_root() -> Path:
    """Where generated models live: $LOOM_CACHE, else ~/.cache/loom."""
    configured = os.environ.get("LOOM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "loom"


def builtin_checkpoints() -> dict[str, tuple[str, Callable[[Path, int], Path]]]:
    """loom:// URI -> (the file that marks a complete checkpoint, its writer): each registered
    family's tiny checkpoint (card/families.py)."""
    out: dict[str, tuple[str, Callable[[Path, int], Path]]] = {}
    for name, family in families.tiny_checkpoints().items():
        runtime = runtime_of(family)
        if runtime.write_tiny is None:
            raise TypeError(f"model family {family.name!r} names loom://{name} but cannot write it")
        out[f"loom://{name}"] = (runtime.tiny_marker, runtime.write_tiny)
    return out


def resolve_source(uri: str, pvc_root: Path = Path(PVC_ROOT)) -> Path:
    """A local checkpoint directory for a component source URI.

    `loom://tiny` -> <cache>/models/tiny and `loom://tiny-wan` -> <cache>/models/tiny-wan
    (generated on first use); `file:///PATH`, `file:PATH` and plain paths -> PATH;
    `pvc://claim/path` -> `pvc_root`/claim/path, the claim's read-only mount in a worker pod
    (CheckpointError when the claim or the path is not there). Other schemes are refused.
    """
    builtin = builtin_checkpoints()
    if uri in builtin:
        marker, write = builtin[uri]
        target = cache_root() / "models" / uri.removeprefix("loom://")
        return _ensure_generated(target, marker, write)
    if uri.startswith("file:"):  # file:///abs/path or file:relative/path
        return Path(uri.removeprefix("file:").removeprefix("//"))
    if uri.startswith("pvc://"):
        return _mounted(uri, pvc_root)
    scheme, sep, _ = uri.partition("://")
    if scheme == "loom":
        raise CheckpointError(
            f"model source {uri!r}: the built-in models are {', '.join(builtin)}; "
            "point real checkpoints at file://PATH"
        )
    if sep:
        raise CheckpointError(
            f"model source {uri!r}: the runtime reads local checkpoints only ({TINY_URI}, "
            f"file://PATH, pvc://CLAIM/PATH); fetch {scheme}:// sources to a directory first and "
            "use file://"
        )
    return Path(uri)


def _mounted(uri: str, pvc_root: Path) -> Path:
    """The checkpoint directory of a pvc:// source in the claim mounted under `pvc_root`."""
    try:
        source = Source(uri=uri)
    except ValidationError as exc:  # a bad claim name or a '..' path
        raise CheckpointError(f"model source {uri!r}: {exc.errors()[0]['msg']}") from None
    mount, path = pvc_root / str(source.claim), Path(str(source.mounted_path(pvc_root)))
    if not mount.is_dir():
        raise CheckpointError(
            f"model source {uri!r}: claim {source.claim!r} is not mounted at {mount}; a worker "
            "reads the claim its pod mounts, and the operator mounts the claims of the card's "
            "sources (a weight sync cannot move a running pod to another claim)"
        )
    if not path.is_dir():
        raise CheckpointError(
            f"model source {uri!r}: no checkpoint directory {path} in claim {source.claim!r} "
            f"(mounted at {mount}): copy the checkpoint there or fix the path"
        )
    return path


def _ensure_generated(target: Path, marker: str, write: Callable[[Path, int], Path]) -> Path:
    if (target / marker).is_file():
        return target
    logger.info("generating a built-in checkpoint (first use)", extra={"path": str(target)})
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(staging, 0)  # seed 0: the same files on every machine
        staging.chmod(0o755)  # mkdtemp makes it private; the checkpoint is not
        os.rename(staging, target)  # atomic: readers see a complete checkpoint or none
    except OSError:
        if not (target / marker).is_file():  # not just a concurrent winner
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def add_parser(sub: Any) -> None:
    """Register `init-tiny DIR [--seed N] [--family F]` on the `model` subcommand's parsers."""
    parser = sub.add_parser(
        "init-tiny",
        help="write a deterministic tiny checkpoint (random weights: nonsense text)",
        description="Write a tiny checkpoint with random weights from a fixed seed and a "
        "real byte-level BPE tokenizer. It produces nonsense text; it is for tests and demos.",
    )
    parser.add_argument("dir", type=Path, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--family",
        default="llama",
        help="a registered family with a tiny checkpoint: llama (default), sparse-mla (a "
        "glm_moe_dsa checkpoint: MLA, DSA indexer, MoE), dit (a diffusers-format Wan 2.x "
        "video/image checkpoint: DiT, UMT5 encoder, VAE), mot (one llama stack for text and "
        "image latents) or a plugin's",
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    with_tiny = [f.name for f in families.families() if f.tiny is not None]
    try:
        family = families.family(args.family)
    except families.UnknownFamilyError as exc:
        raise SystemExit(f"init-tiny: {exc}") from None
    write = runtime_of(family).write_tiny
    if family.tiny is None or write is None:
        raise SystemExit(
            f"init-tiny: the {family.name} family has no tiny checkpoint "
            f"(these do: {', '.join(with_tiny)})"
        )
    path = write(args.dir, args.seed)
    what = "noise" if "diffusion" in family.loops else "nonsense text"
    print(f"wrote tiny {family.name} checkpoint {family.tiny} (random weights, {what}) to {path}")
    return 0
