"""A KV connector: external tokens entered in the tables, asynchronous loads, and the Mamba states
offered for offload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import aligned_mamba_managers, aligned_mamba_managers_in_vllm
from kvcore.block import KVBlock
from kvcore.managers.mamba import AlignedMambaManager

FAMILY = Family()


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


def plant_interleaved_external_alloc_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=2,
        name="interleaved-external-alloc",
        description=(
            "each group allocates for external tokens before the next group touches its hit "
            "(cross-group double allocation)"
        ),
        kvcore=plant_interleaved_external_alloc,
        vllm=VllmPlant(
            number=2,
            description=(
                "vLLM coordinator allocating external blocks group by group, before later "
                "groups touch their hits (seed 003)"
            ),
            plant=plant_interleaved_external_alloc_in_vllm,
        ),
    )
)


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


def plant_delayed_load_cached_at_allocation_in_vllm(manager: Any) -> None:
    manager.allocate_slots = load_cached_before_it_lands(manager.allocate_slots)


FAMILY.declare(
    FaultDeclaration(
        number=18,
        name="delayed-load-cached-at-allocation",
        description=(
            "allocate_slots ignores delay_cache_blocks: an asynchronous load's blocks are cached, "
            "and hittable, before the load lands"
        ),
        kvcore=plant_delayed_load_cached_at_allocation,
        vllm=VllmPlant(
            number=10,
            description=("vLLM allocate_slots caching an asynchronous load's blocks before the load lands"),
            plant=plant_delayed_load_cached_at_allocation_in_vllm,
        ),
    )
)


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


def plant_truncated_hit_keeps_its_state(manager: kvcore.KVCacheManager) -> None:
    keep_state_hits_whole(
        manager,
        manager.coordinator.managers,
        aligned_mamba_managers(manager),
        lambda blocks: blocks,
        lambda blocks: blocks,
    )


def plant_truncated_hit_keeps_its_state_in_vllm(manager: Any) -> None:
    keep_state_hits_whole(
        manager,
        manager.coordinator.single_type_managers,
        aligned_mamba_managers_in_vllm(manager),
        lambda blocks: blocks.blocks,
        manager.create_kv_cache_blocks,
    )


FAMILY.declare(
    FaultDeclaration(
        number=59,
        name="truncated-hit-keeps-its-state",
        layout="mamba",
        description=(
            "a sub-block hit cut back to a block boundary for a connector's load keeps its "
            "align-mode Mamba state: the state the hit ended on stays in the request's table past the endpoint, and "
            "the load's state is written into that block, cached under the shorter prefix a later hit reads"
        ),
        kvcore=plant_truncated_hit_keeps_its_state,
        vllm=VllmPlant(
            number=48,
            description=(
                "vLLM KVCacheManager.truncate_computed_blocks slicing the attention groups "
                "only (an align-mode Mamba group's hit returned whole)"
            ),
            plant=plant_truncated_hit_keeps_its_state_in_vllm,
        ),
    )
)


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


def plant_state_offered_from_its_written_block(manager: kvcore.KVCacheManager) -> None:
    for state_manager in aligned_mamba_managers(manager):

        def offers_of(state_manager: AlignedMambaManager = state_manager) -> list[tuple[str, KVBlock, int]]:
            return state_manager.state_offloads

        def copies_of(state_manager: AlignedMambaManager = state_manager) -> list[tuple[KVBlock, KVBlock]]:
            return state_manager.pending_copies

        offer_written_blocks_for_their_copies(state_manager, offers_of, copies_of, 1)


def plant_state_offered_from_its_written_block_in_vllm(manager: Any) -> None:
    for state_manager in aligned_mamba_managers_in_vllm(manager):

        def offers_of(state_manager: Any = state_manager) -> Any:
            return state_manager._pending_boundary_state_offloads

        def copies_of(state_manager: Any = state_manager) -> Any:
            return state_manager._pending_cow_copies

        offer_written_blocks_for_their_copies(state_manager, offers_of, copies_of, 2)


FAMILY.declare(
    FaultDeclaration(
        number=60,
        name="state-offered-from-its-written-block",
        layout="mamba",
        description=(
            "the hand-off of a state a request cached inside the align-mode Mamba block it goes on "
            "writing offers a KV connector that block instead of the copy the next allocation makes of it: the "
            "connector offloads, under the state's boundary, whatever the next step writes there"
        ),
        kvcore=plant_state_offered_from_its_written_block,
        vllm=VllmPlant(
            number=49,
            description=(
                "vLLM MambaManager.allocate_new_blocks queueing the boundary-state hand-off of "
                "a running request's copy on write with source_block instead of cow_block"
            ),
            plant=plant_state_offered_from_its_written_block_in_vllm,
        ),
    )
)


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


def plant_finished_tail_offered_after_later_tokens_in_vllm(manager: Any) -> None:
    for state_manager in aligned_mamba_managers_in_vllm(manager):

        def tails_of(state_manager: Any = state_manager) -> Any:
            return state_manager._producer_partial_tail_reqs

        def offer(tail: Any, state_manager: Any = state_manager) -> tuple[Any, ...]:
            return (state_manager.kv_cache_group_id, *tail)

        offer_finished_tails_whatever_followed(state_manager, "finalize_partial_tail_offload", tails_of, offer)


FAMILY.declare(
    FaultDeclaration(
        number=61,
        name="finished-tail-offered-after-later-tokens",
        layout="mamba",
        description=(
            "a finishing request's state cached inside the align-mode Mamba block it was writing "
            "is offered a KV connector though later tokens (computed, or in flight) reached that block: the connector "
            "offloads, under the state's boundary, the state of a later token"
        ),
        kvcore=plant_finished_tail_offered_after_later_tokens,
        vllm=VllmPlant(
            number=50,
            description=(
                "vLLM MambaManager.finalize_partial_tail_offload returning the producer's tail "
                "without checking num_computed_tokens and num_in_flight_tokens"
            ),
            plant=plant_finished_tail_offered_after_later_tokens_in_vllm,
        ),
    )
)
