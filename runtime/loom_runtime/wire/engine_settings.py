"""Every engine setting declared once: its type, default and help, the card fields that feed it,
its `loom runtime` flag and its `vllm serve` flag, in the order a command carries them.

Owns the declarations, the contract between the operator (which writes the flags from the cards)
and the runtime (which parses them into EngineConfig); never reads a card, parses argv or renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

Value: TypeAlias = int | float | str | bool
"""What a setting holds (None where it has no default)."""


@dataclass(frozen=True)
class VllmFlag:
    """How a setting reads on `vllm serve` (the renderer's VLLM_VERSION)."""

    name: str
    form: Literal["value", "switch", "present"] = "value"
    """value: `NAME VALUE`; switch (a bool): `NAME` when true, `--no-NAME` when false, always
    written; present: `NAME` alone wherever the native flag would be written."""
    card: str | None = None
    """The one card field vLLM reads instead of the setting's `card` (None: the same fields)."""
    scale: int | None = None
    """vLLM takes `int(value × scale)` (a GiB setting as vLLM's bytes: 2**30); None: as is."""


@dataclass(frozen=True)
class EngineSetting:
    """One engine setting from the card to the engine. The derivations: the runtime's arguments
    (serve/engine_args.py), the card's flags for native workers and for vLLM
    (loom_operator/fleet/engine_flags.py), and EngineConfig's fields (serve/main.py plan_worker)."""

    name: str
    """The EngineConfig field it fills (`parallel.tp`: the tp field of EngineConfig.parallel)."""
    kind: type[int] | type[float] | type[str] | type[bool]
    default: Value | None
    """The runtime's default, where neither card nor flag gives a value."""
    doc: str
    """The flag's help: what it does, the card field, the default."""
    flag: str | None
    """The `loom runtime` flag (a bool's flag flips its default); None: vLLM reads it, the
    native runtime keeps EngineConfig's default."""
    card: tuple[str, ...] = ()
    """The card fields that feed it, spelled as in YAML from the DeploymentCard role
    (`engine.blockSize`), or from the ModelCard's served component (`component.precision.kv`);
    the first one set wins. Empty: a flag only (tuning, tests)."""
    card_values: Mapping[str, str] | None = None
    """The card's words for the runtime's (fp32 -> float32); a word missing here means unset."""
    omit_default: bool = False
    """Written only where the card's value differs from `default` (False: wherever it is set)."""
    choices: tuple[str, ...] = ()
    vllm: VllmFlag | None = None
    """Where the table writes it for `vllm serve` (None: vLLM has no plain flag for it; the
    vLLM renderer writes what it has, e.g. a JSON config, by hand)."""
    vllm_env: str | None = None
    """The environment variable `vllm serve` reads it from where vLLM has no flag for it (a
    bool as 1 or 0), written on the vLLM container wherever the native flag would be."""
    group: str | None = None
    """The runtime's argument group it is listed under in --help (None: the main options)."""

    def __post_init__(self) -> None:
        if self.flag is not None and not self.flag.startswith("--"):
            raise ValueError(f"EngineSetting {self.name}: flag {self.flag!r} must start with --")
        if self.kind is bool and not (self.omit_default and isinstance(self.default, bool)):
            raise ValueError(
                f"EngineSetting {self.name}: a bool is a flag that flips its default: give a "
                "bool default and omit_default=True"
            )
        if self.choices and self.default is not None and self.default not in self.choices:
            raise ValueError(f"EngineSetting {self.name}: default {self.default!r} not a choice")

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under (`parallel.tp` -> `parallel_tp`)."""
        return self.name.replace(".", "_")


DTYPE_NAMES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""A card's precision or engine dtype as the runtime's and vLLM's --dtype (fp8 has no CPU
compute dtype: unset, the runtime's default)."""
RANKS = (
    "ranks inside the worker (a role's parallelism: ranks = dp × tp × pcp; tp for llama, "
    "dp/pcp/dcp/ep for sparse-mla)"
)

SETTINGS: tuple[EngineSetting, ...] = (
    EngineSetting(
        "block_size", int, 16, "tokens per KV block (default 16)", "--block-size",
        card=("engine.blockSize",), vllm=VllmFlag("--block-size"),
    ),
    EngineSetting(
        "num_blocks", int, None, "KV blocks, each DP replica's (default: sized from max-num-seqs)",
        "--num-blocks",
    ),
    EngineSetting(
        "kv_cache_gib", float, None,
        "device memory (GiB) for the KV pool, each rank's (a role's engine.kvCacheGiB; "
        "default: sized from max-num-seqs; not with --num-blocks)",
        "--kv-cache-gib", card=("engine.kvCacheGiB",),
        vllm=VllmFlag("--kv-cache-memory-bytes", scale=2**30),
    ),
    EngineSetting(
        "max_num_seqs", int, 64, "running requests (default 64)", "--max-num-seqs",
        card=("engine.maxNumSeqs",), vllm=VllmFlag("--max-num-seqs"),
    ),
    EngineSetting(
        "max_num_batched_tokens", int, 2048,
        "token budget of one step: prefill chunks and decodes (default 2048)",
        "--max-num-batched-tokens", card=("engine.maxNumBatchedTokens",),
        vllm=VllmFlag("--max-num-batched-tokens"),
    ),
    EngineSetting(
        "prefix_caching", bool, True,
        "recompute every prompt: keep no KV blocks for later requests with the same prefix "
        "(a role's engine.prefixCaching false; refuses --kv-offload-gib)",
        "--no-prefix-caching", card=("engine.prefixCaching",), omit_default=True,
        vllm=VllmFlag("--enable-prefix-caching", form="switch"),
    ),
    EngineSetting(
        "batch_invariant", bool, False,
        "batch-invariant mode: a request's tokens, log-probs and latents the same bits whoever "
        "shares its step and however its prompt is chunked or cached (a role's "
        "engine.batchInvariant; llama, sparse-mla and mot families, one process or TP ranks, "
        "no HiSparse or MTP; "
        "costs compute: "
        "bench/batch_invariant.py)",
        "--batch-invariant", card=("engine.batchInvariant",), omit_default=True,
        vllm_env="VLLM_BATCH_INVARIANT",
    ),
    EngineSetting(
        "max_model_len", int, None, "prompt + output tokens (default: model's)", "--max-model-len",
        card=("engine.maxModelLen",), vllm=VllmFlag("--max-model-len"),
    ),
    EngineSetting(
        "dtype", str, "float32", "default float32", "--dtype",
        card=("engine.dtype", "component.precision.weights"), card_values=DTYPE_NAMES,
        choices=("float32", "bfloat16", "float16", "float64"),
        vllm=VllmFlag("--dtype", card="engine.dtype"),  # unset: vLLM reads the checkpoint's
    ),
    EngineSetting(  # vLLM: --kv-offloading-size with its backend (render/vllm.py)
        "kv_offload_gib", float, 0.0,
        "host memory (GiB) keeping KV blocks evicted from the device, reloaded on a later "
        "prefix hit (a role's kvOffload.hostGiB; default 0: off)",
        "--kv-offload-gib", card=("kvOffload.hostGiB", "hiSparse.offloadGiB"), omit_default=True,
    ),
    EngineSetting(  # vLLM: the HiSparseConnector's host_pool_gib (render/vllm.py)
        "hisparse_host_pool_gib", float, 0.0,
        "Hybrid HiSparse decode (sparse-mla): host memory (GiB) holding the KV's latent "
        "rows; the device keeps indexer keys and per-request hot buffers (a decode role's "
        "hiSparse.hostPoolGiB; default 0: off)",
        "--hisparse-host-pool-gib", card=("hiSparse.hostPoolGiB",),
    ),
    EngineSetting(
        "hisparse_hot_slots", int, None,
        "rows per layer in a request's HiSparse hot buffer (default 2 x top-k + 1)",
        "--hisparse-hot-slots",
    ),
    EngineSetting(
        "parallel.tp", int, 1, "tensor parallel ranks (the llama family)", "--tp",
        card=("parallelism.tp",), omit_default=True, vllm=VllmFlag("--tensor-parallel-size"),
        group=RANKS,
    ),
    EngineSetting(
        "parallel.dp", int, 1, "data parallel attention replicas (sparse-mla, with ep)", "--dp",
        card=("parallelism.dp",), omit_default=True, vllm=VllmFlag("--data-parallel-size"),
        group=RANKS,
    ),
    EngineSetting(
        "parallel.pcp", int, 1, "prefill context parallel ranks", "--pcp",
        card=("parallelism.pcp",), omit_default=True,
        vllm=VllmFlag("--prefill-context-parallel-size"), group=RANKS,
    ),
    EngineSetting(
        "parallel.dcp", int, 1, "decode context parallel size (divides --pcp)", "--dcp",
        card=("parallelism.dcp",), omit_default=True,
        vllm=VllmFlag("--decode-context-parallel-size"), group=RANKS,
    ),
    EngineSetting(
        "parallel.interleave", int, 1,
        "DCP: consecutive tokens on one rank before the next (cpKvInterleave; default 1)",
        "--dcp-interleave", card=("parallelism.cpKvInterleave",), omit_default=True,
        vllm=VllmFlag("--cp-kv-cache-interleave-size"), group=RANKS,
    ),
    EngineSetting(
        "parallel.ep", int, 1, "expert parallel size (divides --pcp)", "--ep",
        card=("parallelism.ep",), omit_default=True,
        vllm=VllmFlag("--enable-expert-parallel", form="present"), group=RANKS,
    ),
    EngineSetting(  # vLLM: written beside --decode-context-parallel-size (render/vllm.py)
        "dcp_backend", str, "ag_rs",
        "how DCP merges partial attention (vLLM's --dcp-comm-backend; default ag_rs)",
        "--dcp-comm-backend", choices=("ag_rs", "a2a"), vllm=VllmFlag("--dcp-comm-backend"),
        group=RANKS,
    ),
    EngineSetting(
        "collective_timeout_s", float, 60.0,
        "seconds a rank waits on a collective or a step before the worker fails (60)",
        "--collective-timeout", group=RANKS,
    ),
    EngineSetting(  # vLLM: --speculative-config's num_speculative_tokens (render/vllm.py)
        "mtp_draft_tokens", int, 0,
        "MTP speculative decoding (sparse-mla with MTP layers): tokens drafted per step "
        "(a role's mtp.draftTokens; default 0: off)",
        "--mtp-draft-tokens", card=("mtp.draftTokens",),
    ),
)  # fmt: skip
"""The engine settings, in the order the operator writes them (the order vLLM's flags have in
the golden commands; the native order of before, where that order allows)."""


def setting(name: str) -> EngineSetting:
    """The declaration of EngineConfig field `name`; KeyError if none declares it."""
    for declared in SETTINGS:
        if declared.name == name:
            return declared
    raise KeyError(f"no engine setting declares {name!r} (loom_runtime/wire/engine_settings.py)")
