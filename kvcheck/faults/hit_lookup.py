"""The longest cache hit: how far a lookup may reach, how the groups' hits combine, where hits are
aligned, and when a hit is taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration
from kvcheck.faults.rewiring import move_managers
from kvcore.block import KVBlock
from kvcore.blocks_math import ceil_div
from kvcore.hashing import BlockHash
from kvcore.managers import FullAttentionManager
from kvcore.managers.base import HitBlocks

FAMILY = Family()


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


def plant_full_hit_rounds_up(manager: kvcore.KVCacheManager) -> None:
    move_managers(manager, FullAttentionManager, _CeilBoundFullManager)


FAMILY.declare(
    FaultDeclaration(
        number=8,
        name="full-hit-rounds-up",
        description=(
            "the full-attention hit scan is bounded with ceil_div, not floor: a hit can pass the num_tokens - 1 cap"
        ),
        kvcore=plant_full_hit_rounds_up,
    )
)


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


FAMILY.declare(
    FaultDeclaration(
        number=11,
        name="hybrid-hit-takes-max",
        description="the hybrid coordinator combines the groups' hit lengths with max instead of min",
        kvcore=plant_hybrid_hit_takes_max,
    )
)


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


FAMILY.declare(
    FaultDeclaration(
        number=20,
        name="hit-taken-before-admission",
        description=(
            "the local hit is touched before the admission check, so a refused allocation keeps the hit blocks"
        ),
        kvcore=plant_hit_taken_before_admission,
    )
)


def plant_hits_aligned_to_the_hash_size(manager: kvcore.KVCacheManager) -> None:
    # The bug: a hybrid cache aligns hits to the hash granularity instead of the scheduler block size;
    # a hit may then end inside a larger group's block, which the request goes on to write.
    coordinator = manager.coordinator
    coordinator.hit_alignment = coordinator.config.hash_block_size


FAMILY.declare(
    FaultDeclaration(
        number=31,
        name="hits-aligned-to-the-hash-size",
        description=(
            "a hybrid cache of mixed block sizes without sub-block hits aligns hits to the hash "
            "size, not the scheduler block size: a hit ends inside a larger group's shared block, longer than it may "
            "be"
        ),
        kvcore=plant_hits_aligned_to_the_hash_size,
    )
)
