"""Speculative decoding: an EAGLE drafter's dropped hit block, the drafter's lookahead slots, and the
tokens a drafter may compute again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import move_managers
from kvcore.hashing import BlockHash
from kvcore.managers import SlidingWindowManager
from kvcore.managers.base import HitBlocks, drop_last_block

FAMILY = Family()


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
    move_managers(manager, SlidingWindowManager, _EagleDropWithoutExtraBlockWindow)


def plant_eagle_window_without_extra_block_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=12,
        name="eagle-window-without-extra-block",
        description=(
            "with an EAGLE drafter, the sliding-window hit drops its last block without having "
            "matched the extra block the drop needs: the hit's window starts at an unmatched block"
        ),
        kvcore=plant_eagle_window_without_extra_block,
        vllm=VllmPlant(
            number=5,
            description=(
                "vLLM SlidingWindowManager dropping an EAGLE hit's last block from a run without the extra block"
            ),
            plant=plant_eagle_window_without_extra_block_in_vllm,
        ),
    )
)


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


def plant_admission_ignores_lookahead_in_vllm(manager: Any) -> None:
    coordinator = manager.coordinator
    count_blocks: Callable[..., int] = coordinator.get_num_blocks_to_allocate

    def blocks_for_main_model_tokens(**kwargs: Any) -> int:
        # The bug: admission is sized for the main model's tokens; the
        # drafter's lookahead slots are left out, though they are allocated.
        return count_blocks(**{**kwargs, "num_tokens": kwargs["num_tokens_main_model"]})

    coordinator.get_num_blocks_to_allocate = blocks_for_main_model_tokens


FAMILY.declare(
    FaultDeclaration(
        number=13,
        name="admission-ignores-lookahead",
        description=(
            "allocate_slots sizes admission for the tokens a step computes, leaving out the "
            "drafter's lookahead slots it then allocates: a step is admitted that cannot be allocated"
        ),
        kvcore=plant_admission_ignores_lookahead,
        vllm=VllmPlant(
            number=3,
            description=(
                "vLLM allocate_slots sizing admission for the main model's tokens, without the lookahead slots"
            ),
            plant=plant_admission_ignores_lookahead_in_vllm,
        ),
    )
)


def plant_spec_output_caches_one_token_short(manager: kvcore.KVCacheManager) -> None:
    cache_blocks = manager.cache_blocks

    def cache_blocks_one_short(request: kvcore.Request, num_computed_tokens: int) -> None:
        # The bug: the last computed token is taken to be still in flight, so a
        # block that the accepted drafts completed is not cached until the next step.
        cache_blocks(request, max(0, num_computed_tokens - 1))

    manager.cache_blocks = cache_blocks_one_short  # type: ignore[method-assign]


def plant_spec_output_caches_one_token_short_in_vllm(manager: Any) -> None:
    cache_blocks = manager.cache_blocks

    def cache_blocks_one_short(request: Any, num_computed_tokens: int) -> None:
        # The bug: the last computed token is taken to be still in flight.
        cache_blocks(request, max(0, num_computed_tokens - 1))

    manager.cache_blocks = cache_blocks_one_short


FAMILY.declare(
    FaultDeclaration(
        number=14,
        name="spec-output-caches-one-token-short",
        description=(
            "cache_blocks after a speculative step's output stops one token short: the block the "
            "accepted drafts completed is not published until the next step"
        ),
        kvcore=plant_spec_output_caches_one_token_short,
        vllm=VllmPlant(
            number=4,
            description="vLLM cache_blocks after a speculative step's output stopping one token short",
            plant=plant_spec_output_caches_one_token_short_in_vllm,
        ),
    )
)


def cacheable_counts_reprefillable_tokens(num_tokens: int, group_id: int) -> int:
    """The cacheable count of a coordinator that takes every computed token as final."""
    # The bug: the last num_prefill_lookahead - 1 tokens, which a multi-module
    # drafter may prefill again (rewriting their KV), are not held back.
    return num_tokens


def plant_reprefillable_tokens_cached(manager: kvcore.KVCacheManager) -> None:
    manager.coordinator.num_cacheable_tokens = cacheable_counts_reprefillable_tokens  # type: ignore[method-assign]


def plant_reprefillable_tokens_cached_in_vllm(manager: Any) -> None:
    manager.coordinator.get_num_cacheable_tokens = cacheable_counts_reprefillable_tokens


FAMILY.declare(
    FaultDeclaration(
        number=15,
        name="reprefillable-tokens-cached",
        description=(
            "cache_blocks takes every computed token as final: the block holding the last tokens a "
            "multi-module drafter may prefill again is published"
        ),
        kvcore=plant_reprefillable_tokens_cached,
        vllm=VllmPlant(
            number=6,
            description=("vLLM's coordinator counting every computed token as cacheable, the re-prefillable ones too"),
            plant=plant_reprefillable_tokens_cached_in_vllm,
        ),
    )
)
