"""Decode context parallelism: block sizes on one rank and in the managers, and sub-block hits beside
sharded blocks.
"""

from __future__ import annotations

from typing import Any

import attrs

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcore.managers import ChunkedLocalAttentionManager, SlidingWindowManager
from kvcore.managers.base import SingleTypeManager

FAMILY = Family()


def plant_replicated_group_sharded(manager: kvcore.KVCacheManager) -> None:
    config = manager.coordinator.config
    for group_id in config.dcp_replicated_group_ids:
        # The bug: the manager block size is scaled by the world size passed in,
        # not by the group's own (1 for a draft model's replicated layers), so a
        # replicated group's table gets a block per world-size blocks of slots.
        manager.coordinator.managers[group_id].block_size = config.groups[group_id].block_size * config.dcp_world_size


def plant_replicated_group_sharded_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=36,
        name="replicated-group-sharded",
        description=(
            "under decode context parallelism a draft model's replicated group gets the sharded "
            "groups' block size (the world size passed in, not the group's own): its table holds a block per "
            "world-size blocks of slots"
        ),
        kvcore=plant_replicated_group_sharded,
        vllm=VllmPlant(
            number=25,
            description=(
                "vLLM SingleTypeKVCacheManager.__init__ scaling every group's block size by "
                "the dcp_world_size argument, a replicated draft group's too"
            ),
            plant=plant_replicated_group_sharded_in_vllm,
        ),
    )
)


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


def plant_window_frees_by_rank_blocks_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=37,
        name="window-frees-by-rank-blocks",
        description=(
            "under decode context parallelism a window counts its skipped tokens in the spec's "
            "blocks on one rank, not the manager's larger blocks: blocks still inside the window are freed"
        ),
        kvcore=plant_window_frees_by_rank_blocks,
        vllm=VllmPlant(
            number=26,
            description=(
                "vLLM SingleTypeKVCacheManager.remove_skipped_blocks dividing the skipped "
                "tokens by the spec's block size on one rank, not the manager's"
            ),
            plant=plant_window_frees_by_rank_blocks_in_vllm,
        ),
    )
)


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


def plant_sub_block_hits_off_under_dcp_at_equal_sizes_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=54,
        name="sub-block-hits-off-under-dcp-at-equal-sizes",
        layout="mamba",
        description=(
            "sub-block hits are asked for by the one-rank rule under decode context parallelism "
            "too (Mamba states in blocks larger than the hashes): with states at the hash size, hits stop at the "
            "sharded full-attention blocks, dcp_world_size times larger, and the tokens past them are computed again"
        ),
        kvcore=plant_sub_block_hits_off_under_dcp_at_equal_sizes,
        vllm=VllmPlant(
            number=43,
            description=(
                "vLLM partial_hash_hits_enabled comparing the Mamba blocks with the hashes by "
                "the one-rank rule under decode context parallelism"
            ),
            plant=plant_sub_block_hits_off_under_dcp_at_equal_sizes_in_vllm,
        ),
    )
)
