"""Catalogued faults expressed against vLLM 0.33.0, planted into one KVCacheManager instance.

Like kvcheck.faults for kvcore: the installed package is never edited; the
fault patches attributes of the manager object a target just built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcheck.fault_plants import (
    after_hit_taken,
    allocate_without_checkpoint,
    block_granular_lookup,
    borrow_method,
    cache_every_state,
    cacheable_counts_reprefillable_tokens,
    clear_manager_flag,
    counted_as_allocated,
    every_computed_token_skipped,
    first_run_state,
    forget_states_cached_this_step,
    ignore_prefill_end,
    keep_state_hits_whole,
    keep_transient_checkpoints,
    keep_zeroing_record,
    load_cached_before_it_lands,
    offer_finished_tails_whatever_followed,
    offer_written_blocks_for_their_copies,
    padding_counted,
    popped_in_eviction_order,
    record_hit_blocks_for_zeroing,
    release_with_and_condition,
    rswa_gap_from_the_prompts_last_block,
    take_hits_and_external_interleaved,
    whole_block_drop,
    window_slides_on_scheduled_tokens,
    zero_asynchronous_loads,
)
from kvcheck.faults import Fault
from kvcheck.targets.vllm_internals import clear_cache_map, event_extra_keys, lookahead_token_ids
from kvcheck.targets.vllm_target import require_vllm
from kvmodel.config import TargetConfig


def _fifo_reuse_when_caching_off(manager: Any) -> None:
    pool = manager.block_pool

    def free_blocks(ordered_blocks: Any) -> None:
        # vLLM PR #48017 as merged.
        to_head, to_tail = release_with_and_condition(ordered_blocks, pool.enable_caching)
        pool.free_block_queue.prepend_n(to_head)
        pool.free_block_queue.append_n(to_tail)

    pool.free_blocks = free_blocks


def _interleaved_external_alloc(manager: Any) -> None:
    coordinator = manager.coordinator

    def allocate_new_computed_blocks(
        request_id: str,
        new_computed_blocks: Any,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> None:
        managers = coordinator.single_type_managers
        if any(request_id in m.num_cached_block for m in managers):
            return
        # Before the fix of issue #33775.
        take_hits_and_external_interleaved(
            managers,
            request_id,
            new_computed_blocks,
            num_local_computed_tokens,
            num_external_computed_tokens,
            skip_zeroing_group_ids,
        )

    coordinator.allocate_new_computed_blocks = allocate_new_computed_blocks


def _admission_ignores_lookahead(manager: Any) -> None:
    coordinator = manager.coordinator
    count_blocks: Callable[..., int] = coordinator.get_num_blocks_to_allocate

    def blocks_for_main_model_tokens(**kwargs: Any) -> int:
        # The bug: admission is sized for the main model's tokens; the
        # drafter's lookahead slots are left out, though they are allocated.
        return count_blocks(**{**kwargs, "num_tokens": kwargs["num_tokens_main_model"]})

    coordinator.get_num_blocks_to_allocate = blocks_for_main_model_tokens


def _spec_output_caches_one_token_short(manager: Any) -> None:
    cache_blocks = manager.cache_blocks

    def cache_blocks_one_short(request: Any, num_computed_tokens: int) -> None:
        # The bug: the last computed token is taken to be still in flight.
        cache_blocks(request, max(0, num_computed_tokens - 1))

    manager.cache_blocks = cache_blocks_one_short


def _eagle_window_without_extra_block(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    class EagleDropWithoutExtraBlockWindow(SlidingWindowManager):  # type: ignore[misc]
        @classmethod
        def _contiguous_blocks_for_hit(cls, window_size: int, block_size: int, use_eagle: bool) -> int:
            # The bug: the EAGLE drop still pops the last matched block, but the
            # run it pops from is only as long as the window needs without it.
            return -(-(window_size - 1) // block_size)

    coordinator = manager.coordinator
    for group_manager in coordinator.single_type_managers:
        if type(group_manager) is SlidingWindowManager:
            group_manager.__class__ = EagleDropWithoutExtraBlockWindow
    # The hybrid coordinator looks hits up through the class it recorded per spec group.
    if hasattr(coordinator, "attention_groups"):
        coordinator.attention_groups = [
            group._replace(manager_cls=EagleDropWithoutExtraBlockWindow)
            if group.manager_cls is SlidingWindowManager
            else group
            for group in coordinator.attention_groups
        ]


def _reprefillable_tokens_cached(manager: Any) -> None:
    manager.coordinator.get_num_cacheable_tokens = cacheable_counts_reprefillable_tokens


def _window_admission_cap_one_block_short(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, SlidingWindowManager):
            # The bug: the cap without the block a window may straddle.
            group_manager.max_admission_blocks_per_request -= 1


def _window_slides_on_scheduled_tokens(manager: Any) -> None:
    manager.allocate_slots = window_slides_on_scheduled_tokens(manager.allocate_slots)


def _deferred_free_in_eviction_order(manager: Any) -> None:
    coordinator = manager.coordinator
    coordinator.pop_blocks_for_free = popped_in_eviction_order(coordinator.pop_blocks_for_free)


def _delayed_load_cached_at_allocation(manager: Any) -> None:
    manager.allocate_slots = load_cached_before_it_lands(manager.allocate_slots)


# -- KV cache events -----------------------------------------------------------


def _pools(manager: Any) -> list[Any]:
    """Every block pool of this manager (its groups' managers may hold their own), each once."""
    managers = manager.coordinator.single_type_managers
    return list(dict.fromkeys([manager.block_pool, *(m.block_pool for m in managers)]))


def _evicted_block_removal_unreported(manager: Any) -> None:
    for pool in _pools(manager):

        def get_new_blocks(num_blocks: int, pool: Any = pool) -> list[Any]:
            if num_blocks > pool.get_num_free_blocks():
                raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
            ret: list[Any] = pool.free_block_queue.popleft_n(num_blocks)
            if pool._reuse_watchers:
                pool._notify_reuse(ret)
            for block in ret:
                if pool.enable_caching:
                    if pool.metrics_collector:
                        pool.metrics_collector.on_block_evicted(block)
                    # The bug: the reused block's hashes are dropped directly, not
                    # through _maybe_evict_cached_block, which reports them: no
                    # BlockRemoved is queued.
                    pool._remove_cached_block_hashes(block)
                assert block.ref_cnt == 0
                block.ref_cnt += 1
                if pool.metrics_collector:
                    pool.metrics_collector.on_block_allocated(block)
            return ret

        pool.get_new_blocks = get_new_blocks


def _stored_event_repeats_cached_blocks(manager: Any) -> None:
    from vllm.distributed.kv_events import BlockStored
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash, resolve_block_hashes

    release = require_vllm().release
    for pool in _pools(manager):
        cache_full_blocks = pool.cache_full_blocks

        def cache_full_blocks_reported_from_the_start(
            request: Any,
            blocks: list[Any],
            num_cached_blocks: int,
            num_full_blocks: int,
            block_size: int,
            kv_cache_group_id: int,
            block_mask: list[bool] | None = None,
            pool: Any = pool,
            cache_full_blocks: Any = cache_full_blocks,
        ) -> None:
            queued = len(pool.kv_event_queue)
            cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, block_mask
            )
            if len(pool.kv_event_queue) == queued or not isinstance(pool.kv_event_queue[-1], BlockStored):
                return
            # The bug: the event is built for every full block from position 0
            # (parent None), not for the blocks this call newly cached; a
            # consumer counts the blocks cached before as stored twice.
            block_hashes = resolve_block_hashes(request.block_hashes, pool.hash_block_size, block_size)
            positions = [
                i
                for i in range(num_full_blocks)
                if not blocks[i].is_null
                and (i < num_cached_blocks or block_mask is None or block_mask[i - num_cached_blocks])
            ]
            extra_keys_list = []
            curr_mm_idx = 0
            extra_keys_of = event_extra_keys(pool, release)
            for i in positions:
                extra_keys, curr_mm_idx = extra_keys_of(request, i * block_size, (i + 1) * block_size, curr_mm_idx)
                extra_keys_list.append(extra_keys)
            pool.kv_event_queue[-1] = pool._build_block_stored_event(
                request,
                block_hashes=[maybe_convert_block_hash(block_hashes[i]) for i in positions],
                parent_block_hash=None,
                start_token_idx=0,
                end_token_idx=num_full_blocks * block_size,
                block_size=block_size,
                kv_cache_group_id=kv_cache_group_id,
                extra_keys_list=extra_keys_list,
                lookahead_token_ids=[
                    lookahead_token_ids(pool, release)(request, (i + 1) * block_size) for i in positions
                ]
                if pool.num_hash_lookahead_tokens
                else None,
            )

        pool.cache_full_blocks = cache_full_blocks_reported_from_the_start


