"""Catalogued faults expressed against vLLM 0.33.0, planted into one KVCacheManager instance.

Like kvcheck.faults for kvcore: the installed package is never edited; the
fault patches attributes of the manager object a target just built.
"""

from __future__ import annotations

from typing import Any

from kvcheck.config import TargetConfig
from kvcheck.fault_plants import (
    cacheable_counts_reprefillable_tokens,
    load_cached_before_it_lands,
    popped_in_eviction_order,
    release_with_and_condition,
    take_hits_and_external_interleaved,
    window_slides_on_scheduled_tokens,
)
from kvcheck.faults import Fault


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
            managers, request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )

    coordinator.allocate_new_computed_blocks = allocate_new_computed_blocks


def _admission_ignores_lookahead(manager: Any) -> None:
    coordinator = manager.coordinator
    count_blocks = coordinator.get_num_blocks_to_allocate

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
