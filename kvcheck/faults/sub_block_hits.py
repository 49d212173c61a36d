"""Hits that end inside a block: the copy on write they take, the EAGLE drop inside them, and which
groups' lookups may stop inside their blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import after_hit_taken, recount_blocks, recount_blocks_in_vllm
from kvcore.block import KVBlock
from kvcore.blocks_math import ceil_div
from kvcore.coordinator import HybridCoordinator
from kvcore.managers import FullAttentionManager, RSWAManager
from kvcore.managers.base import SingleTypeManager

FAMILY = Family()


def plant_partial_hit_not_copied(manager: kvcore.KVCacheManager) -> None:
    # The bug: a hit ending inside a block is not recorded for its copy on write, so the request's
    # table keeps the shared block, where it writes its next tokens.
    after_hit_taken(
        manager.coordinator.managers,
        lambda group_manager, request_id, _: group_manager.partial_hits.pop(request_id, None),
    )


def plant_partial_hit_not_copied_in_vllm(manager: Any) -> None:
    after_hit_taken(
        manager.coordinator.single_type_managers,
        lambda group_manager, request_id, _: group_manager._partial_hit_reqs.pop(request_id, None),
    )


FAMILY.declare(
    FaultDeclaration(
        number=42,
        name="partial-hit-not-copied",
        layout="mamba",
        description=(
            "a hit ending inside a block is not recorded for its copy on write: the request's "
            "table keeps the block the prefix cache shares, and the request writes its next tokens into it"
        ),
        kvcore=plant_partial_hit_not_copied,
        vllm=VllmPlant(
            number=31,
            description=(
                "vLLM SingleTypeKVCacheManager.add_local_computed_blocks without recording a "
                "hit ending inside a block in _partial_hit_reqs: no copy on write"
            ),
            plant=plant_partial_hit_not_copied_in_vllm,
        ),
    )
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


def plant_copy_block_not_counted_in_vllm(manager: Any) -> None:
    def recount(
        group_manager: Any, count: int, request_id: str, num_tokens: int, new_computed_blocks: Any, local: int
    ) -> int:
        copies = group_manager._has_partial_local_hit(new_computed_blocks, local) or (
            request_id in group_manager._partial_hit_reqs
        )
        return count - 1 if copies else count

    for group_manager in manager.coordinator.single_type_managers:
        recount_blocks_in_vllm(group_manager, recount)


FAMILY.declare(
    FaultDeclaration(
        number=43,
        name="copy-block-not-counted",
        layout="mamba",
        description=(
            "admission does not count the block a copy on write takes (a hit ending inside a "
            "block, or a state cached inside the block its request goes on writing): a step that does not fit is "
            "admitted"
        ),
        kvcore=plant_copy_block_not_counted,
        vllm=VllmPlant(
            number=32,
            description=("vLLM get_num_blocks_to_allocate without the block a partial hit's copy on write takes"),
            plant=plant_copy_block_not_counted_in_vllm,
        ),
    )
)


def plant_state_entry_left_on_written_block(manager: kvcore.KVCacheManager) -> None:
    # The bug: the copy of a state a request cached inside the block it goes on writing is queued, but
    # the cache entry stays on that block, which the request then overwrites.
    manager.block_pool.move_block_hashes = lambda source, destination: None  # type: ignore[method-assign]


def plant_state_entry_left_on_written_block_in_vllm(manager: Any) -> None:
    manager.block_pool.move_block_hashes = lambda source, destination: None


FAMILY.declare(
    FaultDeclaration(
        number=44,
        name="state-entry-left-on-written-block",
        layout="mamba",
        description=(
            "an align-mode Mamba state a request cached inside the block it goes on writing is "
            "copied, but its cache entry stays on that block: a later hit reads a state overwritten since"
        ),
        kvcore=plant_state_entry_left_on_written_block,
        vllm=VllmPlant(
            number=33,
            description=(
                "vLLM MambaManager.allocate_new_blocks queueing a producer's copy without BlockPool.move_block_hashes"
            ),
            plant=plant_state_entry_left_on_written_block_in_vllm,
        ),
    )
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


def swap_lookup_class_in_vllm(coordinator: Any, manager_class: type, make: Any) -> None:
    """vLLM's hybrid coordinator looks up its spec groups of exactly ``manager_class`` with
    ``make(manager_class)`` instead."""
    if hasattr(coordinator, "attention_groups"):
        coordinator.attention_groups = [
            group._replace(manager_cls=make(group.manager_cls)) if group.manager_cls is manager_class else group
            for group in coordinator.attention_groups
        ]


def plant_eagle_drops_a_block_inside_sub_block_hits_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    swap_lookup_class_in_vllm(
        manager.coordinator,
        FullAttentionManager,
        lambda cls: whole_block_drop(cls, "drop_eagle_block", "alignment_tokens"),
    )


FAMILY.declare(
    FaultDeclaration(
        number=50,
        name="eagle-drops-a-block-inside-sub-block-hits",
        layout="mamba",
        description=(
            "with sub-block hits, full attention's lookup for an EAGLE drafter drops a whole block "
            "of its hit, not one hash block: hits come out a block short and the drafter recomputes cached tokens"
        ),
        kvcore=plant_eagle_drops_a_block_inside_sub_block_hits,
        vllm=VllmPlant(
            number=39,
            description=(
                "vLLM FullAttentionManager.find_longest_cache_hit dropping block_size, not "
                "min(alignment_tokens, block_size), for an EAGLE drafter"
            ),
            plant=plant_eagle_drops_a_block_inside_sub_block_hits_in_vllm,
        ),
    )
)


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


def plant_rswa_hits_stop_at_whole_blocks(manager: kvcore.KVCacheManager) -> None:
    # The bug: R-SWA's lookup probes whole blocks only, as a sliding window's does, though the coordinator
    # counts it among the groups that take sub-block hits: beside Mamba states cached inside its blocks,
    # every hit ends on an R-SWA block boundary and the tokens up to the state are computed again.
    swap_lookup_class(manager.coordinator, RSWAManager, lambda cls: block_granular_lookup(cls, "alignment"))


def plant_rswa_hits_stop_at_whole_blocks_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import RSWAManager

    swap_lookup_class_in_vllm(
        manager.coordinator, RSWAManager, lambda cls: block_granular_lookup(cls, "alignment_tokens")
    )


FAMILY.declare(
    FaultDeclaration(
        number=52,
        name="rswa-hits-stop-at-whole-blocks",
        layout="samba",
        description=(
            "R-SWA's lookup probes whole blocks only, as a sliding window's does, though sub-block "
            "hits count on it: beside Mamba states cached inside its blocks every hit ends on an R-SWA block boundary, "
            "and the tokens up to the state are computed again"
        ),
        kvcore=plant_rswa_hits_stop_at_whole_blocks,
        vllm=VllmPlant(
            number=41,
            description=(
                "vLLM RSWAManager.find_longest_cache_hit called with alignment_tokens raised to its block size"
            ),
            plant=plant_rswa_hits_stop_at_whole_blocks_in_vllm,
        ),
    )
)


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


def plant_sub_block_hits_beside_a_window_hashed_finer_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=53,
        name="sub-block-hits-beside-a-window-hashed-finer",
        layout="samba",
        description=(
            "sub-block hits are turned on whenever Mamba states are in blocks larger than the "
            "hashes, never asking whether a sliding-window or chunked-local group hashed finer than its blocks can "
            "stop a lookup inside one: the window is asked for hits its lookup cannot give"
        ),
        kvcore=plant_sub_block_hits_beside_a_window_hashed_finer,
        vllm=VllmPlant(
            number=42,
            description=("vLLM KVCacheCoordinator calling partial_hash_hits_enabled without its managers' classes"),
            plant=plant_sub_block_hits_beside_a_window_hashed_finer_in_vllm,
        ),
    )
)
