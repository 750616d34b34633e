"""The capacity planner: KV bytes per rank under DCP/PCP/TP, the longest context a KV budget
holds, and the arithmetic intensity of sparse MLA per rank. Pure; never reads files or devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.fleet.kv_layout import (
    CapacityError,
    KVBreakdown,
    MLAAttention,
    ModelShape,
    attention_layer_bytes,
    kv_breakdown,
    kv_bytes_per_token,
)

GIB = 1 << 30
INDEX_BYTES = 4  # one int32 token index per selected KV row
ACTIVATION_BYTES = 2  # BF16 queries and outputs


@dataclass(frozen=True)
class Accelerator:
    """Peak dense BF16 FLOP/s and HBM bytes/s of one device."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float

    @property
    def ridge(self) -> float:
        """FLOPs per byte below which a kernel is memory-bound."""
        return self.peak_flops / self.hbm_bytes_per_s


H200 = Accelerator(name="H200", peak_flops=989e12, hbm_bytes_per_s=4.8e12)


@dataclass(frozen=True)
class RolePlan:
    """One role's parallelism (a DeploymentCard role, converted once)."""

    name: str
    dp: int = 1
    tp: int = 1
    pcp: int = 1
    dcp: int = 1
    ep: int = 1
    interleave: int = 1  # DCP: consecutive tokens per rank before moving to the next rank

    def __post_init__(self) -> None:
        for field in ("dp", "tp", "pcp", "dcp", "ep", "interleave"):
            if getattr(self, field) < 1:
                raise CapacityError(f"role {self.name!r}: {field} must be >= 1")

    @property
    def gpus(self) -> int:
        """Devices of one replica: DCP and EP reuse the DP×TP×PCP ranks."""
        return self.dp * self.tp * self.pcp


@dataclass(frozen=True)
class SparseIntensity:
    """Sparse MLA for one query on one layer of one rank: FLOPs done over bytes moved."""

    heads: int
    flops: int
    bytes: int

    @property
    def flops_per_byte(self) -> float:
        return self.flops / self.bytes


@dataclass(frozen=True)
class RoleCapacity:
    """What one role's ranks hold and do at the report's context length and KV budget."""

    role: RolePlan
    heads_per_rank: int
    kv_bytes_per_token: int  # on one rank: MLA and the indexer replicate over TP, GQA splits
    kv_bytes_per_rank: int  # the most loaded DCP rank at the report's context
    max_context: int  # longest sequence whose most loaded rank fits the budget
    fits: bool  # the report's context fits the per-rank budget
    intensity: SparseIntensity | None  # None unless the model is sparse MLA
    indexer_crossover: int | None  # prompt length where the indexer out-costs sparse MLA


@dataclass(frozen=True)
class ParallelComparison:
    """Sparse MLA on `ranks` devices split by heads (TP) versus by tokens (PCP)."""

    ranks: int
    tp: SparseIntensity
    pcp: SparseIntensity
    tp_crossover: int | None
    pcp_crossover: int | None


@dataclass(frozen=True)
class CapacityReport:
    breakdown: KVBreakdown
    context: int
    kv_bytes: int  # one full copy of the cache at `context`
    budget_bytes: int  # per rank
    roles: tuple[RoleCapacity, ...]
    comparison: ParallelComparison | None
    accelerator: Accelerator

    @property
    def kv_bytes_per_token(self) -> int:
        return self.breakdown.total


