"""Mamba groups: the states they free, count and look up, and how far their tables grow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import (
    aligned_mamba_managers,
    aligned_mamba_managers_in_vllm,
    borrow_method,
    recount_blocks,
    recount_blocks_in_vllm,
)
from kvcore.block import KVBlock
from kvcore.blocks_math import ceil_div
from kvcore.coordinator import HybridCoordinator
from kvcore.hashing import BlockHash
from kvcore.managers.base import HitBlocks, SingleTypeManager, block_hashes_at
from kvcore.managers.mamba import AlignedMambaManager, MambaManager

FAMILY = Family()


def every_computed_token_skipped(num_computed_tokens: int) -> int:
    """A Mamba group's skipped tokens counted as every computed one: the block holding the last
    computed token's state is freed once that token ends a block, though the next token reads it."""
    return num_computed_tokens


def plant_mamba_frees_the_last_state(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, MambaManager):
            group_manager.num_skipped_tokens = every_computed_token_skipped  # type: ignore[method-assign]


def plant_mamba_frees_the_last_state_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, MambaManager):
            group_manager.get_num_skipped_tokens = every_computed_token_skipped


FAMILY.declare(
    FaultDeclaration(
        number=27,
        name="mamba-frees-the-last-state",
        description=(
            "a Mamba group counts every computed token as skipped (not all but the last): the "
            "block holding the state the next token reads is freed"
        ),
        kvcore=plant_mamba_frees_the_last_state,
        vllm=VllmPlant(
            number=17,
            description="vLLM MambaManager.get_num_skipped_tokens returning every computed token",
            plant=plant_mamba_frees_the_last_state_in_vllm,
        ),
    )
)


def plant_mamba_speculative_blocks_not_counted(manager: kvcore.KVCacheManager) -> None:
    # The bug: admission counts the slots' blocks only, while the allocation reserves the
    # speculative blocks past them too: a step admitted against the count runs out of blocks.
    borrow_method(manager.coordinator.managers, MambaManager, "num_blocks_to_allocate", SingleTypeManager)


def plant_mamba_speculative_blocks_not_counted_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager, SingleTypeKVCacheManager

    # The count skips MambaManager's override (the speculative blocks), the allocation keeps it.
    managers = manager.coordinator.single_type_managers
    borrow_method(managers, MambaManager, "get_num_blocks_to_allocate", SingleTypeKVCacheManager)


FAMILY.declare(
    FaultDeclaration(
        number=28,
        name="mamba-speculative-blocks-not-counted",
        description=(
            "admission counts a Mamba group's blocks for the slots only, while allocation reserves "
            "its speculative blocks too"
        ),
        kvcore=plant_mamba_speculative_blocks_not_counted,
        vllm=VllmPlant(
            number=18,
            description=("vLLM MambaManager counting its blocks without the speculative blocks it allocates"),
            plant=plant_mamba_speculative_blocks_not_counted_in_vllm,
        ),
    )
)


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


def plant_mamba_state_search_stops_at_first_miss_in_vllm(manager: Any) -> None:
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
    for group_manager in aligned_mamba_managers_in_vllm(manager):
        group_manager.__class__ = StateSearchStopsAtFirstMiss
    groups = getattr(coordinator, "attention_groups", None)
    if groups is not None:
        coordinator.attention_groups = [
            group._replace(manager_cls=StateSearchStopsAtFirstMiss) if group.manager_cls is MambaManager else group
            for group in groups
        ]


FAMILY.declare(
    FaultDeclaration(
        number=38,
        name="mamba-state-search-stops-at-first-miss",
        description=(
            "an align-mode Mamba group looks its states up left to right, as full attention does, "
            "and stops at the first one not cached: the positions before a chunk's end hold no state, so hits are "
            "missed"
        ),
        kvcore=plant_mamba_state_search_stops_at_first_miss,
        vllm=VllmPlant(
            number=27,
            description=(
                "vLLM MambaManager.find_longest_cache_hit in the align mode scanning left to "
                "right and stopping at the first state not cached"
            ),
            plant=plant_mamba_state_search_stops_at_first_miss_in_vllm,
        ),
    )
)