def _reset_unreported(manager: Any) -> None:
    release = require_vllm().release
    for pool in _pools(manager):

        def reset_prefix_cache(pool: Any = pool) -> bool:
            if pool.num_gpu_blocks - pool.get_num_free_blocks() != 1:  # the null block is always used
                return False
            clear_cache_map(pool, release)
            pool.cached_block_hashes_by_block.clear()
            if pool._reuse_watchers:
                pool._notify_reuse([pool.blocks[block_id] for block_id in list(pool._reuse_watchers)])
            for block in pool.blocks:
                block.reset_hash()
            if pool.metrics_collector:
                pool.metrics_collector.reset()
            # The bug: no AllBlocksCleared is queued; an external cache keeps
            # every prefix the reset dropped.
            return True

        pool.reset_prefix_cache = reset_prefix_cache


def _rswa_gap_starts_inside_the_prompt(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import RSWAManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, RSWAManager):

            def remove_skipped_blocks(
                request_id: str,
                processed_computed_tokens: int,
                num_prompt_tokens: int | None = None,
                group_manager: Any = group_manager,
            ) -> None:
                if num_prompt_tokens is None:
                    return
                first, end = rswa_gap_from_the_prompts_last_block(
                    processed_computed_tokens, num_prompt_tokens, group_manager.rswa_window, group_manager.block_size
                )
                group_manager._remove_blocks_in_range(request_id, first, end)

            group_manager.remove_skipped_blocks = remove_skipped_blocks