def dcp_local_length(length: int, world: int, interleave: int, rank: int) -> int:
    """Tokens of a `length`-token sequence stored on DCP `rank`: token t is on (t // I) mod W."""
    stride = world * interleave
    tail = min(max(length % stride - rank * interleave, 0), interleave)
    return (length // stride) * interleave + tail


def max_local_length(length: int, world: int, interleave: int) -> int:
    """Tokens on the most loaded DCP rank (rank 0: it receives each partial round first)."""
    return dcp_local_length(length, world, interleave, 0)


def longest_fitting(tokens_per_rank: int, world: int, interleave: int) -> int:
    """Largest length whose most loaded DCP rank holds at most `tokens_per_rank` tokens."""
    if tokens_per_rank < 0:
        return 0
    rounds, rest = divmod(tokens_per_rank, interleave)
    length = rounds * world * interleave + rest
    assert max_local_length(length, world, interleave) <= tokens_per_rank
    assert max_local_length(length + 1, world, interleave) > tokens_per_rank
    return length


def heads_per_rank(shape: ModelShape, tp: int) -> int:
    """TP splits query heads; PCP, DCP and DP leave every head on every rank."""
    if shape.num_attention_heads % tp:
        raise CapacityError(
            f"tp={tp} does not divide num_attention_heads={shape.num_attention_heads}"
        )
    return shape.num_attention_heads // tp


def mla_flops_per_row(att: MLAAttention) -> int:
    """FLOPs one head spends on one latent row: QK over latent + RoPE dims, PV over the latent."""
    return 2 * (att.kv_lora_rank + att.qk_rope_head_dim) + 2 * att.kv_lora_rank


def sparse_intensity(shape: ModelShape, heads: int) -> SparseIntensity | None:
    """FLOPs per byte of sparse MLA for one query and `heads` heads on one rank.

    The top_k selected latent rows (plus their int32 index) are read once and serve every
    local head; each head adds its BF16 query (latent + RoPE dims) and BF16 latent output, and
    does a QK dot over latent + RoPE dims and a PV accumulation over the latent per row.
    """
    att = shape.attention
    if not isinstance(att, MLAAttention) or shape.indexer is None:
        return None
    top_k = shape.indexer.top_k
    qk_dims = att.kv_lora_rank + att.qk_rope_head_dim
    rows = top_k * (attention_layer_bytes(shape) + INDEX_BYTES)
    per_head_bytes = (qk_dims + att.kv_lora_rank) * ACTIVATION_BYTES
    return SparseIntensity(
        heads=heads,
        flops=heads * top_k * mla_flops_per_row(att),
        bytes=rows + heads * per_head_bytes,
    )


def indexer_crossover(shape: ModelShape, tp: int) -> int | None:
    """Prompt length past which prefilling from scratch costs more indexer than sparse-MLA FLOPs.

    Per rank, the indexer scores every earlier token (L²/2 pairs, 2·heads·head_dim FLOPs each,
    over its layers) and sparse MLA reads top_k rows per query (L·top_k rows per layer, for the
    rank's heads). PCP splits both by token, so it cancels; TP splits only the MLA heads. Equal
    at L = 2·top_k·mla_flops_per_row_on_rank / indexer_flops_per_pair. Counts the trunk only
    (not MTP), and ignores the first top_k queries attending to fewer rows.
    """
    att = shape.attention
    idx = shape.indexer
    if not isinstance(att, MLAAttention) or idx is None or not idx.num_heads or not idx.num_layers:
        return None
    mla_per_row = shape.num_layers * heads_per_rank(shape, tp) * mla_flops_per_row(att)
    indexer_per_pair = idx.num_layers * 2 * idx.num_heads * idx.head_dim
    return -(-2 * idx.top_k * mla_per_row // indexer_per_pair)


def plan_role(shape: ModelShape, role: RolePlan, context: int, budget_bytes: int) -> RoleCapacity:
    """Size one role: PCP replicates the all-gathered cache, DCP shards it by token."""
    per_token = kv_bytes_per_token(shape, role.tp)
    heads = heads_per_rank(shape, role.tp)
    per_rank = max_local_length(context, role.dcp, role.interleave) * per_token
    return RoleCapacity(
        role=role,
        heads_per_rank=heads,
        kv_bytes_per_token=per_token,
        kv_bytes_per_rank=per_rank,
        max_context=longest_fitting(budget_bytes // per_token, role.dcp, role.interleave),
        fits=per_rank <= budget_bytes,
        intensity=sparse_intensity(shape, heads),
        indexer_crossover=indexer_crossover(shape, role.tp),
    )


def compare_tp_pcp(shape: ModelShape, ranks: int) -> ParallelComparison | None:
    """Sparse MLA on `ranks` devices: TP (heads / ranks per device) versus PCP (all heads).

    None when the model is not sparse MLA or `ranks` does not divide its heads.
    """
    if shape.num_attention_heads % ranks:
        return None
    tp = sparse_intensity(shape, heads_per_rank(shape, ranks))
    pcp = sparse_intensity(shape, shape.num_attention_heads)
    if tp is None or pcp is None:
        return None
    return ParallelComparison(
        ranks=ranks,
        tp=tp,
        pcp=pcp,
        tp_crossover=indexer_crossover(shape, ranks),
        pcp_crossover=indexer_crossover(shape, 1),
    )


def plan_capacity(
    shape: ModelShape,
    roles: tuple[RolePlan, ...],
    context: int,
    budget_bytes: int,
    accelerator: Accelerator = H200,
) -> CapacityReport:
    """The whole report; the TP-vs-PCP comparison uses the largest replica's device count."""
    if context < 0 or budget_bytes < 0:
        raise CapacityError("context and budget must be non-negative")
    ranks = max((role.gpus for role in roles), default=1)
    return CapacityReport(
        breakdown=kv_breakdown(shape),
        context=context,
        kv_bytes=context * kv_bytes_per_token(shape),
        budget_bytes=budget_bytes,
        roles=tuple(plan_role(shape, role, context, budget_bytes) for role in roles),
        comparison=compare_tp_pcp(shape, ranks),
        accelerator=accelerator,
    )


def role_plans(card: DeploymentCard) -> tuple[RolePlan, ...]:
    """Each declared role's parallelism, in prefill, decode, aggregated order."""
    return tuple(
        RolePlan(
            name=name,
            dp=p.dp,
            tp=p.tp,
            pcp=p.pcp,
            dcp=p.dcp,
            ep=p.ep,
            interleave=p.cp_kv_interleave,
        )
        for name, role in card.spec.roles.present().items()
        for p in (role.parallelism,)
    )
