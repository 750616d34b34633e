"""DeploymentCard roles: prefill, decode or aggregated engines, their parallelism and settings.

Owns the role fields and the rules that make a parallel layout runnable; never plans capacity.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.functional_validators import ModelWrapValidatorHandler
from pydantic_core import PydanticCustomError

from loom_operator.api.role_rules import (
    ENGINE_RULES,
    PARALLELISM_RULES,
    ROLE_RULES,
    ROLES_RULES,
)
from loom_runtime.card.base import CardModel, cel_rules
from loom_runtime.card.checks import validate_with_rules

RoleName = Literal["prefill", "decode", "aggregated"]
ROLE_NAMES: tuple[RoleName, ...] = ("prefill", "decode", "aggregated")
EngineDtype = Literal["fp64", "fp32", "bf16", "fp16"]

# Kubernetes resource.Quantity, as apimachinery spells it.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _int_to_str(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_quantity(value: str) -> str:
    if not re.match(QUANTITY_PATTERN, value):
        raise PydanticCustomError(
            "quantity", f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)"
        )
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_int_to_str),
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes quantity (`8`, `500m`, `64Gi`); stored as its string form."""


class Parallelism(CardModel):
    """How one replica's engine is split over ranks (one GPU each), vLLM-style.

    Ranks = dp × tp × pcp; DCP and EP are carved out of those ranks.
    """

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("self.pcp == 1 || self.dp == 1", "pcp > 1 cannot be combined with dp > 1"),
            ("(self.tp * self.pcp) % self.dcp == 0", "dcp must divide tp × pcp"),
            ("(self.dp * self.tp * self.pcp) % self.ep == 0", "ep must divide dp × tp × pcp"),
        )
    )

    dp: int = Field(default=1, ge=1)
    """Data-parallel ranks: independent engines sharing experts (with ep)."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel ranks: each layer's heads and matrices split across ranks."""
    pcp: int = Field(default=1, ge=1)
    """Prefill context parallelism: a prompt split by token over ranks."""
    dcp: int = Field(default=1, ge=1)
    """Decode context parallelism: the KV cache sharded by token; must divide tp × pcp."""
    ep: int = Field(default=1, ge=1)
    """Expert parallelism: experts sharded over ranks; must divide dp × tp × pcp."""
    cp_kv_interleave: int = Field(default=1, ge=1)
    """Tokens per contiguous run on one context-parallel rank (vLLM cp-kv-cache-interleave)."""

    @property
    def ranks(self) -> int:
        """Ranks (GPUs) one replica uses: dp × tp × pcp."""
        return self.dp * self.tp * self.pcp

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: object, handler: ModelWrapValidatorHandler[Parallelism]) -> Parallelism:
        return validate_with_rules(cls, data, handler, PARALLELISM_RULES)


class EngineSection(CardModel):
    """A role's `engine:` section: scheduler and KV-cache settings of the engine in each rank
    (the runtime's EngineConfig is built from them, through the flags that
    loom_runtime/wire/engine_settings.py declares)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.maxNumBatchedTokens >= self.maxNumSeqs",
                "maxNumBatchedTokens must be at least maxNumSeqs",
            )
        )
    )

    block_size: int = Field(default=16, ge=1, le=1024)
    """Tokens per KV block; prefix hashing and KV transfer work in whole blocks."""
    max_model_len: int | None = Field(default=None, ge=1)
    """Longest prompt + output; unset means the model's own limit."""
    max_num_seqs: int = Field(default=64, ge=1)
    """Requests batched together at most."""
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    """Token budget of one step (chunked prefill splits longer prompts)."""
    kv_cache_gib: float | None = Field(default=None, gt=0, alias="kvCacheGiB")
    """Device memory for the KV pool per rank; unset: vLLM takes what is left after weights, the
    native runtime sizes the pool for maxNumSeqs requests of a quarter of maxModelLen."""
    prefix_caching: bool = True
    """Reuse the KV blocks of a prompt prefix seen before; false recomputes every prompt."""
    batch_invariant: bool = False
    """Batch-invariant mode: a request's tokens, log-probs and latents are the same bits
    whoever shares its step and however its prompt is chunked or cached (costs compute; native:
    the llama, sparse-mla and mot families in one process or on TP ranks, without hiSparse or
    mtp; vLLM: VLLM_BATCH_INVARIANT=1)."""
    dtype: EngineDtype | None = None
    """Compute dtype fp64 | fp32 | bf16 | fp16; unset means the component's weight precision."""

    @model_validator(mode="wrap")
    @classmethod
    def _check(
        cls, data: object, handler: ModelWrapValidatorHandler[EngineSection]
    ) -> EngineSection:
        return validate_with_rules(cls, data, handler, ENGINE_RULES)


