"""Per-request KV operations over a BlockTable: prefix match, admit, grow, commit, free.

Owns the rules that tie a request's tokens to pool blocks and the prefix-cache counters; never
decides which request runs (the scheduler does) and never touches KV memory (a host tier's
reload is the offload's copy).

With `draft_rows` (MTP speculation: the cache holds a draft layer whose row at position i reads
token i + 1) a prefix hit gives up its last block, as vLLM does for its draft models: that
block's last draft row was computed from the token after the block, which the hit does not
cover; the hits before it are exact, since the block after each of them matched too.

With a host tier (CPU KV offload), a prompt's prefix hit is the device-resident run of blocks
followed by the run the host tier holds after it; admission allocates device blocks for the
host run, reloads their bytes and registers them in the prefix cache, and the prompt's
computation starts after both runs. With `async_reload` admission only begins the reload
(`table.reload`); the caller runs its copy (on any thread) and then calls `finish_reload`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.errors import BlockStateError, KVConfigError
from loom_runtime.kv.offload import KVOffload
from loom_runtime.wire.prefix_hash import BlockHash, PrefixHasher


class KVAllocator:
    """The scheduler's view of KV memory. Every method is all-or-nothing on shortfall."""

    def __init__(
        self,
        pool: BlockPool,
        hasher: PrefixHasher,
        host: KVOffload | None = None,
        async_reload: bool = False,
        draft_rows: bool = False,
    ) -> None:
        if pool.block_size != hasher.block_size:
            raise KVConfigError(
                f"pool block_size {pool.block_size} != hasher block_size {hasher.block_size}"
            )
        self.pool = pool
        self.hasher = hasher
        self.block_size = pool.block_size
        self.host = host
        self.async_reload = async_reload
        self.draft_rows = draft_rows
        if host is not None:
            pool.on_evict = host.offload
        self._queries = 0
        self._hits = 0

    @property
    def prefix_queries(self) -> int:
        """Prompt tokens looked up at successful admissions (vllm:prefix_cache_queries)."""
        return self._queries

    @property
    def prefix_hits(self) -> int:
        """Of those, tokens served from the device prefix cache (vllm:prefix_cache_hits); host
        tier reloads are counted by the offload (`host.stats().reload_tokens`)."""
        return self._hits

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def match(
        self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> int:
        """Prefix-cached tokens of a prompt, read-only; a multiple of block_size, < len."""
        hashes = self._prompt_hashes(token_ids, cache_salt, lora_name)
        return len(self.pool.lookup(hashes)) * self.block_size

    def admission_cost(
        self,
        token_ids: Sequence[int],
        num_tokens: int,
        hashes: Sequence[BlockHash] | None = None,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> tuple[int, int]:
        """(cached_tokens, blocks_consumed) that `admit` would give and take now; read-only.
        Cached tokens count host-tier hits too (their blocks are among those consumed).

        `blocks_consumed` counts new blocks plus evictable hits that leave the allocatable
        count. `hashes` are the prompt's full-block hashes if the caller memoizes them (else
        they are computed from `token_ids`, `cache_salt` and `lora_name`).
        """
        plan = self._plan(token_ids, num_tokens, hashes, cache_salt, lora_name)
        return (len(plan.hit_ids) + plan.host_hits) * self.block_size, plan.consumed

    def admit(
        self,
        table: BlockTable,
        token_ids: Sequence[int],
        num_tokens: int,
        hashes: Sequence[BlockHash] | None = None,
    ) -> bool:
        """Take the prefix hits of `token_ids` and enough blocks for `num_tokens` tokens in all.

        On shortfall nothing changes and False is returned. Sets `table.num_cached_tokens`
        (the computation of the prompt starts there) and counts the prefix query. `hashes`:
        as for `admission_cost`.
        """
        if table.block_ids:
            raise BlockStateError("admit needs an empty block table; free() it first")
        if hashes is None:
            hashes = self._prompt_hashes(token_ids, table.cache_salt, table.lora_name)
        plan = self._plan(token_ids, num_tokens, hashes, None, None)
        if plan.num_new > self.pool.num_free - plan.reclaimed:
            return False
        hits = len(plan.hit_ids)
        host_hashes = hashes[hits : hits + plan.host_hits]
        if self.host is not None:
            self.host.touch(host_hashes)  # evictions this allocation offloads go past them
        self.pool.acquire(plan.hit_ids)
        new_ids = self.pool.allocate(plan.num_new)
        table.block_ids = plan.hit_ids + new_ids
        table.hashes = list(hashes[:hits])
        table.num_committed = hits
        self._hits += hits * self.block_size
        table.num_cached_tokens = hits * self.block_size
        self._queries += len(token_ids)
        if host_hashes and self.host is not None:
            table.reload = self.host.begin_reload(host_hashes, new_ids)
            if not table.reload.num_blocks:
                table.reload = None
            elif not self.async_reload:
                self.host.copy(table.reload)
                self.finish_reload(table, token_ids)
        return True

    def finish_reload(self, table: BlockTable, token_ids: Sequence[int]) -> int:
        """After the table's reload copied its blocks: they join the prefix cache and count as
        cached tokens. Returns the tokens reloaded."""
        job = table.reload
        if job is None or self.host is None:
            return 0
        table.reload = None
        n = self.host.end_reload(job)
        self._register(table, token_ids, job.hashes)
        table.num_cached_tokens = table.num_committed * self.block_size
        return n * self.block_size

    def abandon_reload(self, table: BlockTable) -> None:
        """The table's reload failed: its blocks stay held, uncached, to be recomputed."""
        if table.reload is not None and self.host is not None:
            self.host.end_reload(table.reload, copied=False)
        table.reload = None

    def grow(self, table: BlockTable, num_tokens: int) -> bool:
        """Enough blocks for `num_tokens` tokens in all; False, changing nothing, on shortfall."""
        num_new = self.blocks_for(num_tokens) - len(table.block_ids)
        if num_new <= 0:
            return True
        if num_new > self.pool.num_free:
            return False
        table.block_ids.extend(self.pool.allocate(num_new))
        return True

    def commit(self, table: BlockTable, token_ids: Sequence[int]) -> None:
        """Offer every newly full block to the prefix cache.

        `token_ids` are all the request's tokens whose KV is now computed, from token 0 (a
        just-sampled token whose KV is not yet written must not be included).
        """
        bs, done = self.block_size, table.num_committed
        num_full = len(token_ids) // bs
        if num_full > len(table.block_ids):
            raise BlockStateError(
                f"{len(token_ids)} computed tokens but only {len(table.block_ids)} blocks held"
            )
        if num_full <= done:
            return
        parent = table.hashes[done - 1] if done else None
        new_hashes = self.hasher.hash_blocks(
            token_ids[: num_full * bs], parent, done, table.cache_salt, table.lora_name
        )
        extra = [
            self.hasher.extra_keys(i, table.cache_salt, table.lora_name)
            for i in range(done, num_full)
        ]
        self.pool.commit_blocks(
            table.block_ids[done:num_full],
            new_hashes,
            parent,
            token_ids[done * bs : num_full * bs],
            extra,
        )
        table.hashes.extend(new_hashes)
        table.num_committed = num_full

    def split(self, table: BlockTable, num_blocks: int) -> BlockTable:
        """Move the first `num_blocks` blocks (and their references) into a new table; `table`
        keeps the rest. A P/D prefill leases a prompt's blocks this way and frees the others."""
        if not 0 <= num_blocks <= len(table.block_ids):
            raise BlockStateError(
                f"cannot split {num_blocks} blocks off a table of {len(table.block_ids)}"
            )
        committed = min(table.num_committed, num_blocks)
        head = BlockTable(
            block_ids=table.block_ids[:num_blocks],
            num_committed=committed,
            hashes=table.hashes[:committed],
            cache_salt=table.cache_salt,
            lora_name=table.lora_name,
        )
        table.block_ids = table.block_ids[num_blocks:]
        table.hashes = table.hashes[committed:]
        table.num_committed -= committed
        return head

    def free(self, table: BlockTable) -> None:
        """Release the table's blocks tail-first (tails are evicted first) and clear it."""
        self.pool.release(reversed(table.block_ids))
        table.clear()

    def reset_prefix_cache(self) -> int:
        """Drop every cached block, host tier included (weight sync); returns how many device
        blocks were uncached."""
        if self.host is not None:
            self.host.clear()
        return self.pool.clear_cache()

    def _register(
        self, table: BlockTable, token_ids: Sequence[int], hashes: Sequence[BlockHash]
    ) -> None:
        """Reloaded blocks (the table's next ones, already held) join the prefix cache."""
        if not hashes:
            return
        bs, done, n = self.block_size, table.num_committed, len(hashes)
        extra = [
            self.hasher.extra_keys(i, table.cache_salt, table.lora_name)
            for i in range(done, done + n)
        ]
        self.pool.commit_blocks(
            table.block_ids[done : done + n],
            hashes,
            table.hashes[done - 1] if done else None,
            token_ids[done * bs : (done + n) * bs],
            extra,
        )
        table.hashes.extend(hashes)
        table.num_committed = done + n

    def _prompt_hashes(
        self, token_ids: Sequence[int], cache_salt: str | None, lora_name: str | None
    ) -> list[BlockHash]:
        # At least one prompt token must be computed to produce logits: cap below len.
        max_blocks = max(len(token_ids) - 1, 0) // self.block_size
        return self.hasher.hash_blocks(
            token_ids[: max_blocks * self.block_size], cache_salt=cache_salt, lora_name=lora_name
        )

    def _plan(
        self,
        token_ids: Sequence[int],
        num_tokens: int,
        hashes: Sequence[BlockHash] | None,
        cache_salt: str | None,
        lora_name: str | None,
    ) -> _AdmitPlan:
        """The one admission arithmetic."""
        if hashes is None:
            hashes = self._prompt_hashes(token_ids, cache_salt, lora_name)
        max_blocks = max(len(token_ids) - 1, 0) // self.block_size
        hit_ids = self.pool.lookup(hashes[:max_blocks])
        host_run = 0
        if self.host is not None:
            host_run = self.host.lookup(hashes[len(hit_ids) : max_blocks])
        if self.draft_rows:  # the whole run's last block gives up its hit
            if host_run:
                host_run -= 1
            elif hit_ids:
                hit_ids = hit_ids[:-1]
        num_new = max(self.blocks_for(num_tokens), len(hit_ids)) - len(hit_ids)
        host_hits = min(host_run, num_new)
        # Acquiring an evictable hit takes it out of the allocatable count.
        reclaimed = sum(1 for b in hit_ids if self.pool.ref_count(b) == 0)
        return _AdmitPlan(hit_ids, host_hits, num_new, reclaimed)


@dataclass(frozen=True)
class _AdmitPlan:
    hit_ids: list[int]  # device-resident prefix hits
    host_hits: int  # blocks after them the host tier holds (reloaded into new blocks)
    num_new: int  # device blocks to allocate (host hits included)
    reclaimed: int  # evictable hits that leave the allocatable count when acquired

    @property
    def consumed(self) -> int:
        return self.num_new + self.reclaimed
