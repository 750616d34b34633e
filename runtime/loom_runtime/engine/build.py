"""The parts an Engine is built from, one small builder per feature: what runs a step's forward
(one process, ranks, or MTP speculation on either), the P/D remote-KV side, and the CPU offload
tier's asynchronous reloads, and a MoT model's denoise lane.

Owns choosing and wiring those parts from an EngineConfig; never runs a step (engine.py and
batcher.py do) and holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loom_runtime.card import families
from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.denoise_lane import DenoiseLane, Emit
from loom_runtime.engine.denoise_loop import MotDenoiseExecutor, MotDenoiseLoop
from loom_runtime.engine.kv_memory.host_reload import HostReloads
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.ranks.tp_runner import TpRunner
from loom_runtime.engine.remote import RemoteKV
from loom_runtime.engine.runner import ModelRunner, TokenRunner
from loom_runtime.engine.spec.forward import SpecForward
from loom_runtime.engine.spec.mtp_runner import Drafter, MtpRunner
from loom_runtime.engine.token_forward import TokenForward
from loom_runtime.engine.transfer_port import DisaggSettings, KVConnectorPort
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.cache import KVStore, PagedKVCache
from loom_runtime.kv.hisparse_cache import HiSparseKVCache
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.kv.offload import KVOffload
from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.linear import BatchInvariant
from loom_runtime.models.mot.model import MotForCausalLM


@dataclass(frozen=True)
class Forward:
    """What runs a step's token plans: `runner` holds the model (or the ranks), `executor` turns
    plans into results, `spec` is the executor when it speculates."""

    runner: TokenRunner | MtpRunner
    executor: TokenForward | SpecForward
    spec: SpecForward | None
    draft_tokens: int
    """Draft tokens a request's loop makes room for (0: no drafting in this engine; a ranked P/D
    prefill keeps MTP rows but never drafts)."""

    @property
    def prompt_logprobs(self) -> bool:
        """Whether it computes prompt log-probs: a plain forward in this process or over TP
        ranks (every row of a chunk comes back); not with MTP nor over PCP/DCP/DP ranks."""
        return self.spec is None and not isinstance(self.runner, RankedRunner)


def build_forward(
    model: CausalLM,
    cache: KVStore,
    config: EngineConfig,
    ranks: EngineRanks | None,
    drafter: Drafter | None,
) -> Forward:
    """MTP speculation (in this process, or on ranks that draft), else a plain forward over the
    model or the ranks; the model's matmuls batch-invariant or not, as the config says."""
    choose_invariance(model, config.batch_invariant, ranks)
    k = config.mtp_draft_tokens
    ranked_drafts = isinstance(ranks, RankedRunner) and ranks.drafts
    if k > 0 and ranks is None:
        assert isinstance(cache, LatentKVCache | HiSparseKVCache)  # from mtp_kv_spec
        mtp = MtpRunner(model, cache)
        spec = SpecForward(mtp, k, drafter)
        return Forward(mtp, spec, spec, k)
    if k > 0 and ranked_drafts:  # the ranks draft and verify
        assert isinstance(ranks, RankedRunner)
        spec = SpecForward(ranks, k, drafter)
        return Forward(ranks, spec, spec, k)
    runner = ModelRunner(model, cache) if ranks is None else ranks
    return Forward(runner, TokenForward(runner), None, 0)


def choose_invariance(model: CausalLM, invariant: bool, ranks: EngineRanks | None) -> None:
    """Set the model's batch-invariant mode for this engine — on every engine built,
    as engines in one process may share a model. Batch-invariant runs where the model's family
    declares it (card/families.py `batch_invariant`), in one process or on TP ranks (each rank
    sets its shard's mode, parallel/llama/tp.py); elsewhere it is refused."""
    family = families.family_of_model_type(model.config.model_type)
    ranked = ranks is not None and not isinstance(ranks, TpRunner)
    if invariant and (not family.batch_invariant or ranked):
        built = ", ".join(f.name for f in families.families() if f.batch_invariant)
        where = f"the {family.name!r} family" if not ranked else "PCP/DCP/EP/DP ranks"
        raise ValueError(
            f"batch_invariant (--batch-invariant) is built for the {built} families in one "
            f"process or on TP ranks, not for {where}"
        )
    if isinstance(model, BatchInvariant):
        model.set_batch_invariant(invariant)


def build_remote(
    loop: ARDecodeLoop,
    config: EngineConfig,
    disagg: DisaggSettings | None,
    connector: KVConnectorPort | None,
    cache: KVStore,
    hisparse: HiSparseKVCache | None,
    wake: Callable[[], None],
) -> RemoteKV | None:
    """A P/D role's remote-KV side: the connector bound to the pool pulls land in (under HiSparse
    the host tier is the whole latent cache), or None for an aggregated engine."""
    if disagg is None or connector is None:
        return None
    pool = cache if hisparse is None else hisparse.host
    connector.bind(pool.data, wake, config.kv_fp8, pool.spec)
    arrived = None if hisparse is None else hisparse.keys_arrived
    return RemoteKV(loop, connector, disagg, config.max_num_seqs, arrived)


def build_reloads(
    loop: ARDecodeLoop,
    config: EngineConfig,
    offload: KVOffload | None,
    wake: Callable[[], None],
) -> HostReloads | None:
    """The offload tier's reloads off the step thread (kv_reload_async), or None."""
    if offload is None or not config.kv_reload_async:
        return None
    return HostReloads(loop, offload, config.max_num_seqs, wake)


def build_lane(
    model: CausalLM,
    cache: KVStore,
    kv: KVAllocator,
    emit: Emit,
    runner: TokenRunner | MtpRunner,
    ranks: EngineRanks | None = None,
    disagg: DisaggSettings | None = None,
) -> DenoiseLane | None:
    """The denoise lane of a MoT model served aggregated in this process (its image loop runs
    the very model object the AR loop runs, over the same paged cache), or None for any other
    engine: another family, ranks, or a P/D role (whose finished prompts go to a lease, not to
    a drawing; such an engine still serves the MoT's text loop). `runner`: the AR loop's, which
    recomputes a drawing's text KV after a keep swap."""
    if not isinstance(model, MotForCausalLM) or ranks is not None or disagg is not None:
        return None
    if not isinstance(runner, ModelRunner):
        raise ValueError(f"a MoT model's text loop runs on a ModelRunner, not {runner!r}")
    if not isinstance(cache, PagedKVCache):
        raise ValueError(f"a MoT model's denoise loop reads a paged KV cache, not {cache!r}")
    executor = MotDenoiseExecutor(model, cache)
    return DenoiseLane(
        MotDenoiseLoop(model.config.patch_size),
        executor,
        kv,
        model.config.latent_channels,
        emit,
        runner,
    )


def build_frees(
    ranks: EngineRanks | None, hisparse: HiSparseKVCache | None, runner: TokenRunner | MtpRunner
) -> Callable[[str], None] | None:
    """What frees a request's device state kept beside its blocks: its rows on the ranks, its
    HiSparse hot buffers, its MTP state (each that is on); None when there is none."""
    frees: list[Callable[[str], None]] = []
    if ranks is not None:
        frees.append(ranks.release)
    if hisparse is not None:
        frees.append(hisparse.release)
    if isinstance(runner, MtpRunner):
        frees.append(runner.release)
    if len(frees) <= 1:
        return frees[0] if frees else None

    def free_all(request_id: str) -> None:
        for free in frees:
            free(request_id)

    return free_all