class KvOffload(CardModel):
    """A host-memory tier for KV blocks, so later turns of a session reuse their prefix."""

    host_gib: float = Field(gt=0, alias="hostGiB")
    """Host memory for offloaded KV blocks per replica."""


class HiSparse(CardModel):
    """Hybrid HiSparse decode: most KV in pinned host memory, top-k rows fetched per step."""

    host_pool_gib: float = Field(gt=0, alias="hostPoolGiB")
    """Pinned host pool per rank holding the KV cache."""
    offload_gib: float = Field(ge=0, alias="offloadGiB")
    """Extra host offload per rank: the CPU KV offload tier of the pool's evicted blocks (0:
    none; set it or kvOffload, not both)."""


class MtpSection(CardModel):
    """Speculative decoding with the model's multi-token-prediction layers."""

    draft_tokens: int = Field(ge=1)
    """Tokens drafted per step."""


class Resources(CardModel):
    """Pod resources of one replica (requests = limits)."""

    cpu: Quantity | None = None
    """CPU, e.g. 32 or 500m."""
    memory: Quantity | None = None
    """Memory, e.g. 1000Gi (host KV tiers live here)."""
    gpus: int | None = Field(default=None, ge=0)
    """GPUs: 0 for CPU-only, otherwise the replica's rank count."""


class Role(CardModel):
    """One kind of engine pod and how many of it to run."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.kvOffload) || !has(self.hiSparse) || self.hiSparse.offloadGiB == 0.0",
                "hiSparse.offloadGiB and kvOffload.hostGiB both size the role's one CPU KV "
                "offload tier; set one of them",
            ),
            (
                "!has(self.engine) || !has(self.engine.prefixCaching) || "
                "self.engine.prefixCaching || (!has(self.kvOffload) && "
                "(!has(self.hiSparse) || self.hiSparse.offloadGiB == 0.0))",
                "a CPU KV offload tier (kvOffload, hiSparse.offloadGiB) needs "
                "engine.prefixCaching: its blocks are found again by their prefix hash",
            ),
        )
    )

    replicas: int = Field(default=1, ge=0)
    """Pods of this role (each one engine over `ranks` GPUs)."""
    parallelism: Parallelism = Field(default_factory=Parallelism)
    """How one replica is split over ranks (all 1 by default)."""
    engine: EngineSection = Field(default_factory=EngineSection)
    """Scheduler and KV-cache settings."""
    kv_offload: KvOffload | None = None
    """Host KV tier (prefill: keep session prefixes)."""
    hi_sparse: HiSparse | None = None
    """Hybrid HiSparse (decode role of sparse-mla models only)."""
    mtp: MtpSection | None = None
    """Speculative decoding with MTP layers."""
    resources: Resources | None = None
    """Pod resources; unset leaves them to the cluster's defaults."""

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: object, handler: ModelWrapValidatorHandler[Role]) -> Role:
        return validate_with_rules(cls, data, handler, ROLE_RULES)


class Roles(CardModel):
    """The engines of a deployment: prefill + decode (disaggregated), or aggregated."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "has(self.prefill) || has(self.decode) || has(self.aggregated)",
                "declare at least one role",
            ),
            ("!has(self.prefill) || has(self.decode)", "a prefill role requires a decode role"),
            (
                "!has(self.aggregated) || (!has(self.prefill) && !has(self.decode))",
                "aggregated excludes prefill and decode",
            ),
            (
                "!has(self.prefill) || !has(self.prefill.hiSparse)",
                "hiSparse is for the decode role only",
            ),
            (
                "!has(self.aggregated) || !has(self.aggregated.hiSparse)",
                "hiSparse is for the decode role only",
            ),
        )
    )

    prefill: Role | None = None
    """Computes prompts' KV and hands it to a decode pod (needs decode)."""
    decode: Role | None = None
    """Generates tokens; pulls KV from prefill, or prefills short prompts itself."""
    aggregated: Role | None = None
    """Does both in one engine (excludes prefill and decode)."""

    def present(self) -> dict[RoleName, Role]:
        """The declared roles by name, in prefill, decode, aggregated order."""
        pairs: tuple[tuple[RoleName, Role | None], ...] = (
            ("prefill", self.prefill),
            ("decode", self.decode),
            ("aggregated", self.aggregated),
        )
        return {name: role for name, role in pairs if role is not None}

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: object, handler: ModelWrapValidatorHandler[Roles]) -> Roles:
        return validate_with_rules(cls, data, handler, ROLES_RULES)