def _ring_grows_like_full_attention(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import CircularBufferManager, FullAttentionManager

    managers = manager.coordinator.single_type_managers
    borrow_method(managers, CircularBufferManager, "allocate_new_blocks", FullAttentionManager)


def _cross_attention_counted_by_decoder_tokens(manager: Any) -> None:
    coordinator = manager.coordinator
    count_blocks: Callable[..., int] = coordinator.get_num_blocks_to_allocate

    def blocks_for_decoder_tokens(**kwargs: Any) -> int:
        # The bug: cross-attention's blocks are counted for the decoder's tokens.
        return count_blocks(**{**kwargs, "num_encoder_tokens": kwargs["num_tokens"]})

    coordinator.get_num_blocks_to_allocate = blocks_for_decoder_tokens


def _mamba_frees_the_last_state(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, MambaManager):
            group_manager.get_num_skipped_tokens = every_computed_token_skipped


def _mamba_speculative_blocks_not_counted(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager, SingleTypeKVCacheManager

    # The count skips MambaManager's override (the speculative blocks), the allocation keeps it.
    managers = manager.coordinator.single_type_managers
    borrow_method(managers, MambaManager, "get_num_blocks_to_allocate", SingleTypeKVCacheManager)


def _mla_looked_up_with_full_attention(manager: Any) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    coordinator = manager.coordinator
    groups = getattr(coordinator, "attention_groups", None)
    if groups is None:
        return
    full = next((g for g in groups if type(g.spec) is FullAttentionSpec), None)
    mla = [g for g in groups if isinstance(g.spec, MLAAttentionSpec)]
    if full is None or not mla:
        return
    merged = full._replace(
        group_ids=[*full.group_ids, *(i for g in mla for i in g.group_ids)],
        use_eagle=full.use_eagle or any(g.use_eagle for g in mla),
    )
    coordinator.attention_groups = [merged if g is full else g for g in groups if g not in mla]
    if merged.use_eagle:
        for group_id in merged.group_ids:
            coordinator.single_type_managers[group_id].use_eagle = True


def _sliding_window_mla_managed_as_mla(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    coordinator = manager.coordinator
    for group_manager in coordinator.single_type_managers:
        if isinstance(group_manager.kv_cache_spec, SlidingWindowMLASpec):
            group_manager.__class__ = FullAttentionManager
            group_manager.max_admission_blocks_per_request = None
    groups = getattr(coordinator, "attention_groups", None)
    if groups is not None:
        coordinator.attention_groups = [
            g._replace(manager_cls=FullAttentionManager) if isinstance(g.spec, SlidingWindowMLASpec) else g
            for g in groups
        ]


def _partial_key_outlives_eviction(manager: Any) -> None:
    pool = manager.block_pool

    def remove_cached_block_hashes(block: Any) -> list[Any]:
        removed = []
        if block.block_hash is not None and pool.cached_block_hash_to_block.pop(block.block_hash, block.block_id):
            removed.append(block.block_hash)
        # The bug: the block's partial keys are forgotten, not popped from the map.
        pool.cached_block_hashes_by_block.pop(block.block_id, None)
        block.reset_hash()
        return removed

    pool._remove_cached_block_hashes = remove_cached_block_hashes


def _replicated_group_sharded(manager: Any) -> None:
    from vllm.v1.kv_cache_interface import AttentionSpec

    coordinator = manager.coordinator
    # (A unitary coordinator keeps its one manager's world size: 1 for a lone replicated group.)
    world_size = getattr(coordinator, "dcp_world_size", 1)
    for group_manager in coordinator.single_type_managers:
        spec = group_manager.kv_cache_spec
        if isinstance(spec, AttentionSpec) and not spec.dcp_sharded:
            # The bug: SingleTypeKVCacheManager.__init__ scaling the block size by the
            # dcp_world_size argument instead of self.dcp_world_size (1 when not sharded).
            group_manager.block_size = spec.block_size * world_size
    if hasattr(coordinator, "group_block_sizes"):
        coordinator.group_block_sizes = tuple(m.block_size for m in coordinator.single_type_managers)


def _window_frees_by_rank_blocks(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import ChunkedLocalAttentionManager, SlidingWindowManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, SlidingWindowManager | ChunkedLocalAttentionManager):
            remove_skipped_blocks = group_manager.remove_skipped_blocks

            def in_rank_blocks(
                request_id: str,
                processed_computed_tokens: int,
                num_prompt_tokens: int | None = None,
                group_manager: Any = group_manager,
                remove_skipped_blocks: Any = remove_skipped_blocks,
            ) -> None:
                # The bug: num_skipped_tokens // self.kv_cache_spec.block_size, the block
                # size on one rank, where the manager's blocks hold dcp_world_size times more.
                manager_block_size = group_manager.block_size
                group_manager.block_size = group_manager.kv_cache_spec.block_size
                try:
                    remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)
                finally:
                    group_manager.block_size = manager_block_size

            group_manager.remove_skipped_blocks = in_rank_blocks


def _sliding_window_caches_unreachable_blocks(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, SlidingWindowManager):
            # The bug: no mask, every full block cached.
            group_manager.reachable_block_mask = lambda *args, **kwargs: None


def _retention_drops_the_replay_boundary(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, SlidingWindowManager):
            cache_blocks = group_manager.cache_blocks

            def without_replay_boundaries(
                request: Any,
                num_tokens: int,
                retention_interval: int | None = None,
                *,
                replay_boundaries: Any,
                cache_blocks: Any = cache_blocks,
            ) -> None:
                # The bug: the replay boundaries are not passed on to the mask.
                cache_blocks(request, num_tokens, retention_interval, replay_boundaries=())

            group_manager.cache_blocks = without_replay_boundaries


def _shared_prefix_boundary_dropped(manager: Any) -> None:
    get_computed_blocks = manager.get_computed_blocks

    def hit_without_shared_prefix(request: Any, max_cache_hit_length: int | None = None) -> Any:
        blocks, num_tokens, _ = get_computed_blocks(request, max_cache_hit_length)
        # The bug: the shared prefix the lookup found is dropped.
        return blocks, num_tokens, 0

    manager.get_computed_blocks = hit_without_shared_prefix


def _align_mode_mamba_managers(manager: Any) -> list[Any]:
    """The manager's Mamba groups in the ``align`` mode."""
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    return [
        group_manager
        for group_manager in manager.coordinator.single_type_managers
        if isinstance(group_manager, MambaManager) and group_manager.mamba_cache_mode == "align"
    ]


def _mamba_state_search_stops_at_first_miss(manager: Any) -> None:
    from vllm.v1.core.kv_cache_utils import resolve_block_hashes
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    class StateSearchStopsAtFirstMiss(MambaManager):  # type: ignore[misc]  # vLLM's class is untyped (Any)
        @classmethod
        def find_longest_cache_hit(
            cls,
            block_hashes: Any,
            max_length: int,
            kv_cache_group_ids: list[int],
            block_pool: Any,
            kv_cache_spec: Any,
            drop_eagle_block: bool,
            alignment_tokens: int,
            dcp_world_size: int = 1,
            pcp_world_size: int = 1,
        ) -> tuple[tuple[list[Any], ...], int]:
            block_size = kv_cache_spec.block_size
            hashes = resolve_block_hashes(
                block_hashes,
                block_pool.hash_block_size,
                block_size,
                supports_fine_grained_hash_lookup=True,
                alignment_tokens=alignment_tokens,
            )
            found = first_run_state(
                lambda position: block_pool.get_cached_block(hashes[position], kv_cache_group_ids),
                min(max_length // block_size, len(hashes)),
                block_size,
                alignment_tokens,
            )
            if found is None:
                return tuple([] for _ in kv_cache_group_ids), 0
            position, cached = found
            null = block_pool.null_block
            return tuple([null] * position + [block] for block in cached), (position + 1) * block_size

    coordinator = manager.coordinator
    for group_manager in _align_mode_mamba_managers(manager):
        group_manager.__class__ = StateSearchStopsAtFirstMiss
    groups = getattr(coordinator, "attention_groups", None)
    if groups is not None:
        coordinator.attention_groups = [
            group._replace(manager_cls=StateSearchStopsAtFirstMiss) if group.manager_cls is MambaManager else group
            for group in groups
        ]


def _recount_blocks(group_manager: Any, recount: Callable[[Any, int, str, int, Any, int], int]) -> None:
    """Plant ``recount(group_manager, count, request_id, num_tokens_main_model, hit blocks, tokens of
    the local hit)`` into a vLLM group manager's admission count; a count above the pool (a Mamba state
    cached this step: refused either way) is left as it is."""
    count_blocks: Callable[..., int] = group_manager.get_num_blocks_to_allocate

    def get_num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        count = count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_local_computed_tokens,
            num_tokens_main_model,
            apply_admission_cap=apply_admission_cap,
            prefill_end=prefill_end,
        )
        if count > group_manager.block_pool.num_gpu_blocks:
            return count
        return recount(
            group_manager, count, request_id, num_tokens_main_model, new_computed_blocks, num_local_computed_tokens
        )

    group_manager.get_num_blocks_to_allocate = get_num_blocks_to_allocate


def _mamba_align_counts_the_padding(manager: Any) -> None:
    def recount(
        group_manager: Any, count: int, request_id: str, num_tokens: int, new_computed_blocks: Any, local: int
    ) -> int:
        table = group_manager.req_to_blocks[request_id]
        num_positions = -(-num_tokens // group_manager.block_size) - len(new_computed_blocks)
        return padding_counted(count, num_positions - len(table))

    for group_manager in _align_mode_mamba_managers(manager):
        _recount_blocks(group_manager, recount)


def _mamba_align_allocates_lookahead_slots(manager: Any) -> None:
    for group_manager in _align_mode_mamba_managers(manager):
        allocate = group_manager.allocate_new_blocks

        def allocate_new_blocks(
            request_id: str, num_tokens: int, num_tokens_main_model: int, allocate: Any = allocate
        ) -> Any:
            return allocate(request_id, num_tokens, num_tokens)

        group_manager.allocate_new_blocks = allocate_new_blocks


def _mamba_align_speculative_blocks_not_counted(manager: Any) -> None:
    for group_manager in _align_mode_mamba_managers(manager):
        count_blocks = group_manager.get_num_blocks_to_allocate

        def get_num_blocks_to_allocate(
            request_id: str,
            *args: Any,
            group_manager: Any = group_manager,
            count_blocks: Any = count_blocks,
            **kwargs: Any,
        ) -> int:
            return counted_as_allocated(
                group_manager._allocated_block_reqs, request_id, lambda: count_blocks(request_id, *args, **kwargs)
            )

        group_manager.get_num_blocks_to_allocate = get_num_blocks_to_allocate


def _partial_hit_not_copied(manager: Any) -> None:
    after_hit_taken(
        manager.coordinator.single_type_managers,
        lambda group_manager, request_id, _: group_manager._partial_hit_reqs.pop(request_id, None),
    )


def _copy_block_not_counted(manager: Any) -> None:
    def recount(
        group_manager: Any, count: int, request_id: str, num_tokens: int, new_computed_blocks: Any, local: int
    ) -> int:
        copies = group_manager._has_partial_local_hit(new_computed_blocks, local) or (
            request_id in group_manager._partial_hit_reqs
        )
        return count - 1 if copies else count

    for group_manager in manager.coordinator.single_type_managers:
        _recount_blocks(group_manager, recount)


def _state_entry_left_on_written_block(manager: Any) -> None:
    manager.block_pool.move_block_hashes = lambda source, destination: None


def _checkpoint_block_left_null(manager: Any) -> None:
    allocate_without_checkpoint(_align_mode_mamba_managers(manager), "_checkpoints")


def _transient_checkpoint_keeps_its_key(manager: Any) -> None:
    keep_transient_checkpoints(
        _align_mode_mamba_managers(manager), "_cache_partial_tail_block", "block_pool", "_maybe_evict_cached_block"
    )


def _state_hit_in_the_step_that_caches_it(manager: Any) -> None:
    forget_states_cached_this_step(_align_mode_mamba_managers(manager), "cached_blocks_this_step")


def _checkpoint_ignores_the_eagle_drop(manager: Any) -> None:
    clear_manager_flag(_align_mode_mamba_managers(manager), "drop_eagle_checkpoint_block")


def _shared_prefix_state_left_uncached(manager: Any) -> None:
    clear_manager_flag(_align_mode_mamba_managers(manager), "shared_prefix_checkpoint")


def _swap_lookup_class(coordinator: Any, manager_class: type, make: Any) -> None:
    """vLLM's hybrid coordinator looks up its spec groups of exactly ``manager_class`` with
    ``make(manager_class)`` instead."""
    if hasattr(coordinator, "attention_groups"):
        coordinator.attention_groups = [
            group._replace(manager_cls=make(group.manager_cls)) if group.manager_cls is manager_class else group
            for group in coordinator.attention_groups
        ]


def _eagle_drops_a_block_inside_sub_block_hits(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    _swap_lookup_class(
        manager.coordinator,
        FullAttentionManager,
        lambda cls: whole_block_drop(cls, "drop_eagle_block", "alignment_tokens"),
    )


def _rswa_hits_stop_at_whole_blocks(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import RSWAManager

    _swap_lookup_class(manager.coordinator, RSWAManager, lambda cls: block_granular_lookup(cls, "alignment_tokens"))


def _sub_block_hits_beside_a_window_hashed_finer(manager: Any) -> None:
    from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled

    coordinator = manager.coordinator
    if not hasattr(coordinator, "attention_groups") or coordinator.enable_partial_hash_hits:
        return  # not the hybrid coordinator, or sub-block hits are on anyway
    # As if the coordinator asked without its managers' classes (which can take sub-block lookups).
    if partial_hash_hits_enabled(
        coordinator.kv_cache_config.kv_cache_groups, coordinator.hash_block_size, coordinator.dcp_world_size
    ):
        coordinator.enable_partial_hash_hits = True
        for group_manager in coordinator.single_type_managers:
            group_manager.cache_hit_alignment_tokens = coordinator.hash_block_size


def _sub_block_hits_off_under_dcp_at_equal_sizes(manager: Any) -> None:
    from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled

    coordinator = manager.coordinator
    if not getattr(coordinator, "enable_partial_hash_hits", False) or coordinator.dcp_world_size == 1:
        return
    # As if partial_hash_hits_enabled compared the Mamba blocks with the hashes as on one rank.
    classes = [type(group_manager) for group_manager in coordinator.single_type_managers]
    if not partial_hash_hits_enabled(
        coordinator.kv_cache_config.kv_cache_groups, coordinator.hash_block_size, 1, classes
    ):
        coordinator.enable_partial_hash_hits = False
        for group_manager in coordinator.single_type_managers:
            group_manager.cache_hit_alignment_tokens = coordinator.scheduler_block_size


def _retention_caches_every_state(manager: Any) -> None:
    cache_every_state(_align_mode_mamba_managers(manager), "reachable_block_mask", lambda *_, **__: None)


def _checkpoint_before_the_prefill_end(manager: Any) -> None:
    ignore_prefill_end(manager.coordinator, "get_num_blocks_to_allocate")


def _zeroing_record_not_drained(manager: Any) -> None:
    keep_zeroing_record(manager.coordinator.single_type_managers)


def _hit_blocks_zeroed(manager: Any) -> None:
    record_hit_blocks_for_zeroing(
        manager.coordinator.single_type_managers, lambda group_manager: group_manager.records_new_block_ids
    )


def _async_load_blocks_zeroed(manager: Any) -> None:
    zero_asynchronous_loads(manager.coordinator.single_type_managers)


def _truncated_hit_keeps_its_state(manager: Any) -> None:
    keep_state_hits_whole(
        manager,
        manager.coordinator.single_type_managers,
        _align_mode_mamba_managers(manager),
        lambda blocks: blocks.blocks,
        manager.create_kv_cache_blocks,
    )


def _state_offered_from_its_written_block(manager: Any) -> None:
    for state_manager in _align_mode_mamba_managers(manager):

        def offers_of(state_manager: Any = state_manager) -> Any:
            return state_manager._pending_boundary_state_offloads

        def copies_of(state_manager: Any = state_manager) -> Any:
            return state_manager._pending_cow_copies

        offer_written_blocks_for_their_copies(state_manager, offers_of, copies_of, 2)


def _finished_tail_offered_after_later_tokens(manager: Any) -> None:
    for state_manager in _align_mode_mamba_managers(manager):

        def tails_of(state_manager: Any = state_manager) -> Any:
            return state_manager._producer_partial_tail_reqs

        def offer(tail: Any, state_manager: Any = state_manager) -> tuple[Any, ...]:
            return (state_manager.kv_cache_group_id, *tail)

        offer_finished_tails_whatever_followed(state_manager, "finalize_partial_tail_offload", tails_of, offer)


VLLM_FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault(
            "fifo-reuse-when-caching-off",
            "vLLM BlockPool.free_blocks with `hash is None and enable_caching` (seed 000)",
            _fifo_reuse_when_caching_off,
        ),
        Fault(
            "interleaved-external-alloc",
            "vLLM coordinator allocating external blocks group by group, before later groups touch their hits "
            "(seed 003)",
            _interleaved_external_alloc,
        ),
        Fault(
            "admission-ignores-lookahead",
            "vLLM allocate_slots sizing admission for the main model's tokens, without the lookahead slots",
            _admission_ignores_lookahead,
        ),
        Fault(
            "spec-output-caches-one-token-short",
            "vLLM cache_blocks after a speculative step's output stopping one token short",
            _spec_output_caches_one_token_short,
        ),
        Fault(
            "eagle-window-without-extra-block",
            "vLLM SlidingWindowManager dropping an EAGLE hit's last block from a run without the extra block",
            _eagle_window_without_extra_block,
        ),
        Fault(
            "reprefillable-tokens-cached",
            "vLLM's coordinator counting every computed token as cacheable, the re-prefillable ones too",
            _reprefillable_tokens_cached,
        ),
        Fault(
            "window-admission-cap-one-block-short",
            "vLLM's sliding-window admission cap without the block a window may straddle",
            _window_admission_cap_one_block_short,
        ),
        Fault(
            "window-slides-on-scheduled-tokens",
            "vLLM allocate_slots releasing sliding-window blocks on the scheduled, not the processed, tokens",
            _window_slides_on_scheduled_tokens,
        ),
        Fault(
            "deferred-free-in-eviction-order",
            "vLLM pop_blocks_for_free returning the blocks tail first",
            _deferred_free_in_eviction_order,
        ),
        Fault(
            "delayed-load-cached-at-allocation",
            "vLLM allocate_slots caching an asynchronous load's blocks before the load lands",
            _delayed_load_cached_at_allocation,
        ),
        Fault(
            "evicted-block-removal-unreported",
            "vLLM get_new_blocks dropping a reused cached block's hashes without queuing its BlockRemoved",
            _evicted_block_removal_unreported,
        ),
        Fault(
            "stored-event-repeats-cached-blocks",
            "vLLM cache_full_blocks reporting every full block from position 0 in its BlockStored, not only "
            "the newly cached ones",
            _stored_event_repeats_cached_blocks,
        ),
        Fault(
            "reset-unreported",
            "vLLM reset_prefix_cache emptying the prefix cache without queuing AllBlocksCleared",
            _reset_unreported,
        ),
        Fault(
            "rswa-gap-starts-inside-the-prompt",
            "vLLM RSWAManager starting the gap at the block holding the prompt's last token (rounded down)",
            _rswa_gap_starts_inside_the_prompt,
        ),
        Fault(
            "ring-grows-like-full-attention",
            "vLLM CircularBufferManager allocating like full attention while counting one block",
            _ring_grows_like_full_attention,
        ),
        Fault(
            "cross-attention-counted-by-decoder-tokens",
            "vLLM's coordinator counting cross-attention's blocks for the decoder's tokens",
            _cross_attention_counted_by_decoder_tokens,
        ),
        Fault(
            "mamba-frees-the-last-state",
            "vLLM MambaManager.get_num_skipped_tokens returning every computed token",
            _mamba_frees_the_last_state,
        ),
        Fault(
            "mamba-speculative-blocks-not-counted",
            "vLLM MambaManager counting its blocks without the speculative blocks it allocates",
            _mamba_speculative_blocks_not_counted,
        ),
        Fault(
            "mla-looked-up-with-full-attention",
            "vLLM's coordinator grouping MLA layers with full attention's for the hit lookup",
            _mla_looked_up_with_full_attention,
        ),
        Fault(
            "sliding-window-mla-managed-as-mla",
            "vLLM's spec registry giving SlidingWindowMLASpec MLA's manager (FullAttentionManager)",
            _sliding_window_mla_managed_as_mla,
        ),
        Fault(
            "partial-key-outlives-eviction",
            "vLLM BlockPool._remove_cached_block_hashes popping a block's own hash but only forgetting its partial "
            "keys (left in the map)",
            _partial_key_outlives_eviction,
        ),
        Fault(
            "sliding-window-caches-unreachable-blocks",
            "vLLM SlidingWindowManager.reachable_block_mask returning no mask: every full block cached",
            _sliding_window_caches_unreachable_blocks,
        ),
        Fault(
            "retention-drops-the-replay-boundary",
            "vLLM SlidingWindowManager.cache_blocks building its mask without the replay boundaries",
            _retention_drops_the_replay_boundary,
        ),
        Fault(
            "shared-prefix-boundary-dropped",
            "vLLM's scheduler dropping the shared_prefix_boundary get_computed_blocks returns",
            _shared_prefix_boundary_dropped,
        ),
        Fault(
            "replicated-group-sharded",
            "vLLM SingleTypeKVCacheManager.__init__ scaling every group's block size by the dcp_world_size "
            "argument, a replicated draft group's too",
            _replicated_group_sharded,
        ),
        Fault(
            "window-frees-by-rank-blocks",
            "vLLM SingleTypeKVCacheManager.remove_skipped_blocks dividing the skipped tokens by the spec's block "
            "size on one rank, not the manager's",
            _window_frees_by_rank_blocks,
        ),
        Fault(
            "mamba-state-search-stops-at-first-miss",
            "vLLM MambaManager.find_longest_cache_hit in the align mode scanning left to right and stopping at the "
            "first state not cached",
            _mamba_state_search_stops_at_first_miss,
        ),
        Fault(
            "mamba-align-counts-the-padding",
            "vLLM MambaManager.get_num_blocks_to_allocate in the align mode without its one-block cap: every "
            "position up to the last slot counted, null padding included",
            _mamba_align_counts_the_padding,
        ),
        Fault(
            "mamba-align-speculative-blocks-not-counted",
            "vLLM MambaManager.get_num_blocks_to_allocate in the align mode capping a request's first allocation "
            "at one block, as if it were in _allocated_block_reqs",
            _mamba_align_speculative_blocks_not_counted,
        ),
        Fault(
            "mamba-align-allocates-lookahead-slots",
            "vLLM MambaManager.allocate_new_blocks in the align mode without `num_tokens = num_tokens_main_model`: "
            "the table grows to the drafter's lookahead slots too",
            _mamba_align_allocates_lookahead_slots,
        ),
        Fault(
            "partial-hit-not-copied",
            "vLLM SingleTypeKVCacheManager.add_local_computed_blocks without recording a hit ending inside a block "
            "in _partial_hit_reqs: no copy on write",
            _partial_hit_not_copied,
        ),
        Fault(
            "copy-block-not-counted",
            "vLLM get_num_blocks_to_allocate without the block a partial hit's copy on write takes",
            _copy_block_not_counted,
        ),
        Fault(
            "state-entry-left-on-written-block",
            "vLLM MambaManager.allocate_new_blocks queueing a producer's copy without BlockPool.move_block_hashes",
            _state_entry_left_on_written_block,
        ),
        Fault(
            "checkpoint-block-left-null",
            "vLLM MambaManager.allocate_new_blocks in the align mode run as if _checkpoints held nothing for the "
            "request: the checkpoint's position padded with the null block",
            _checkpoint_block_left_null,
        ),
        Fault(
            "transient-checkpoint-keeps-its-key",
            "vLLM MambaManager._cache_partial_tail_block without BlockPool._maybe_evict_cached_block for a "
            "transient checkpoint",
            _transient_checkpoint_keeps_its_key,
        ),
        Fault(
            "retention-caches-every-state",
            "vLLM MambaManager.reachable_block_mask returning None (cache every state) whatever the interval",
            _retention_caches_every_state,
        ),
        Fault(
            "checkpoint-before-the-prefill-end",
            "vLLM KVCacheCoordinator.get_num_blocks_to_allocate run with prefill_end=0 under an interval of 0",
            _checkpoint_before_the_prefill_end,
        ),
        Fault(
            "checkpoint-ignores-the-eagle-drop",
            "vLLM MambaManager.drop_eagle_checkpoint_block left False though the coordinator serves an EAGLE drafter",
            _checkpoint_ignores_the_eagle_drop,
        ),
        Fault(
            "eagle-drops-a-block-inside-sub-block-hits",
            "vLLM FullAttentionManager.find_longest_cache_hit dropping block_size, not min(alignment_tokens, "
            "block_size), for an EAGLE drafter",
            _eagle_drops_a_block_inside_sub_block_hits,
        ),
        Fault(
            "shared-prefix-state-left-uncached",
            "vLLM MambaManager.shared_prefix_checkpoint left False though KVCacheManager turned the checkpoint on",
            _shared_prefix_state_left_uncached,
        ),
        Fault(
            "rswa-hits-stop-at-whole-blocks",
            "vLLM RSWAManager.find_longest_cache_hit called with alignment_tokens raised to its block size",
            _rswa_hits_stop_at_whole_blocks,
        ),
        Fault(
            "sub-block-hits-beside-a-window-hashed-finer",
            "vLLM KVCacheCoordinator calling partial_hash_hits_enabled without its managers' classes",
            _sub_block_hits_beside_a_window_hashed_finer,
        ),
        Fault(
            "sub-block-hits-off-under-dcp-at-equal-sizes",
            "vLLM partial_hash_hits_enabled comparing the Mamba blocks with the hashes by the one-rank rule "
            "under decode context parallelism",
            _sub_block_hits_off_under_dcp_at_equal_sizes,
        ),
        Fault(
            "state-hit-in-the-step-that-caches-it",
            "vLLM MambaManager.cached_blocks_this_step keeping nothing added to it",
            _state_hit_in_the_step_that_caches_it,
        ),
        Fault(
            "zeroing-record-not-drained",
            "vLLM SingleTypeKVCacheManager.take_new_block_ids returning a copy of new_block_ids without emptying it",
            _zeroing_record_not_drained,
        ),
        Fault(
            "hit-blocks-zeroed",
            "vLLM add_local_computed_blocks appending the hit's blocks to new_block_ids",
            _hit_blocks_zeroed,
        ),
        Fault(
            "async-load-blocks-zeroed",
            "vLLM allocate_external_computed_blocks recording for zeroing whatever record_for_zeroing says",
            _async_load_blocks_zeroed,
        ),
        Fault(
            "truncated-hit-keeps-its-state",
            "vLLM KVCacheManager.truncate_computed_blocks slicing the attention groups only (an align-mode "
            "Mamba group's hit returned whole)",
            _truncated_hit_keeps_its_state,
        ),
        Fault(
            "state-offered-from-its-written-block",
            "vLLM MambaManager.allocate_new_blocks queueing the boundary-state hand-off of a running request's "
            "copy on write with source_block instead of cow_block",
            _state_offered_from_its_written_block,
        ),
        Fault(
            "finished-tail-offered-after-later-tokens",
            "vLLM MambaManager.finalize_partial_tail_offload returning the producer's tail without checking "
            "num_computed_tokens and num_in_flight_tokens",
            _finished_tail_offered_after_later_tokens,
        ),
    )
}


def vllm_target_with(name: str) -> Any:
    """A vLLM target factory with the named seed fault planted."""
    from kvcheck.targets.vllm_target import VllmTarget

    try:
        fault = VLLM_FAULTS[name]
    except KeyError:
        raise ValueError(f"fault {name!r} is not expressed against vLLM; these are: {', '.join(VLLM_FAULTS)}") from None

    def make(config: TargetConfig) -> VllmTarget:
        return VllmTarget(config, plant=fault.plant)

    return make