def padding_counted(count: int, num_positions: int) -> int:
    """An align-mode Mamba admission count that counts a block for every position up to the last slot
    (``num_positions`` past the table and the hit), null padding included, where one block is taken."""
    return count + max(0, num_positions - 1)


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


def plant_mamba_align_counts_the_padding_in_vllm(manager: Any) -> None:
    def recount(
        group_manager: Any, count: int, request_id: str, num_tokens: int, new_computed_blocks: Any, local: int
    ) -> int:
        table = group_manager.req_to_blocks[request_id]
        num_positions = -(-num_tokens // group_manager.block_size) - len(new_computed_blocks)
        return padding_counted(count, num_positions - len(table))

    for group_manager in aligned_mamba_managers_in_vllm(manager):
        recount_blocks_in_vllm(group_manager, recount)


FAMILY.declare(
    FaultDeclaration(
        number=39,
        name="mamba-align-counts-the-padding",
        description=(
            "admission counts an align-mode Mamba group a block for every position up to the last "
            "slot, null padding included, where one block is taken: steps that fit are refused"
        ),
        kvcore=plant_mamba_align_counts_the_padding,
        vllm=VllmPlant(
            number=28,
            description=(
                "vLLM MambaManager.get_num_blocks_to_allocate in the align mode without its "
                "one-block cap: every position up to the last slot counted, null padding included"
            ),
            plant=plant_mamba_align_counts_the_padding_in_vllm,
        ),
    )
)


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


def plant_mamba_align_speculative_blocks_not_counted_in_vllm(manager: Any) -> None:
    for group_manager in aligned_mamba_managers_in_vllm(manager):
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


FAMILY.declare(
    FaultDeclaration(
        number=40,
        name="mamba-align-speculative-blocks-not-counted",
        description=(
            "admission caps an align-mode Mamba group's new blocks at one on a request's first "
            "allocation too, as for a request that allocated before: its speculative blocks are left out while the "
            "allocation takes them"
        ),
        kvcore=plant_mamba_align_speculative_blocks_not_counted,
        vllm=VllmPlant(
            number=29,
            description=(
                "vLLM MambaManager.get_num_blocks_to_allocate in the align mode capping a "
                "request's first allocation at one block, as if it were in _allocated_block_reqs"
            ),
            plant=plant_mamba_align_speculative_blocks_not_counted_in_vllm,
        ),
    )
)


def plant_mamba_align_allocates_lookahead_slots(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    allocate = coordinator.allocate_new_blocks

    def allocate_new_blocks(
        request_id: str, num_tokens: int, num_encoder_tokens: int = 0, num_tokens_main_model: int | None = None
    ) -> tuple[list[KVBlock], ...]:
        # Every group grown to every slot: an align-mode Mamba group's too, the drafter's lookahead included.
        return allocate(request_id, num_tokens, num_encoder_tokens)

    coordinator.allocate_new_blocks = allocate_new_blocks  # type: ignore[method-assign]


def plant_mamba_align_allocates_lookahead_slots_in_vllm(manager: Any) -> None:
    for group_manager in aligned_mamba_managers_in_vllm(manager):
        allocate = group_manager.allocate_new_blocks

        def allocate_new_blocks(
            request_id: str, num_tokens: int, num_tokens_main_model: int, allocate: Any = allocate
        ) -> Any:
            return allocate(request_id, num_tokens, num_tokens)

        group_manager.allocate_new_blocks = allocate_new_blocks


FAMILY.declare(
    FaultDeclaration(
        number=41,
        name="mamba-align-allocates-lookahead-slots",
        layout="mamba",
        description=(
            "an align-mode Mamba group's table grows to every slot of the step, the drafter's "
            "lookahead included (a drafter has no Mamba layers): its new state block lands past the step's last token, "
            "whose state the model runner saves in the null padding"
        ),
        kvcore=plant_mamba_align_allocates_lookahead_slots,
        vllm=VllmPlant(
            number=30,
            description=(
                "vLLM MambaManager.allocate_new_blocks in the align mode without `num_tokens = "
                "num_tokens_main_model`: the table grows to the drafter's lookahead slots too"
            ),
            plant=plant_mamba_align_allocates_lookahead_slots_in_vllm,
        ),
    )
)
