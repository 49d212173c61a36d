"""How each catalogued fault is planted: functions that rewire one kvcore manager instance.

Every ``plant_*`` function takes a freshly built :class:`kvcore.KVCacheManager`
and replaces a method of *that instance's* block pool, coordinator or
single-type managers with a copy carrying one bug.
Classes are never patched: where the behaviour is looked up through the
class (a classmethod a coordinator calls on the recorded manager class), the
one object is moved to a subclass of its own class, and the coordinator's
record of it updated.  The replacement code is written here, next to a
comment that names the bug.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

import kvcore
from kvcore.block import KVBlock
from kvcore.blocks_math import ceil_div
from kvcore.coordinator import HybridCoordinator
from kvcore.errors import InvalidArgument, OutOfBlocks, UnknownBlock
from kvcore.events import AllBlocksCleared, BlockRemoved
from kvcore.hashing import BlockHash
from kvcore.managers import (
    ChunkedLocalAttentionManager,
    CircularBufferManager,
    FullAttentionManager,
    RSWAManager,
    SlidingWindowManager,
)
from kvcore.managers.base import HitBlocks, SingleTypeManager, block_hashes_at, drop_last_block
from kvcore.managers.mamba import AlignedMambaManager, MambaManager

# -- seed faults -------------------------------------------------------------


def release_with_and_condition(blocks: Iterable[Any], enable_caching: bool) -> tuple[list[Any], list[Any]]:
    """Drop one reference on each block; route the freed ones with the seed-000 condition.

    The seed bug: ``hash is None and caching_on`` where ``hash is None or not
    caching_on`` was meant, so with caching off every freed block goes to the
    tail (FIFO reuse).  Works on kvcore's and vLLM's blocks alike; returns
    (blocks for the head, blocks for the tail).
    """
    to_head, to_tail = [], []
    for block in blocks:
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            if block.block_hash is None and enable_caching:
                to_head.append(block)
            else:
                to_tail.append(block)
    return to_head, to_tail


def take_hits_and_external_interleaved(
    group_managers: Sequence[Any],
    request_id: str,
    hits: Any,
    num_local: int,
    num_external: int,
    skip_zeroing_group_ids: Sequence[int] = (),
) -> None:
    """The seed-003 bug: each group takes its hit and allocates for the external tokens before
    the next group has touched its own hit.  kvcore's and vLLM's managers share these method names."""
    for group_id, (group_manager, hit) in enumerate(zip(group_managers, hits)):
        group_manager.add_local_computed_blocks(request_id, hit, num_local, num_external)
        if num_external > 0:
            group_manager.allocate_external_computed_blocks(
                request_id, num_local, num_external, record_for_zeroing=group_id not in skip_zeroing_group_ids
            )


def plant_fifo_reuse_when_caching_off(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def free_blocks(blocks_in_eviction_order: Iterable[KVBlock]) -> None:
        to_head, to_tail = release_with_and_condition(blocks_in_eviction_order, pool.enable_caching)
        pool.free_queue.prepend_n(to_head)
        pool.free_queue.append_n(to_tail)

    # The planted copy has no evict_first parameter (kvcore never passes it).
    pool.free_blocks = free_blocks  # type: ignore[method-assign, assignment]


def plant_interleaved_external_alloc(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator

    def allocate_new_computed_blocks(
        request_id: str,
        new_computed_blocks: tuple[list[KVBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> None:
        if any(request_id in m.num_cached_blocks for m in coordinator.managers):
            return
        take_hits_and_external_interleaved(
            coordinator.managers,
            request_id,
            new_computed_blocks,
            num_local_computed_tokens,
            num_external_computed_tokens,
            skip_zeroing_group_ids,
        )

    coordinator.allocate_new_computed_blocks = allocate_new_computed_blocks  # type: ignore[method-assign]


# -- the free queue and the block pool ---------------------------------------


def plant_touch_leaves_free_block_queued(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def touch(blocks: Iterable[KVBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            # The bug: the reference is taken, but a hit block that sat free
            # (ref_cnt 0) is not removed from the free queue, so it can be
            # handed out again while a request holds it.
            block.ref_cnt += 1

    pool.touch = touch  # type: ignore[method-assign]


def plant_free_table_head_first(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def free_table(table: Sequence[KVBlock]) -> None:
        # The bug: the table is passed in position order, so a request's
        # head block (the shared prefix) is reused or evicted first.
        pool.free_blocks(table)

    pool.free_table = free_table  # type: ignore[method-assign]


def plant_reset_discounts_null_block_twice(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def reset_prefix_cache() -> bool:
        num_used_blocks = pool.num_blocks - 1 - pool.free_queue.num_free
        # The bug: "the null block is always in use" is allowed for here, but
        # it was already left out above; one held block slips through and the
        # cache is emptied under it.
        if num_used_blocks > 1:
            return False
        pool.cache.clear()
        for block in pool.blocks:
            block.block_hash = None
        pool.record_event(AllBlocksCleared())
        return True

    pool.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]


# -- the prefix-cache map ----------------------------------------------------


def reuse_cached_blocks_by(pool: kvcore.BlockPool, uncache: Callable[[KVBlock], None]) -> None:
    """Make ``pool.get_new_blocks`` hand out blocks as kvcore does, but drop a reused cached block's
    entry with ``uncache`` in place of the pool's own eviction."""

    def get_new_blocks(n_blocks: int) -> list[KVBlock]:
        if n_blocks < 0:
            raise InvalidArgument("n_blocks", n_blocks, "must be >= 0")
        if n_blocks > pool.free_queue.num_free:
            raise OutOfBlocks(requested=n_blocks, available=pool.free_queue.num_free)
        blocks = pool.free_queue.popleft_n(n_blocks)
        for block in blocks:
            if block.block_hash is not None:
                uncache(block)
            block.ref_cnt = 1
        return blocks

    pool.get_new_blocks = get_new_blocks  # type: ignore[method-assign]


def plant_reused_block_leaves_map_entry(manager: kvcore.KVCacheManager) -> None:
    def forget_hash(block: KVBlock) -> None:
        # The bug: a reused cached block forgets its hash, but its entry
        # stays in the prefix-cache map, pointing at a block that now
        # holds other tokens.
        block.block_hash = None

    reuse_cached_blocks_by(manager.block_pool, forget_hash)


