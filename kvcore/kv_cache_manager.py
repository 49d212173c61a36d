"""The KV-cache manager: the allocator's public face."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from kvcore.block import KVBlock
from kvcore.block_pool import BlockPool
from kvcore.config import KVCacheConfig, is_prefix_cacheable
from kvcore.coordinator import KVCacheCoordinator, make_coordinator
from kvcore.errors import InvalidArgument, RequestTooLong
from kvcore.events import KVCacheEvent
from kvcore.hashing import BlockHashWithGroup
from kvcore.managers.mamba import AlignedMambaManager
from kvcore.request import Request

GroupBlocks = tuple[list[KVBlock], ...]
"""Blocks per KV-cache group, in group order."""


class KVCacheManager:
    """Allocates, shares through the prefix cache, and frees the KV-cache blocks of requests.

    A scheduler step for a request is: :meth:`get_computed_blocks` (the local
    prefix hit, only for a request that is not running), then
    :meth:`allocate_slots` for the tokens the step computes, then advancing
    ``request.num_computed_tokens``.  :meth:`free` ends the request (or
    preempts it; the caller resets ``num_computed_tokens`` to 0 to recompute).
    """

    def __init__(self, config: KVCacheConfig) -> None:
        self.config = config
        self.coordinator: KVCacheCoordinator = make_coordinator(config)
        self.block_pool: BlockPool = self.coordinator.pool
        self.num_groups = len(config.groups)
        self.enable_caching = config.enable_caching
        # Blocks popped for a deferred free and not yet freed: id -> references held that way.
        self._popped: dict[int, int] = {}

    @property
    def usage(self) -> float:
        """The fraction of usable blocks that are held."""
        return self.block_pool.usage

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None) -> tuple[GroupBlocks, int]:
        """The request's local prefix hit: hit blocks per group and the hit length in tokens.

        The hit is capped at :meth:`~kvcore.Request.max_cache_hit_length`: ``num_tokens - 1`` tokens
        (at least one token is always computed, to produce logits, so a block-aligned prompt never
        hits its last block), the request's ``prefix_cache_hit_limit`` and ``max_cache_hit_length``,
        which can only lower it.  A request whose limit is 0 looks nothing up.  Nothing changes until
        :meth:`allocate_slots` takes the hit, but the lookup records on the request the end of a
        longer prefix some group found cached (``shared_prefix_boundary``, see :class:`~kvcore.Request`).
        """
        if not self._looks_up(request):
            request.shared_prefix_boundary = 0
            return tuple([] for _ in range(self.num_groups)), 0
        blocks, hit_length, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, self._hashed_cap(request, request.max_cache_hit_length(max_cache_hit_length))
        )
        request.shared_prefix_boundary = hit_length + num_uncached if num_uncached else 0
        return blocks, hit_length

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many of the request's tokens a lookup would find cached, capped at ``num_tokens - 1``
        (not at its ``prefix_cache_hit_limit``, as vLLM 0.34.0 probes); 0 when it looks nothing up.

        A probe only: it takes no reference, allocates nothing, records nothing on the request and
        queues no event, so it is safe for a request that may never be scheduled."""
        if not self._looks_up(request):
            return 0
        _, hit_length, _ = self.coordinator.find_longest_cache_hit(
            request.block_hashes, self._hashed_cap(request, request.num_tokens - 1)
        )
        return hit_length

    def _looks_up(self, request: Request) -> bool:
        """Whether a prefix lookup runs for the request: caching on, and a hit limit other than 0."""
        return self.enable_caching and request.prefix_cache_hit_limit != 0

    def _hashed_cap(self, request: Request, max_length: int) -> int:
        """``max_length``, no further than the hashed blocks (hashes that look ahead end before the tokens do)."""
        return min(max_length, len(request.block_hashes) * self.config.hash_block_size)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: GroupBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        num_encoder_tokens: int = 0,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> GroupBlocks | None:
        """Give the request slots for ``num_new_tokens`` more tokens (plus lookahead).

        ``num_new_computed_tokens``/``new_computed_blocks`` are the local hit
        from :meth:`get_computed_blocks`; ``num_external_computed_tokens`` are
        tokens an external connector loads after the hit;
        ``delay_cache_blocks`` (for a load that lands asynchronously) leaves
        the new blocks out of the prefix cache until the caller's
        :meth:`cache_blocks`.  A scheduler admitting a waiting request passes
        ``full_sequence_must_fit`` (the whole request, its window-freeing
        groups capped by ``max_in_flight_tokens``, must fit now),
        ``reserved_blocks`` (kept free for other requests' steps in flight)
        and ``has_scheduled_reqs`` (whether any request runs: only then does
        the watermark keep blocks free for a waiting request).  When the cache
        needs zeroing (:attr:`~kvcore.KVCacheConfig.needs_zeroing`), the new
        blocks of attention groups are recorded for
        :meth:`take_new_block_ids`, but the external tokens' blocks in
        ``skip_zeroing_group_ids`` (which an asynchronous load writes after the
        step: zeroing them would race it).  Order of work:

        0. With ``full_sequence_must_fit``, refuse (return ``None``, nothing
           changed) unless the whole request fits beside the watermark.

        1. Free the blocks that left the attention window of this request,
           counting only processed tokens (``num_computed_tokens`` minus the
           request's ``num_in_flight_tokens``): a step still in flight reads
           its window.  This is done even if the allocation is refused: they
           are not needed either way.
        2. Admission: if the pool, less ``reserved_blocks`` and the
           watermark, cannot supply every block this needs (counting hit
           blocks that sit free in the queue as consumed), return ``None``;
           nothing else has changed.
        3. Take the local hit in every group, then allocate for external
           tokens in every group (never interleaved per group).
        4. Allocate the new blocks and, unless ``delay_cache_blocks``, enter
           the now-full computed blocks in the prefix cache.

        Returns the newly allocated blocks per group.
        """
        rid = request.request_id
        for name, value in (
            ("num_new_tokens", num_new_tokens),
            ("num_new_computed_tokens", num_new_computed_tokens),
            ("num_lookahead_tokens", num_lookahead_tokens),
            ("num_external_computed_tokens", num_external_computed_tokens),
            ("reserved_blocks", reserved_blocks),
            ("num_encoder_tokens", num_encoder_tokens),
        ):
            if not isinstance(value, int) or value < 0:
                raise InvalidArgument(name, value, "must be an int >= 0")
        for group_id in skip_zeroing_group_ids:
            if not isinstance(group_id, int) or not 0 <= group_id < self.num_groups:
                raise InvalidArgument("skip_zeroing_group_ids", tuple(skip_zeroing_group_ids), "names no group")
        if num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0:
            raise InvalidArgument("num_new_tokens", 0, "must be > 0 when no computed tokens are adopted")
        if new_computed_blocks is None:
            new_computed_blocks = tuple([] for _ in range(self.num_groups))
        elif len(new_computed_blocks) != self.num_groups:
            raise InvalidArgument(
                "new_computed_blocks", len(new_computed_blocks), f"needs one list per group ({self.num_groups})"
            )
        has_hit = any(new_computed_blocks)
        if has_hit and rid in self.coordinator.managers[0].req_to_blocks:
            raise InvalidArgument("new_computed_blocks", rid, "a request that holds blocks takes no new prefix hit")

        num_local_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        total_computed_tokens = num_local_computed_tokens + num_external_computed_tokens
        num_tokens_main_model = total_computed_tokens + num_new_tokens
        num_tokens_need_slot = num_tokens_main_model + num_lookahead_tokens
        max_model_len = self.config.max_model_len
        if max_model_len is not None:
            if max(num_tokens_main_model, request.num_tokens) > max_model_len:
                raise RequestTooLong(rid, max(num_tokens_main_model, request.num_tokens), max_model_len)
            num_tokens_need_slot = min(num_tokens_need_slot, max_model_len)

        coordinator = self.coordinator
        # Where the request's prefill ends: its prompt, or all but the last token of a resumed request.
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        watermark_blocks = self.config.watermark_blocks if has_scheduled_reqs and request.waiting else 0
        num_free = self.block_pool.num_free_blocks
        if full_sequence_must_fit:
            full_num_tokens = request.num_tokens if max_model_len is None else min(request.num_tokens, max_model_len)
            num_blocks_for_all = coordinator.num_blocks_to_allocate(
                rid,
                full_num_tokens,
                new_computed_blocks,
                total_computed_tokens,
                apply_admission_cap=True,
                num_encoder_tokens=num_encoder_tokens,
                num_local_computed_tokens=num_local_computed_tokens,
                num_hash_lookahead_tokens=request.num_hash_lookahead_tokens,
                prefill_end=prefill_end,
            )
            if num_blocks_for_all + watermark_blocks > num_free:
                return None
        coordinator.remove_skipped_blocks(
            rid, max(0, total_computed_tokens - request.num_in_flight_tokens), request.num_prompt_tokens
        )
        num_blocks_needed = coordinator.num_blocks_to_allocate(
            rid,
            num_tokens_need_slot,
            new_computed_blocks,
            total_computed_tokens,
            num_encoder_tokens=num_encoder_tokens,
            num_tokens_main_model=num_tokens_main_model,
            num_local_computed_tokens=num_local_computed_tokens,
            num_hash_lookahead_tokens=request.num_hash_lookahead_tokens,
            prefill_end=prefill_end,
        )
        if num_blocks_needed + watermark_blocks > self.block_pool.num_free_blocks - reserved_blocks:
            return None
        if has_hit or num_external_computed_tokens > 0:
            coordinator.allocate_new_computed_blocks(
                rid,
                new_computed_blocks,
                num_local_computed_tokens,
                num_external_computed_tokens,
                skip_zeroing_group_ids,
            )
        new_blocks = coordinator.allocate_new_blocks(
            rid, num_tokens_need_slot, num_encoder_tokens, num_tokens_main_model
        )
        if self.enable_caching and not delay_cache_blocks:
            # Only tokens that exist are cached: lookahead slots are not yet final.
            coordinator.cache_blocks(request, min(num_tokens_main_model, request.num_tokens))
        return new_blocks

    def truncate_computed_blocks(self, blocks: GroupBlocks, num_computed_tokens: int) -> GroupBlocks:
        """A local hit from :meth:`get_computed_blocks` cut back to its first ``num_computed_tokens``
        tokens, a multiple of every prefix-cached group's block size: the blocks before that endpoint in
        each group (an align-mode Mamba group's hit may end before it: it keeps what it has).  For a
        scheduler whose connector loads more than a hit ending inside a block: the hit is cut to the
        block boundary below it (no copy on write) and the load covers the rest.  Nothing is touched;
        ``blocks`` is left as it is.  An endpoint off a group's blocks, or past a group's hit, raises
        :class:`InvalidArgument` (vLLM 0.33.0 asserts)."""
        if len(blocks) != self.num_groups:
            raise InvalidArgument("blocks", len(blocks), f"needs one list per group ({self.num_groups})")
        if not isinstance(num_computed_tokens, int) or num_computed_tokens < 0:
            raise InvalidArgument("num_computed_tokens", num_computed_tokens, "must be an int >= 0")
        truncated: list[list[KVBlock]] = []
        for group_id, (group_blocks, manager) in enumerate(zip(blocks, self.coordinator.managers)):
            if not is_prefix_cacheable(manager.spec):
                truncated.append([])
                continue
            if num_computed_tokens % manager.block_size:
                raise InvalidArgument(
                    "num_computed_tokens",
                    num_computed_tokens,
                    f"must be a multiple of groups[{group_id}]'s {manager.block_size}-token blocks",
                )
            num_blocks = num_computed_tokens // manager.block_size
            if isinstance(manager, AlignedMambaManager):
                num_blocks = min(num_blocks, len(group_blocks))
            elif num_blocks > len(group_blocks):
                raise InvalidArgument(
                    "num_computed_tokens",
                    num_computed_tokens,
                    f"is past groups[{group_id}]'s {len(group_blocks)}-block hit",
                )
            truncated.append(list(group_blocks[:num_blocks]))
        return tuple(truncated)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Enter the request's full blocks among its first ``num_computed_tokens`` tokens in the prefix cache.

        A scheduler calls this after a step's output, when the accepted draft
        tokens (or, under async scheduling, the sampled token) exist and are
        computed, and once an asynchronous external load has landed; blocks
        already cached stay as they are.
        """
        if not isinstance(num_computed_tokens, int) or num_computed_tokens < 0:
            raise InvalidArgument("num_computed_tokens", num_computed_tokens, "must be an int >= 0")
        if self.enable_caching and request.request_id in self.coordinator.managers[0].req_to_blocks:
            self.coordinator.cache_blocks(request, min(num_computed_tokens, request.num_tokens))

    def free(self, request: Request | str) -> None:
        """Free every block of the request, group by group, each table tail first.

        Freeing a request that holds nothing (aborted before allocation, or
        already freed) is a no-op.
        """
        self.coordinator.free(request if isinstance(request, str) else request.request_id)

    def pop_blocks_for_free(self, request: Request | str) -> list[KVBlock]:
        """Forget the request and return its blocks (table order, group 0's first), still referenced.

        For a scheduler that must not return blocks to the pool while a step
        in flight may still write them: it later passes the list to
        :meth:`free_popped_blocks`.
        """
        blocks = self.coordinator.pop_blocks_for_free(request if isinstance(request, str) else request.request_id)
        for block in blocks:
            if not block.is_null:
                self._popped[block.block_id] = self._popped.get(block.block_id, 0) + 1
        return blocks

    def free_popped_blocks(self, blocks: Sequence[KVBlock]) -> None:
        """Free blocks from :meth:`pop_blocks_for_free`, last block first (the tail is evicted first)."""
        returned = Counter(block.block_id for block in blocks if not block.is_null)
        for block_id, count in returned.items():
            if count > self._popped.get(block_id, 0):
                raise InvalidArgument("blocks", block_id, "was not popped by pop_blocks_for_free (or is freed twice)")
        self.block_pool.free_blocks(reversed(blocks))
        for block_id, count in returned.items():
            self._popped[block_id] -= count
            if not self._popped[block_id]:
                del self._popped[block_id]

    def take_block_copies(self) -> tuple[list[tuple[int, int]], list[KVBlock]]:
        """The block copies the worker must run with this step, queued since the last call, as (source
        block id, destination block id), and their endpoints (each copy's source, then its destination).

        With sub-block hits, a hit ending inside a block is copied to a block
        of the request's own before the request writes there (copy on write),
        and a state a request cached inside the block it goes on writing is
        copied to the block the cache keeps instead.  Each endpoint holds one
        reference until the caller frees the endpoints, once the copies have
        run (:meth:`free_retained_blocks`, or :meth:`free_popped_blocks` with
        the list reversed, as a deferred free).
        """
        pairs = self.coordinator.take_pending_copies()
        retained = [block for pair in pairs for block in pair]
        for block in retained:
            self._popped[block.block_id] = self._popped.get(block.block_id, 0) + 1
        return [(source.block_id, copy.block_id) for source, copy in pairs], retained

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The boundary states offered a KV connector since the last call, to offload with their exact
        blocks (an align-mode Mamba table is not append-only, so a connector cannot find them by
        position): per request, as (group, block id, the tokens the state is after).

        An align-mode Mamba group offers each state it caches whole in a
        block, under the tokens its key covers, and, when a request's next
        allocation copies a state the request cached inside the block it goes
        on writing, the copy (filled by that step's block copies).  A freed
        request's offers not taken yet are dropped.  The blocks are the
        caller's to pin: nothing here keeps them held.
        """
        return self.coordinator.take_state_offloads()

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """For a finishing request, before it is freed: each align-mode Mamba group's state the request
        cached inside the block it was writing and never copied, as (group, block id, the tokens the state
        is after), when no later token reached that block (its computed tokens end at the state and none
        is in flight).  Each such record is dropped either way."""
        return self.coordinator.finalize_tail_offloads(
            request.request_id, request.num_computed_tokens, request.num_in_flight_tokens
        )

    def take_new_block_ids(self) -> list[int]:
        """The blocks the worker must zero before the step runs, recorded since the last call: every
        block an attention group (not a ring buffer) took from the pool, a copy on write's new block
        included, group by group in the order taken; empty unless the cache needs zeroing."""
        return self.coordinator.take_new_block_ids()

    def free_retained_blocks(self, blocks: Sequence[KVBlock]) -> None:
        """Release the endpoints of block copies from :meth:`take_block_copies`, in the order given."""
        self.free_popped_blocks(list(reversed(blocks)))

    def new_step_starts(self) -> None:
        """A scheduler step begins: an align-mode Mamba group may now hit the states cached in the last one."""
        self.coordinator.new_step_starts()

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; refused (``False``) while any block is held."""
        return self.block_pool.reset_prefix_cache()

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the prefix-cache entries of the given blocks (e.g. after a failed external load).

        Held blocks stay allocated but can no longer be hit.  An unknown id
        raises :class:`~kvcore.errors.UnknownBlock` and changes nothing.
        """
        self.block_pool.evict_blocks(block_ids)

    def take_events(self) -> list[KVCacheEvent]:
        """The KV cache events queued since the last call, oldest first (none unless
        ``enable_kv_cache_events``); a scheduler publishes them after every step."""
        return self.block_pool.take_events()

    # -- introspection --------------------------------------------------------

    def get_blocks(self, request_id: str) -> GroupBlocks:
        return self.coordinator.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's table per group as block ids (0 is the null block)."""
        return tuple([block.block_id for block in table] for table in self.get_blocks(request_id))

    def request_ids(self) -> list[str]:
        """Requests that hold a table, in the order they first got one."""
        seen: dict[str, None] = {}
        for manager in self.coordinator.managers:
            seen.update(dict.fromkeys(manager.req_to_blocks))
        return list(seen)

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to allocate) first."""
        return self.block_pool.free_block_ids()

    def ref_counts(self) -> dict[int, int]:
        return self.block_pool.ref_counts()

    def cache_entries(self) -> list[tuple[BlockHashWithGroup, int]]:
        return self.block_pool.cache_entries()

    def check_invariants(self) -> None:
        """Assert every structural invariant of the pool, the tables and their agreement."""
        self.block_pool.check_invariants()
        holders = dict.fromkeys(range(1, self.block_pool.num_blocks), 0)
        for block_id, count in self._popped.items():
            holders[block_id] += count
        for manager in self.coordinator.managers:
            manager.check_invariants()
            for pair in manager.pending_copies:
                for block in pair:
                    holders[block.block_id] += 1
            for table in manager.req_to_blocks.values():
                for block in table:
                    if not block.is_null:
                        holders[block.block_id] += 1
        for block_id, count in holders.items():
            ref_cnt = self.block_pool.blocks[block_id].ref_cnt
            assert ref_cnt == count, (
                f"block {block_id}: ref_cnt={ref_cnt} but {count} table slots, deferred frees and copies hold it"
            )


def hit_block_ids(blocks: Sequence[Sequence[KVBlock]]) -> tuple[list[int], ...]:
    """Block ids of per-group block lists."""
    return tuple([block.block_id for block in group] for group in blocks)
