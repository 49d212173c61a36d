"""Zeroing records: the blocks the worker is told to zero before a request writes them.

kvcore's and vLLM's group managers share the names these plants use: ``new_block_ids``,
``take_new_block_ids``, ``add_local_computed_blocks`` and
``allocate_external_computed_blocks(..., record_for_zeroing=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import after_hit_taken

FAMILY = Family()


def keep_zeroing_record(group_managers: Sequence[Any]) -> None:
    """The record of blocks to zero is handed over but never emptied."""
    for group_manager in group_managers:

        def take_new_block_ids(group_manager: Any = group_manager) -> list[int]:
            # The bug: a copy of the record, which keeps every block taken since the manager was built.
            return list(group_manager.new_block_ids)

        group_manager.take_new_block_ids = take_new_block_ids


def plant_zeroing_record_not_drained(manager: kvcore.KVCacheManager) -> None:
    keep_zeroing_record(manager.coordinator.managers)


def plant_zeroing_record_not_drained_in_vllm(manager: Any) -> None:
    keep_zeroing_record(manager.coordinator.single_type_managers)


FAMILY.declare(
    FaultDeclaration(
        number=56,
        name="zeroing-record-not-drained",
        description=(
            "the blocks recorded for the worker to zero are handed over but the record is not "
            "emptied: every later step zeroes earlier steps' blocks again, wiping computed tokens and cached prefixes"
        ),
        kvcore=plant_zeroing_record_not_drained,
        vllm=VllmPlant(
            number=45,
            description=(
                "vLLM SingleTypeKVCacheManager.take_new_block_ids returning a copy of new_block_ids without emptying it"
            ),
            plant=plant_zeroing_record_not_drained_in_vllm,
        ),
    )
)


def record_hit_blocks_for_zeroing(group_managers: Sequence[Any], records: Callable[[Any], bool]) -> None:
    """A prefix hit's blocks are recorded for zeroing as they enter the table (``records`` tells
    whether a group manager records its blocks)."""

    def record_hit(group_manager: Any, request_id: str, hit_blocks: Sequence[Any]) -> None:
        if records(group_manager):
            # The bug: the hit is recorded like new blocks, so the worker wipes the cached tokens.
            group_manager.new_block_ids.extend(block.block_id for block in hit_blocks if not block.is_null)

    after_hit_taken(group_managers, record_hit)


def plant_hit_blocks_zeroed(manager: kvcore.KVCacheManager) -> None:
    record_hit_blocks_for_zeroing(manager.coordinator.managers, lambda group_manager: group_manager.records_new_blocks)


def plant_hit_blocks_zeroed_in_vllm(manager: Any) -> None:
    record_hit_blocks_for_zeroing(
        manager.coordinator.single_type_managers, lambda group_manager: group_manager.records_new_block_ids
    )


FAMILY.declare(
    FaultDeclaration(
        number=57,
        name="hit-blocks-zeroed",
        description=(
            "a prefix hit's blocks are recorded for zeroing as they enter the request's table, "
            "like new blocks: the worker wipes the cached tokens the request is about to read"
        ),
        kvcore=plant_hit_blocks_zeroed,
        vllm=VllmPlant(
            number=46,
            description="vLLM add_local_computed_blocks appending the hit's blocks to new_block_ids",
            plant=plant_hit_blocks_zeroed_in_vllm,
        ),
    )
)


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


def plant_async_load_blocks_zeroed(manager: kvcore.KVCacheManager) -> None:
    zero_asynchronous_loads(manager.coordinator.managers)


def plant_async_load_blocks_zeroed_in_vllm(manager: Any) -> None:
    zero_asynchronous_loads(manager.coordinator.single_type_managers)


FAMILY.declare(
    FaultDeclaration(
        number=58,
        name="async-load-blocks-zeroed",
        description=(
            "the blocks of an asynchronous external load are recorded for zeroing "
            "(skip_zeroing_group_ids ignored): the worker's zeroing races the load that writes them"
        ),
        kvcore=plant_async_load_blocks_zeroed,
        vllm=VllmPlant(
            number=47,
            description=(
                "vLLM allocate_external_computed_blocks recording for zeroing whatever record_for_zeroing says"
            ),
            plant=plant_async_load_blocks_zeroed_in_vllm,
        ),
    )
)