def plant_evict_skips_held_blocks(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def evict_blocks(block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        for block_id in ids:
            if not isinstance(block_id, int) or isinstance(block_id, bool) or not 0 <= block_id < pool.num_blocks:
                raise UnknownBlock(block_id=block_id, num_blocks=pool.num_blocks)
        for block_id in ids:
            block = pool.blocks[block_id]
            # The bug: only free blocks are evicted, on the theory that held
            # ones are dealt with when freed; a block whose external load
            # failed stays in the cache and is hit by the next request.
            if block.block_hash is not None and block.ref_cnt == 0:
                pool._evict(block)

    pool.evict_blocks = evict_blocks  # type: ignore[method-assign]


# -- the single-type managers ------------------------------------------------


class _CeilBoundFullManager(FullAttentionManager):
    """Full attention whose hit scan rounds its token bound up to whole blocks."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: kvcore.BlockPool,
        spec: kvcore.AttentionSpec,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        # The bug: ceil_div where floor division was meant; a hit may now end
        # past max_length (the num_tokens - 1 cap), e.g. on the last block of
        # a block-aligned prompt.
        rounded_up = ceil_div(max_length, spec.block_size) * spec.block_size
        return super().find_longest_cache_hit(block_hashes, rounded_up, group_ids, pool, spec, drop_last, alignment)


def _move_managers(manager: kvcore.KVCacheManager, cls: type[Any], faulty: type[Any]) -> None:
    """Move this manager's single-type managers of class ``cls`` to the subclass ``faulty``."""
    coordinator = manager.coordinator
    for group_manager in coordinator.managers:
        if type(group_manager) is cls:
            group_manager.__class__ = faulty
    # A hybrid coordinator looks hits up through the class it recorded per spec group.
    spec_groups = getattr(coordinator, "spec_groups", None)
    if spec_groups is not None:
        coordinator.spec_groups = tuple(  # type: ignore[attr-defined]
            attrs.evolve(g, manager_class=faulty) if g.manager_class is cls else g for g in spec_groups
        )


def plant_full_hit_rounds_up(manager: kvcore.KVCacheManager) -> None:
    _move_managers(manager, FullAttentionManager, _CeilBoundFullManager)


class _EagleDropWithoutExtraBlockWindow(SlidingWindowManager):
    """A sliding window whose EAGLE drop is applied to a plain lookup."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: kvcore.BlockPool,
        spec: kvcore.AttentionSpec,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        # The bug: the run was matched for the window alone, without the extra
        # block a drop needs, then its last block dropped: the hit's window now
        # starts one block early, at a block nobody found cached.
        hit, _ = super().find_longest_cache_hit(block_hashes, max_length, group_ids, pool, spec, alignment=alignment)
        if drop_last:
            drop_last_block(hit)
        return hit, len(hit[0]) * spec.block_size


def plant_eagle_window_without_extra_block(manager: kvcore.KVCacheManager) -> None:
    _move_managers(manager, SlidingWindowManager, _EagleDropWithoutExtraBlockWindow)


def plant_sliding_window_skip_off_by_one(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, SlidingWindowManager):
            window = group_manager.spec.sliding_window

            def num_skipped_tokens(num_computed_tokens: int, window: int = window) -> int:
                # The bug: the window of the next token is taken to start at
                # n - W instead of n - W + 1, so a block that left every
                # window is kept one step too long.
                return max(0, num_computed_tokens - window)

            group_manager.num_skipped_tokens = num_skipped_tokens  # type: ignore[method-assign]


def plant_chunked_local_skip_uses_last_token(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, ChunkedLocalAttentionManager):
            chunk = group_manager.spec.attention_chunk_size

            def num_skipped_tokens(num_computed_tokens: int, chunk: int = chunk) -> int:
                # The bug: the boundary is the chunk of the last computed
                # token (n - 1), not of the next token (n); when n ends a
                # chunk, the finished chunk's blocks are not freed.
                return max(0, (num_computed_tokens - 1) // chunk * chunk)

            group_manager.num_skipped_tokens = num_skipped_tokens  # type: ignore[method-assign]


# -- the coordinator ---------------------------------------------------------


def plant_hybrid_hit_takes_max(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    spec_groups = getattr(coordinator, "spec_groups", None)
    if spec_groups is None:
        return  # one group or no caching: there is nothing to combine

    def find_longest_cache_hit(block_hashes: Sequence[BlockHash], max_length: int) -> tuple[HitBlocks, int, int]:
        hit_blocks: list[list[KVBlock]] = [[] for _ in coordinator.managers]
        hit_length = 0
        for spec_group in spec_groups:
            blocks, length = spec_group.manager_class.find_longest_cache_hit(
                block_hashes, max_length, spec_group.group_ids, coordinator.pool, spec_group.spec
            )
            for group_id, group_blocks in zip(spec_group.group_ids, blocks):
                hit_blocks[group_id] = group_blocks
            # The bug: the groups' hits are combined with max, not min: the
            # hit is the longest prefix *some* group accepts.
            hit_length = max(hit_length, length)
        return tuple(hit_blocks), hit_length, 0

    coordinator.find_longest_cache_hit = find_longest_cache_hit  # type: ignore[method-assign]


def plant_hit_taken_before_admission(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    block_size = coordinator.managers[0].block_size
    count_blocks = coordinator.num_blocks_to_allocate
    take_hit_then_external = coordinator.allocate_new_computed_blocks
    hit_taken: set[str] = set()

    def num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        num_local_computed_tokens: int | None = None,
        **more: Any,
    ) -> int:
        if apply_admission_cap:  # the whole-request gate counts before anything is taken
            return count_blocks(
                request_id,
                num_tokens,
                new_computed_blocks,
                total_computed_tokens,
                True,
                num_encoder_tokens,
                num_local_computed_tokens=num_local_computed_tokens,
                **more,
            )
        hit_taken.discard(request_id)
        is_new = not any(request_id in m.num_cached_blocks for m in coordinator.managers)
        if is_new and any(new_computed_blocks):
            # The bug: the local hit is taken (touched and entered in the
            # tables) while the blocks are counted, before the admission
            # decision; a refused step keeps it.
            num_local_tokens = len(new_computed_blocks[0]) * block_size
            for group_manager, hit in zip(coordinator.managers, new_computed_blocks):
                group_manager.add_local_computed_blocks(
                    request_id, hit, num_local_tokens, total_computed_tokens - num_local_tokens
                )
            hit_taken.add(request_id)
        return count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_encoder_tokens=num_encoder_tokens,
            num_tokens_main_model=num_tokens_main_model,
            num_local_computed_tokens=num_local_computed_tokens,
            **more,
        )

    def allocate_new_computed_blocks(
        request_id: str,
        new_computed_blocks: HitBlocks,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> None:
        if request_id not in hit_taken:
            take_hit_then_external(
                request_id,
                new_computed_blocks,
                num_local_computed_tokens,
                num_external_computed_tokens,
                skip_zeroing_group_ids,
            )
            return
        # Admitted: the hit is already in the tables; only the external tokens remain.
        hit_taken.discard(request_id)
        if num_external_computed_tokens > 0:
            for group_manager in coordinator.managers:
                group_manager.allocate_external_computed_blocks(
                    request_id,
                    num_local_computed_tokens,
                    num_external_computed_tokens,
                    record_for_zeroing=group_manager.group_id not in skip_zeroing_group_ids,
                )

    # The planted copy takes the trailing options as keywords (**more).
    coordinator.num_blocks_to_allocate = num_blocks_to_allocate  # type: ignore[method-assign, assignment]
    coordinator.allocate_new_computed_blocks = allocate_new_computed_blocks  # type: ignore[method-assign]


# -- lookahead -----------------------------------------------------------------


def plant_admission_ignores_lookahead(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    allocate_slots = manager.allocate_slots
    count_blocks = coordinator.num_blocks_to_allocate

    def allocate_slots_sized_without_lookahead(
        request: kvcore.Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        **admission_gates: Any,
    ) -> Any:
        def blocks_for_computed_tokens(
            request_id: str,
            num_tokens: int,
            hit: Any,
            total_computed: int,
            apply_admission_cap: bool = False,
            num_encoder_tokens: int = 0,
            **more: Any,
        ) -> int:
            if apply_admission_cap:  # the whole-request gate is sized as before
                return count_blocks(request_id, num_tokens, hit, total_computed, True, num_encoder_tokens, **more)
            # The bug: admission is sized for the tokens the step computes; the
            # drafter's lookahead slots are left out, though they are allocated.
            return count_blocks(
                request_id, num_tokens - num_lookahead_tokens, hit, total_computed, False, num_encoder_tokens, **more
            )

        # The planted copy takes the trailing options as keywords (**more).
        coordinator.num_blocks_to_allocate = blocks_for_computed_tokens  # type: ignore[method-assign, assignment]
        try:
            return allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens,
                new_computed_blocks,
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                **admission_gates,
            )
        finally:
            del coordinator.num_blocks_to_allocate

    # The planted copy takes the admission options as keywords (**admission_gates).
    manager.allocate_slots = allocate_slots_sized_without_lookahead  # type: ignore[method-assign, assignment]


# -- speculative steps ---------------------------------------------------------


def plant_spec_output_caches_one_token_short(manager: kvcore.KVCacheManager) -> None:
    cache_blocks = manager.cache_blocks

    def cache_blocks_one_short(request: kvcore.Request, num_computed_tokens: int) -> None:
        # The bug: the last computed token is taken to be still in flight, so a
        # block that the accepted drafts completed is not cached until the next step.
        cache_blocks(request, max(0, num_computed_tokens - 1))

    manager.cache_blocks = cache_blocks_one_short  # type: ignore[method-assign]


# -- async scheduling ------------------------------------------------------------


def window_slides_on_scheduled_tokens(allocate_slots: Any) -> Any:
    """``allocate_slots`` releasing window blocks on the scheduled token count: the request's
    in-flight tokens are taken as processed.  kvcore's and vLLM's managers read the in-flight count
    only there, so hiding it for the call is that bug exactly."""

    def allocate_slots_on_scheduled_tokens(request: Any, *args: Any, **kwargs: Any) -> Any:
        in_flight, request.num_in_flight_tokens = request.num_in_flight_tokens, 0
        try:
            # The bug (the code before async scheduling): remove_skipped_blocks
            # gets total_computed_tokens, not total_computed_tokens minus the
            # tokens of steps still in flight, which read those blocks.
            return allocate_slots(request, *args, **kwargs)
        finally:
            request.num_in_flight_tokens = in_flight

    return allocate_slots_on_scheduled_tokens


def plant_window_slides_on_scheduled_tokens(manager: kvcore.KVCacheManager) -> None:
    manager.allocate_slots = window_slides_on_scheduled_tokens(manager.allocate_slots)  # type: ignore[method-assign]


def popped_in_eviction_order(pop_blocks_for_free: Any) -> Any:
    """``pop_blocks_for_free`` returning the blocks tail first, as ``free`` passes them to the pool;
    the scheduler reverses the list again, so a deferred free evicts the shared prefix first."""

    def pop_tail_first(request_id: str) -> list[Any]:
        blocks: list[Any] = pop_blocks_for_free(request_id)
        # The bug: the popped list is documented in allocation order, but is
        # returned in the order free() releases blocks (the tail first).
        return blocks[::-1]

    return pop_tail_first


def plant_deferred_free_in_eviction_order(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    coordinator.pop_blocks_for_free = popped_in_eviction_order(coordinator.pop_blocks_for_free)  # type: ignore[method-assign]


def load_cached_before_it_lands(allocate_slots: Any) -> Any:
    """``allocate_slots`` caching the blocks of an asynchronous load at allocation, before its KV landed."""

    def allocate_slots_caching_at_once(request: Any, *args: Any, **kwargs: Any) -> Any:
        # The bug: the early return for delay_cache_blocks is lost, so the
        # loaded blocks are hittable while the transfer is still writing them.
        kwargs.pop("delay_cache_blocks", None)
        return allocate_slots(request, *args, **kwargs)

    return allocate_slots_caching_at_once


def plant_delayed_load_cached_at_allocation(manager: kvcore.KVCacheManager) -> None:
    manager.allocate_slots = load_cached_before_it_lands(manager.allocate_slots)  # type: ignore[method-assign]


# -- a drafter's prefill lookahead ------------------------------------------------


def cacheable_counts_reprefillable_tokens(num_tokens: int, group_id: int) -> int:
    """The cacheable count of a coordinator that takes every computed token as final."""
    # The bug: the last num_prefill_lookahead - 1 tokens, which a multi-module
    # drafter may prefill again (rewriting their KV), are not held back.
    return num_tokens


def plant_reprefillable_tokens_cached(manager: kvcore.KVCacheManager) -> None:
    manager.coordinator.num_cacheable_tokens = cacheable_counts_reprefillable_tokens  # type: ignore[method-assign]


# -- admission ---------------------------------------------------------------------


def plant_window_admission_cap_one_block_short(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, SlidingWindowManager) and group_manager.max_admission_blocks is not None:
            # The bug: the cap counts the window's tokens and the tokens in
            # flight, but not the block a window may straddle, so the
            # whole-request gate admits a request one block short.
            group_manager.max_admission_blocks -= 1


# -- KV cache events -----------------------------------------------------------------


def plant_evicted_block_removal_unreported(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def drop_entry_quietly(block: KVBlock) -> None:
        # The bug: the reused block's entry is dropped here directly, not
        # through the eviction path that queues its BlockRemoved; an
        # external cache keeps routing the prefix to this block.
        assert block.block_hash is not None
        pool.cache.pop(block.block_hash, block.block_id)
        block.block_hash = None

    reuse_cached_blocks_by(pool, drop_entry_quietly)


def plant_stored_event_repeats_cached_blocks(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        stored_event = group_manager._stored_event

        def stored_event_from_the_start(
            request: kvcore.Request,
            num_cached: int,
            num_full: int,
            positions: Sequence[int],
            stored_event: Any = stored_event,
            group_manager: Any = group_manager,
        ) -> kvcore.BlockStored:
            # The bug: the event is built for every full block from position 0
            # (parent None), not for the blocks this call newly cached; a
            # consumer counts the blocks cached before as stored twice.
            table = group_manager.req_to_blocks[request.request_id]
            earlier = [p for p in range(num_cached) if table[p].block_hash is not None]
            return stored_event(request, 0, num_full, [*earlier, *positions])  # type: ignore[no-any-return]

        group_manager._stored_event = stored_event_from_the_start  # type: ignore[method-assign]


def plant_reset_unreported(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def reset_prefix_cache() -> bool:
        if pool.free_queue.num_free != pool.num_blocks - 1:
            return False
        pool.cache.clear()
        for block in pool.blocks:
            block.block_hash = None
        # The bug: no AllBlocksCleared is queued; an external cache keeps
        # every prefix the reset dropped.
        return True

    pool.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]


# -- group kinds -----------------------------------------------------------------


def rswa_gap_from_the_prompts_last_block(
    num_computed_tokens: int, num_prompt_tokens: int, rswa_window: int, block_size: int
) -> tuple[int, int]:
    """The R-SWA gap ``[first, end)`` in blocks, its first block rounded down: the bug of
    ``rswa-gap-starts-inside-the-prompt``, shared by the kvcore and vLLM plants."""
    window_start = max(num_prompt_tokens, num_computed_tokens - rswa_window)
    # The bug: the gap starts at the block holding the prompt's last token
    # (rounded down, not up): a prompt that ends inside a block loses that
    # block, whose prompt tokens every later token still attends to.
    return num_prompt_tokens // block_size, window_start // block_size


def plant_rswa_gap_starts_inside_the_prompt(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, RSWAManager):

            def released_block_range(
                num_computed_tokens: int, num_prompt_tokens: int, group_manager: RSWAManager = group_manager
            ) -> tuple[int, int]:
                spec = group_manager.spec
                return rswa_gap_from_the_prompts_last_block(
                    num_computed_tokens, num_prompt_tokens, spec.rswa_window, spec.block_size
                )

            group_manager.released_block_range = released_block_range  # type: ignore[method-assign]


def borrow_method(managers: Iterable[Any], kind: type, name: str, lender: type) -> None:
    """Give every manager of class ``kind`` the method ``name`` as ``lender`` defines it: a manager that
    skips its own override (kvcore's and vLLM's managers alike)."""
    for group_manager in managers:
        if isinstance(group_manager, kind):
            setattr(group_manager, name, types.MethodType(getattr(lender, name), group_manager))


def plant_ring_grows_like_full_attention(manager: kvcore.KVCacheManager) -> None:
    # The bug: the ring's manager takes full attention's growth (a block per
    # block_size tokens) while still counting one block for admission: the ring
    # holds a block per block of tokens, admitted against a count that says one.
    borrow_method(manager.coordinator.managers, CircularBufferManager, "allocate_new_blocks", FullAttentionManager)


def plant_cross_attention_counted_by_decoder_tokens(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    count_blocks = coordinator.num_blocks_to_allocate

    def num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        num_local_computed_tokens: int | None = None,
        **more: Any,
    ) -> int:
        # The bug: cross-attention's blocks are counted like every other
        # group's, for the decoder's tokens, while they are allocated for the
        # encoder's: admission refuses steps that fit, or admits ones that don't.
        return count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
            num_tokens,
            num_tokens_main_model,
            num_local_computed_tokens,
            **more,
        )

    # The planted copy takes the trailing options as keywords (**more).
    coordinator.num_blocks_to_allocate = num_blocks_to_allocate  # type: ignore[method-assign, assignment]


def every_computed_token_skipped(num_computed_tokens: int) -> int:
    """A Mamba group's skipped tokens counted as every computed one: the block holding the last
    computed token's state is freed once that token ends a block, though the next token reads it."""
    return num_computed_tokens


def plant_mamba_frees_the_last_state(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, MambaManager):
            group_manager.num_skipped_tokens = every_computed_token_skipped  # type: ignore[method-assign]


def plant_mamba_speculative_blocks_not_counted(manager: kvcore.KVCacheManager) -> None:
    # The bug: admission counts the slots' blocks only, while the allocation reserves the
    # speculative blocks past them too: a step admitted against the count runs out of blocks.
    borrow_method(manager.coordinator.managers, MambaManager, "num_blocks_to_allocate", SingleTypeManager)


def plant_mla_looked_up_with_full_attention(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    if not isinstance(coordinator, HybridCoordinator):
        return
    # The bug: MLA's spec compares equal to full attention's (a comparison that ignores the spec's
    # type), so MLA layers are looked up and cached with full attention's, and drop a block from
    # their hits whenever a drafter's full-attention layers do.
    full = next((sg for sg in coordinator.spec_groups if type(sg.spec) is kvcore.FullAttentionSpec), None)
    mla = [sg for sg in coordinator.spec_groups if isinstance(sg.spec, kvcore.MLAAttentionSpec)]
    if full is None or not mla:
        return
    merged = attrs.evolve(
        full,
        group_ids=[*full.group_ids, *(g for sg in mla for g in sg.group_ids)],
        drops=full.drops or any(sg.drops for sg in mla),
    )
    kept = [sg for sg in coordinator.spec_groups if not isinstance(sg.spec, kvcore.MLAAttentionSpec)]
    coordinator.spec_groups = tuple(merged if sg is full else sg for sg in kept)
    coordinator.dropping_group_ids = frozenset(g for sg in coordinator.spec_groups if sg.drops for g in sg.group_ids)


def plant_sliding_window_mla_managed_as_mla(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    # The bug: the spec-to-manager table maps sliding-window MLA to MLA's manager (full
    # attention's), so its blocks never leave the window, its hits need every block, and
    # admission has no cap for it.
    for group_manager in coordinator.managers:
        if isinstance(group_manager.spec, kvcore.SlidingWindowMLASpec):
            group_manager.__class__ = FullAttentionManager
            group_manager.max_admission_blocks = None
    if isinstance(coordinator, HybridCoordinator):
        coordinator.spec_groups = tuple(
            attrs.evolve(sg, manager_class=FullAttentionManager)
            if isinstance(sg.spec, kvcore.SlidingWindowMLASpec)
            else sg
            for sg in coordinator.spec_groups
        )


# -- block sizes --------------------------------------------------------------------


def plant_hits_aligned_to_the_hash_size(manager: kvcore.KVCacheManager) -> None:
    # The bug: a hybrid cache aligns hits to the hash granularity instead of the scheduler block size;
    # a hit may then end inside a larger group's block, which the request goes on to write.
    coordinator = manager.coordinator
    coordinator.hit_alignment = coordinator.config.hash_block_size


def plant_partial_key_outlives_eviction(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def evict(block: KVBlock) -> None:
        assert block.block_hash is not None
        block_hash, group_id = block.block_hash
        pool.cache.pop(block.block_hash, block.block_id)
        block.block_hash = None
        # The bug: the block forgets its partial keys, but the map keeps them (a stale partial entry).
        pool._more_keys.pop(block.block_id, None)
        pool._partial_tokens.pop(block.block_id, None)
        pool.record_event(BlockRemoved((block_hash,), group_id))

    pool._evict = evict  # type: ignore[method-assign]


def plant_sliding_window_caches_unreachable_blocks(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, SlidingWindowManager):
            # The bug: every full block is cached, also those no hit on a scheduler-block boundary needs.
            group_manager.cached_positions = (  # type: ignore[method-assign]
                lambda request, start, end, replay_boundaries: list(range(start, end))
            )


def plant_retention_drops_the_replay_boundary(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, SlidingWindowManager):
            cached_positions = group_manager.cached_positions

            def without_replay_boundaries(
                request: kvcore.Request,
                start: int,
                end: int,
                replay_boundaries: Sequence[int],
                cached_positions: Any = cached_positions,
            ) -> list[int]:
                # The bug: the replay boundaries are not passed on, so under a
                # retention interval a resend of the prompt finds no window
                # before its last token and falls back to an interval's end.
                return cached_positions(request, start, end, ())  # type: ignore[no-any-return]

            group_manager.cached_positions = without_replay_boundaries  # type: ignore[method-assign]


def plant_shared_prefix_boundary_dropped(manager: kvcore.KVCacheManager) -> None:
    get_computed_blocks = manager.get_computed_blocks

    def hit_without_shared_prefix(request: kvcore.Request) -> tuple[HitBlocks, int]:
        hit = get_computed_blocks(request)
        # The bug: the scheduler keeps the hit but not the shared prefix the
        # lookup found, so a window under a retention interval never keeps the
        # end of a prefix another group cached, and requests sharing it miss.
        request.shared_prefix_boundary = 0
        return hit

    # The planted copy has no max_cache_hit_length parameter (kvcore's target never passes it).
    manager.get_computed_blocks = hit_without_shared_prefix  # type: ignore[method-assign, assignment]


def plant_replicated_group_sharded(manager: kvcore.KVCacheManager) -> None:
    config = manager.coordinator.config
    for group_id in config.dcp_replicated_group_ids:
        # The bug: the manager block size is scaled by the world size passed in,
        # not by the group's own (1 for a draft model's replicated layers), so a
        # replicated group's table gets a block per world-size blocks of slots.
        manager.coordinator.managers[group_id].block_size = config.groups[group_id].block_size * config.dcp_world_size


def plant_window_frees_by_rank_blocks(manager: kvcore.KVCacheManager) -> None:
    config = manager.coordinator.config
    for group_id, group_manager in enumerate(manager.coordinator.managers):
        if isinstance(group_manager, SlidingWindowManager | ChunkedLocalAttentionManager):
            rank_block_size = config.groups[group_id].block_size

            def released_in_rank_blocks(
                num_computed_tokens: int,
                num_prompt_tokens: int,
                group_manager: SingleTypeManager = group_manager,
                rank_block_size: int = rank_block_size,
            ) -> tuple[int, int]:
                # The bug: the skipped tokens are counted in the spec's blocks on
                # one rank, not in the manager's (DCP-sized) blocks, so blocks
                # still inside the window are freed.
                return 0, group_manager.num_skipped_tokens(num_computed_tokens) // rank_block_size

            group_manager.released_block_range = released_in_rank_blocks  # type: ignore[method-assign]


def first_run_state(
    lookup: Callable[[int], Any], num_positions: int, block_size: int, alignment: int
) -> tuple[int, Any] | None:
    """An align-mode Mamba state search written like full attention's: left to right over the first
    ``num_positions`` positions, ending at the first one ``lookup`` finds nothing cached at; the last
    position found on ``alignment``, with what ``lookup`` returned there.  The state a hit needs is
    only the one at its end, and the positions before a chunk's end hold no state at all, so this
    misses every hit whose earlier states are not cached."""
    found = None
    for position in range(num_positions):
        cached = lookup(position)
        if cached is None:
            break
        if (position + 1) * block_size % alignment == 0:
            found = (position, cached)
    return found


class _StateSearchStopsAtFirstMiss(AlignedMambaManager):
    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: Any,
        spec: Any,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        block_size = spec.block_size
        hashes = block_hashes_at(block_hashes, pool.hash_block_size, block_size)
        found = first_run_state(
            lambda position: pool.get_cached_block(hashes[position], group_ids),
            min(max_length // block_size, len(hashes)),
            block_size,
            alignment or block_size,
        )
        if found is None:
            return tuple([] for _ in group_ids), 0
        position, cached = found
        return tuple([pool.null_block] * position + [block] for block in cached), (position + 1) * block_size


def aligned_mamba_managers(manager: kvcore.KVCacheManager) -> list[AlignedMambaManager]:
    """The manager's Mamba groups in the ``align`` mode."""
    return [m for m in manager.coordinator.managers if isinstance(m, AlignedMambaManager)]


def plant_mamba_align_allocates_lookahead_slots(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    allocate = coordinator.allocate_new_blocks

    def allocate_new_blocks(
        request_id: str, num_tokens: int, num_encoder_tokens: int = 0, num_tokens_main_model: int | None = None
    ) -> tuple[list[KVBlock], ...]:
        # Every group grown to every slot: an align-mode Mamba group's too, the drafter's lookahead included.
        return allocate(request_id, num_tokens, num_encoder_tokens)

    coordinator.allocate_new_blocks = allocate_new_blocks  # type: ignore[method-assign]


def plant_mamba_state_search_stops_at_first_miss(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    for group_manager in aligned_mamba_managers(manager):
        group_manager.__class__ = _StateSearchStopsAtFirstMiss
    if isinstance(coordinator, HybridCoordinator):
        coordinator.spec_groups = tuple(
            attrs.evolve(spec_group, manager_class=_StateSearchStopsAtFirstMiss)
            if spec_group.manager_class is AlignedMambaManager
            else spec_group
            for spec_group in coordinator.spec_groups
        )


def whole_block_drop(manager_class: type, drop: str, alignment: str) -> type:
    """A subclass of the full-attention ``manager_class`` (kvcore's or vLLM's) whose lookup, asked to drop
    for an EAGLE drafter (keyword ``drop``), drops one of its blocks where it should drop one hit unit
    (a hash block with sub-block hits; keyword ``alignment``), and trims its blocks to the shorter hit."""

    def find_longest_cache_hit(cls: type, *args: Any, **kwargs: Any) -> tuple[Any, int]:
        spec = args[4] if len(args) > 4 else kwargs["kv_cache_spec"]
        block_size, step = spec.block_size, kwargs.get(alignment) or spec.block_size
        dropping = kwargs.get(drop, False) and step < block_size and block_size % step == 0
        if dropping:
            kwargs[drop] = False
        hit, length = super(subclass, cls).find_longest_cache_hit(*args, **kwargs)
        if dropping and length:
            # The bug: the drop is the block-granular one of a cache without sub-block hits.
            length = max(0, length - block_size)
            for blocks in hit:
                del blocks[ceil_div(length, block_size) :]
        return hit, length

    subclass: type[Any] = type(
        f"WholeBlockDrop{manager_class.__name__}",
        (manager_class,),
        {"find_longest_cache_hit": classmethod(find_longest_cache_hit)},
    )
    return subclass


def block_granular_lookup(manager_class: type, alignment: str) -> type:
    """A subclass of the full-attention ``manager_class`` (kvcore's or vLLM's R-SWA manager) whose lookup,
    given sub-block hits (keyword ``alignment`` below its block size), probes whole blocks only, as a
    sliding window's lookup does: its hits end on its own block boundaries."""

    def find_longest_cache_hit(cls: type, *args: Any, **kwargs: Any) -> tuple[Any, int]:
        spec = args[4] if len(args) > 4 else kwargs["kv_cache_spec"]
        if (kwargs.get(alignment) or spec.block_size) < spec.block_size:
            # The bug: the lookup takes the block-granular path of a window that cannot stop inside a block.
            kwargs[alignment] = spec.block_size
        found: tuple[Any, int] = super(subclass, cls).find_longest_cache_hit(*args, **kwargs)
        return found

    subclass: type[Any] = type(
        f"BlockGranular{manager_class.__name__}",
        (manager_class,),
        {"find_longest_cache_hit": classmethod(find_longest_cache_hit)},
    )
    return subclass


def swap_lookup_class(coordinator: Any, manager_class: type, make: Callable[[type], type]) -> None:
    """kvcore's hybrid coordinator looks up its spec groups of exactly ``manager_class`` with
    ``make(manager_class)`` instead (a single-group coordinator is left alone)."""
    if isinstance(coordinator, HybridCoordinator):
        coordinator.spec_groups = tuple(
            attrs.evolve(spec_group, manager_class=make(spec_group.manager_class))
            if spec_group.manager_class is manager_class
            else spec_group
            for spec_group in coordinator.spec_groups
        )


def plant_eagle_drops_a_block_inside_sub_block_hits(manager: kvcore.KVCacheManager) -> None:
    # The bug: with sub-block hits, full attention's lookup for an EAGLE drafter drops a whole block of
    # its hit, not one hash block: hits come out shorter than vLLM's, and a drafter recomputes a block
    # of tokens the cache holds.
    swap_lookup_class(
        manager.coordinator, FullAttentionManager, lambda cls: whole_block_drop(cls, "drop_last", "alignment")
    )


def plant_rswa_hits_stop_at_whole_blocks(manager: kvcore.KVCacheManager) -> None:
    # The bug: R-SWA's lookup probes whole blocks only, as a sliding window's does, though the coordinator
    # counts it among the groups that take sub-block hits: beside Mamba states cached inside its blocks,
    # every hit ends on an R-SWA block boundary and the tokens up to the state are computed again.
    swap_lookup_class(manager.coordinator, RSWAManager, lambda cls: block_granular_lookup(cls, "alignment"))


def plant_sub_block_hits_beside_a_window_hashed_finer(manager: kvcore.KVCacheManager) -> None:
    # The bug: the coordinator turns sub-block hits on whenever an align-mode Mamba group's blocks are
    # larger than the hashes, never asking whether every group in the prefix cache can stop a lookup
    # inside its blocks: a sliding-window or chunked-local group hashed finer is asked for hits on the
    # hash size, which its block-granular lookup cannot give.
    coordinator, config = manager.coordinator, manager.config
    if config.states_finer_than_hashes and not config.partial_hits:
        coordinator.hit_alignment = config.hash_block_size
        for group_manager in coordinator.managers:
            group_manager.hit_alignment = config.hash_block_size


class _OneRankSubBlockRule(kvcore.KVCacheConfig):
    """A config that asks for sub-block hits by the one-rank rule under any world size."""

    @property
    def asks_for_sub_block_hits(self) -> bool:
        return self.states_finer_than_hashes


def plant_sub_block_hits_off_under_dcp_at_equal_sizes(manager: kvcore.KVCacheManager) -> None:
    # The bug: sub-block hits are asked for by the one-rank rule under decode context parallelism too
    # (Mamba states in blocks larger than the hashes), though there the sharded full-attention blocks,
    # dcp_world_size times larger, are the ones hits end inside: with states at the hash size, hits stay
    # on the scheduler block size and the tokens past the last whole sharded block are computed again.
    config = manager.config
    if config.dcp_world_size == 1 or not config.partial_hits:
        return
    planted = _OneRankSubBlockRule(**{field.name: getattr(config, field.name) for field in attrs.fields(type(config))})
    if planted.partial_hits:
        return
    manager.config = manager.coordinator.config = planted
    manager.coordinator.hit_alignment = planted.scheduler_block_size
    for group_manager in manager.coordinator.managers:
        group_manager.hit_alignment = planted.scheduler_block_size


def padding_counted(count: int, num_positions: int) -> int:
    """An align-mode Mamba admission count that counts a block for every position up to the last slot
    (``num_positions`` past the table and the hit), null padding included, where one block is taken."""
    return count + max(0, num_positions - 1)


Recount = Callable[[SingleTypeManager, int, str, int, Sequence[KVBlock], int], int]
"""A planted admission count: (group manager, its count, request id, slots, hit blocks, tokens of the
local hit) -> the count the bug gives."""


def recount_blocks(group_manager: SingleTypeManager, recount: Recount) -> None:
    """Plant ``recount`` into the group manager's admission count.  A count above the pool (a Mamba
    state cached this step: refused either way) is left as it is."""
    count_blocks = group_manager.num_blocks_to_allocate

    def num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
        **more: Any,
    ) -> int:
        count = count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
            num_local_computed_tokens,
            **more,
        )
        if count > group_manager.pool.num_blocks:
            return count
        local = total_computed_tokens if num_local_computed_tokens is None else num_local_computed_tokens
        return recount(group_manager, count, request_id, num_tokens, new_computed_blocks, local)

    group_manager.num_blocks_to_allocate = num_blocks_to_allocate  # type: ignore[method-assign]


def plant_mamba_align_counts_the_padding(manager: kvcore.KVCacheManager) -> None:
    def recount(
        group_manager: SingleTypeManager,
        count: int,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        local: int,
    ) -> int:
        table = group_manager.req_to_blocks.get(request_id, ())
        num_positions = ceil_div(num_tokens, group_manager.block_size) - len(new_computed_blocks) - len(table)
        return padding_counted(count, num_positions)

    for group_manager in aligned_mamba_managers(manager):
        recount_blocks(group_manager, recount)


def counted_as_allocated(allocated: set[str], request_id: str, count: Callable[[], int]) -> int:
    """An align-mode Mamba admission count taken as if the request had had an allocation already (in
    ``allocated``): a request's first allocation is capped at one new block, its speculative blocks
    left out, while the allocation takes them."""
    first = request_id not in allocated
    allocated.add(request_id)
    try:
        return count()
    finally:
        if first:
            allocated.discard(request_id)


def plant_mamba_align_speculative_blocks_not_counted(manager: kvcore.KVCacheManager) -> None:
    for group_manager in aligned_mamba_managers(manager):
        count_blocks = group_manager.num_blocks_to_allocate

        def num_blocks_to_allocate(
            request_id: str,
            *args: Any,
            group_manager: AlignedMambaManager = group_manager,
            count_blocks: Callable[..., int] = count_blocks,
            **more: Any,
        ) -> int:
            return counted_as_allocated(
                group_manager.allocated_requests, request_id, lambda: count_blocks(request_id, *args, **more)
            )

        group_manager.num_blocks_to_allocate = num_blocks_to_allocate  # type: ignore[method-assign]


def after_hit_taken(group_managers: Iterable[Any], then: Callable[[Any, str, Sequence[Any]], None]) -> None:
    """Run ``then(group_manager, request_id, hit_blocks)`` each time a group manager has taken a hit
    (``add_local_computed_blocks``, a name kvcore's and vLLM's managers share)."""
    for group_manager in group_managers:
        take_hit = group_manager.add_local_computed_blocks

        def add_local_computed_blocks(
            request_id: str,
            new_computed_blocks: Sequence[Any],
            *args: Any,
            group_manager: Any = group_manager,
            take_hit: Callable[..., None] = take_hit,
        ) -> None:
            take_hit(request_id, new_computed_blocks, *args)
            then(group_manager, request_id, new_computed_blocks)

        group_manager.add_local_computed_blocks = add_local_computed_blocks


def plant_partial_hit_not_copied(manager: kvcore.KVCacheManager) -> None:
    # The bug: a hit ending inside a block is not recorded for its copy on write, so the request's
    # table keeps the shared block, where it writes its next tokens.
    after_hit_taken(
        manager.coordinator.managers,
        lambda group_manager, request_id, _: group_manager.partial_hits.pop(request_id, None),
    )


def plant_copy_block_not_counted(manager: kvcore.KVCacheManager) -> None:
    def recount(
        group_manager: SingleTypeManager,
        count: int,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        local: int,
    ) -> int:
        copies = group_manager.has_partial_hit(new_computed_blocks, local) or request_id in group_manager.partial_hits
        # The bug: the block a copy on write takes is not counted, while the allocation takes it.
        return count - 1 if copies else count

    for group_manager in manager.coordinator.managers:
        recount_blocks(group_manager, recount)


def plant_state_entry_left_on_written_block(manager: kvcore.KVCacheManager) -> None:
    # The bug: the copy of a state a request cached inside the block it goes on writing is queued, but
    # the cache entry stays on that block, which the request then overwrites.
    manager.block_pool.move_block_hashes = lambda source, destination: None  # type: ignore[method-assign]


# -- prefill checkpoints -------------------------------------------------------------


def allocate_without_checkpoint(group_managers: Iterable[Any], checkpoints: str) -> None:
    """Each align-mode Mamba allocation runs as if no prefill checkpoint were recorded (the group
    manager's dict named ``checkpoints``), which the caching after it still finds: the checkpoint's
    position is padded with the null block."""
    for group_manager in group_managers:
        allocate = group_manager.allocate_new_blocks

        def allocate_new_blocks(
            request_id: str,
            *args: Any,
            group_manager: Any = group_manager,
            allocate: Callable[..., list[Any]] = allocate,
        ) -> list[Any]:
            recorded = getattr(group_manager, checkpoints)
            checkpoint = recorded.pop(request_id, None)
            try:
                return allocate(request_id, *args)
            finally:
                if checkpoint is not None:
                    recorded[request_id] = checkpoint

        group_manager.allocate_new_blocks = allocate_new_blocks


def keep_transient_checkpoints(group_managers: Iterable[Any], cache_checkpoint: str, pool: str, evict: str) -> None:
    """The group managers' method named ``cache_checkpoint`` runs with the method named ``evict`` of their
    block pool (their attribute named ``pool``), which drops a transient checkpoint's keys and nothing
    else there, doing nothing."""
    for group_manager in group_managers:
        cache = getattr(group_manager, cache_checkpoint)
        block_pool = getattr(group_manager, pool)

        def cache_keeping_keys(
            *args: Any, block_pool: Any = block_pool, cache: Callable[..., Any] = cache, **kwargs: Any
        ) -> Any:
            setattr(block_pool, evict, lambda *_: None)
            try:
                return cache(*args, **kwargs)
            finally:
                delattr(block_pool, evict)

        setattr(group_manager, cache_checkpoint, cache_keeping_keys)


def plant_checkpoint_block_left_null(manager: kvcore.KVCacheManager) -> None:
    # The bug: the allocation pads a prefill checkpoint's position with the null block, as any position a
    # chunk skips; admission counted a block for it, and the backend exports the checkpoint there.
    allocate_without_checkpoint(aligned_mamba_managers(manager), "checkpoints")


def plant_transient_checkpoint_keeps_its_key(manager: kvcore.KVCacheManager) -> None:
    # The bug: a transient checkpoint's block keeps the full key its position was cached under this step,
    # though it holds the state at another boundary.
    keep_transient_checkpoints(aligned_mamba_managers(manager), "_cache_checkpoint", "pool", "evict_blocks")


def cache_every_state(group_managers: Iterable[Any], keeps_every_state: str, keep: Callable[..., Any]) -> None:
    """The group managers' method named ``keeps_every_state`` (what decides which states a retention
    interval keeps) is replaced by ``keep``, which answers that it keeps all of them."""
    for group_manager in group_managers:
        setattr(group_manager, keeps_every_state, keep)


def ignore_prefill_end(coordinator: Any, count_blocks: str) -> None:
    """The coordinator's method named ``count_blocks`` runs with ``prefill_end=0`` whatever it is given."""
    count = getattr(coordinator, count_blocks)

    def count_without_prefill_end(*args: Any, **kwargs: Any) -> Any:
        kwargs["prefill_end"] = 0
        return count(*args, **kwargs)

    setattr(coordinator, count_blocks, count_without_prefill_end)


class _HoldsNothing(set[Any]):
    """A set that drops whatever is added to it."""

    def add(self, element: Any) -> None:
        pass


def forget_states_cached_this_step(group_managers: Iterable[Any], cached_this_step: str) -> None:
    """The group managers' set named ``cached_this_step`` (the states cached in the current scheduler step,
    which a hit must wait for) keeps nothing."""
    for group_manager in group_managers:
        setattr(group_manager, cached_this_step, _HoldsNothing())


def plant_state_hit_in_the_step_that_caches_it(manager: kvcore.KVCacheManager) -> None:
    # The bug: the Mamba group does not remember the states it cached in this scheduler step, so a request
    # scheduled in the same step hits a state whose forward pass has not run yet.
    forget_states_cached_this_step(aligned_mamba_managers(manager), "cached_this_step")


def clear_manager_flag(group_managers: Iterable[Any], flag: str) -> None:
    """The group managers' boolean attribute named ``flag``, which their coordinator or manager sets
    from the configuration, is cleared: the group acts as if the feature were off."""
    for group_manager in group_managers:
        setattr(group_manager, flag, False)


def plant_checkpoint_ignores_the_eagle_drop(manager: kvcore.KVCacheManager) -> None:
    # The bug: the coordinator does not tell the Mamba groups that an EAGLE drafter drops the attention
    # groups' last hit block, so checkpoints stay at the boundary short of the last token, a block above
    # where the attention groups' hits land.
    clear_manager_flag(aligned_mamba_managers(manager), "drops_checkpoint_block")


def plant_shared_prefix_state_left_uncached(manager: kvcore.KVCacheManager) -> None:
    # The bug: the configuration's shared-prefix checkpoint flag, narrowed by the manager, never reaches
    # the Mamba groups: the scheduler ends a chunk on the junction for a state no group caches.
    clear_manager_flag(aligned_mamba_managers(manager), "shared_prefix_checkpoint")


def plant_retention_caches_every_state(manager: kvcore.KVCacheManager) -> None:
    # The bug: an align-mode Mamba group under a retention interval caches its states as densely as with
    # none (as if it kept the base class's dense policy), every checkpoint on a block boundary too.
    cache_every_state(aligned_mamba_managers(manager), "_states_per_segment", lambda: None)


def plant_checkpoint_before_the_prefill_end(manager: kvcore.KVCacheManager) -> None:
    # The bug: the coordinator does not hand the prefill's end to the Mamba groups under a retention
    # interval of 0, so every chunk reserves (and writes) a prefill checkpoint.
    ignore_prefill_end(manager.coordinator, "num_blocks_to_allocate")


# -- zeroing records -----------------------------------------------------------------
# kvcore's and vLLM's group managers share these names: ``new_block_ids``, ``take_new_block_ids``,
# ``add_local_computed_blocks`` and ``allocate_external_computed_blocks(..., record_for_zeroing=...)``.


def keep_zeroing_record(group_managers: Sequence[Any]) -> None:
    """The record of blocks to zero is handed over but never emptied."""
    for group_manager in group_managers:

        def take_new_block_ids(group_manager: Any = group_manager) -> list[int]:
            # The bug: a copy of the record, which keeps every block taken since the manager was built.
            return list(group_manager.new_block_ids)

        group_manager.take_new_block_ids = take_new_block_ids


def record_hit_blocks_for_zeroing(group_managers: Sequence[Any], records: Callable[[Any], bool]) -> None:
    """A prefix hit's blocks are recorded for zeroing as they enter the table (``records`` tells
    whether a group manager records its blocks)."""

    def record_hit(group_manager: Any, request_id: str, hit_blocks: Sequence[Any]) -> None:
        if records(group_manager):
            # The bug: the hit is recorded like new blocks, so the worker wipes the cached tokens.
            group_manager.new_block_ids.extend(block.block_id for block in hit_blocks if not block.is_null)

    after_hit_taken(group_managers, record_hit)


def zero_asynchronous_loads(group_managers: Sequence[Any]) -> None:
    """External tokens' blocks are recorded for zeroing even when an asynchronous load writes them."""
    for group_manager in group_managers:
        allocate = group_manager.allocate_external_computed_blocks

        def allocate_external_computed_blocks(
            request_id: str,
            num_local_computed_tokens: int,
            num_external_computed_tokens: int,
            record_for_zeroing: bool = True,
            allocate: Callable[..., None] = allocate,
        ) -> None:
            # The bug: the groups a load lands in later (skip_zeroing_group_ids) are zeroed all the same.
            allocate(request_id, num_local_computed_tokens, num_external_computed_tokens, record_for_zeroing=True)

        group_manager.allocate_external_computed_blocks = allocate_external_computed_blocks


def plant_zeroing_record_not_drained(manager: kvcore.KVCacheManager) -> None:
    keep_zeroing_record(manager.coordinator.managers)


def plant_hit_blocks_zeroed(manager: kvcore.KVCacheManager) -> None:
    record_hit_blocks_for_zeroing(manager.coordinator.managers, lambda group_manager: group_manager.records_new_blocks)


def plant_async_load_blocks_zeroed(manager: kvcore.KVCacheManager) -> None:
    zero_asynchronous_loads(manager.coordinator.managers)


def keep_state_hits_whole(
    manager: Any,
    group_managers: Sequence[Any],
    state_managers: Sequence[Any],
    groups_of: Callable[[Any], Sequence[Any]],
    wrap: Callable[[Any], Any],
) -> None:
    """``truncate_computed_blocks`` cuts every group's hit back but those of ``state_managers`` (among the
    manager's ``group_managers``, in group order), which it returns whole (``groups_of``: a hit's blocks
    per group; ``wrap``: blocks per group as the manager returns them)."""
    truncate = manager.truncate_computed_blocks
    kept = {id(group_manager) for group_manager in state_managers}

    def truncate_computed_blocks(blocks: Any, num_computed_tokens: int) -> Any:
        cut = groups_of(truncate(blocks, num_computed_tokens))
        # The bug: the cut is made in the attention groups only, and an align-mode Mamba group keeps the
        # state the hit ended on, past the endpoint the load starts from.
        return wrap(
            tuple(
                list(whole) if id(group_manager) in kept else list(part)
                for group_manager, whole, part in zip(group_managers, groups_of(blocks), cut, strict=True)
            )
        )

    manager.truncate_computed_blocks = truncate_computed_blocks


def offer_written_blocks_for_their_copies(
    state_manager: Any, offers_of: Callable[[], list[Any]], copies_of: Callable[[], list[Any]], block_index: int
) -> None:
    """``allocate_new_blocks`` of an align-mode Mamba group offers a connector the block each copy it
    queues copies from, in place of the copy: ``offers_of`` and ``copies_of`` give the group's pending
    offers (tuples, the block at ``block_index``) and copies (source, destination) as they are now."""
    allocate = state_manager.allocate_new_blocks

    def allocate_new_blocks(*args: Any, **kwargs: Any) -> Any:
        num_offers = len(offers_of())
        added = allocate(*args, **kwargs)
        source_of = {id(destination): source for source, destination in copies_of()}
        offers = offers_of()
        for index in range(num_offers, len(offers)):
            offer = list(offers[index])
            # The bug: the hand-off names the block the state was cached inside, which the request goes on
            # writing, instead of the copy that keeps the state.
            offer[block_index] = source_of.get(id(offer[block_index]), offer[block_index])
            offers[index] = tuple(offer)
        return added

    state_manager.allocate_new_blocks = allocate_new_blocks


def offer_finished_tails_whatever_followed(
    state_manager: Any, method: str, tails_of: Callable[[], dict[str, Any]], offer: Callable[[Any], Any]
) -> None:
    """An align-mode Mamba group's ``method`` (a finishing request's partial-tail offload) offers the
    state the request cached inside the block it was writing whenever one is recorded (``tails_of``: the
    group's records, ``offer``: a record as the method returns it), not only when no later token reached
    that block."""

    def finalize(request_id: str, num_computed_tokens: int, num_in_flight_tokens: int) -> Any:
        # The bug: the tokens computed since the state, and those in flight, are not looked at.
        tail = tails_of().pop(request_id, None)
        return None if tail is None else offer(tail)

    setattr(state_manager, method, finalize)


def plant_finished_tail_offered_after_later_tokens(manager: kvcore.KVCacheManager) -> None:
    for state_manager in aligned_mamba_managers(manager):

        def tails_of(state_manager: AlignedMambaManager = state_manager) -> dict[str, tuple[KVBlock, int]]:
            return state_manager.producer_tails

        offer_finished_tails_whatever_followed(state_manager, "finalize_tail_offload", tails_of, lambda tail: tail)


def plant_state_offered_from_its_written_block(manager: kvcore.KVCacheManager) -> None:
    for state_manager in aligned_mamba_managers(manager):

        def offers_of(state_manager: AlignedMambaManager = state_manager) -> list[tuple[str, KVBlock, int]]:
            return state_manager.state_offloads

        def copies_of(state_manager: AlignedMambaManager = state_manager) -> list[tuple[KVBlock, KVBlock]]:
            return state_manager.pending_copies

        offer_written_blocks_for_their_copies(state_manager, offers_of, copies_of, 1)


def plant_truncated_hit_keeps_its_state(manager: kvcore.KVCacheManager) -> None:
    keep_state_hits_whole(
        manager,
        manager.coordinator.managers,
        aligned_mamba_managers(manager),
        lambda blocks: blocks,
        lambda blocks: blocks,
    )
