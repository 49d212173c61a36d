"""Local attention (sliding windows, chunked-local attention, R-SWA): the blocks a window frees, its
admission cap, and the blocks it caches under a retention interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcore.managers import ChunkedLocalAttentionManager, RSWAManager, SlidingWindowManager
from kvcore.managers.base import HitBlocks

FAMILY = Family()


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


FAMILY.declare(
    FaultDeclaration(
        number=9,
        name="sliding-window-skip-off-by-one",
        description=(
            "the sliding window skips n - W tokens, not n - W + 1: a block outside the window is kept or allocated"
        ),
        kvcore=plant_sliding_window_skip_off_by_one,
    )
)


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


FAMILY.declare(
    FaultDeclaration(
        number=10,
        name="chunked-local-skip-uses-last-token",
        description=(
            "chunked local attention skips up to the chunk of token n - 1, not n: a finished chunk's blocks are kept"
        ),
        kvcore=plant_chunked_local_skip_uses_last_token,
    )
)


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


def plant_window_slides_on_scheduled_tokens_in_vllm(manager: Any) -> None:
    manager.allocate_slots = window_slides_on_scheduled_tokens(manager.allocate_slots)


FAMILY.declare(
    FaultDeclaration(
        number=16,
        name="window-slides-on-scheduled-tokens",
        description=(
            "allocate_slots releases local-attention (sliding-window, chunked) blocks on the "
            "scheduled token count, not the processed one: a block a step still in flight reads goes back to the pool"
        ),
        kvcore=plant_window_slides_on_scheduled_tokens,
        vllm=VllmPlant(
            number=8,
            description=(
                "vLLM allocate_slots releasing sliding-window blocks on the scheduled, not the processed, tokens"
            ),
            plant=plant_window_slides_on_scheduled_tokens_in_vllm,
        ),
    )
)


def plant_window_admission_cap_one_block_short(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, SlidingWindowManager) and group_manager.max_admission_blocks is not None:
            # The bug: the cap counts the window's tokens and the tokens in
            # flight, but not the block a window may straddle, so the
            # whole-request gate admits a request one block short.
            group_manager.max_admission_blocks -= 1


def plant_window_admission_cap_one_block_short_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, SlidingWindowManager):
            # The bug: the cap without the block a window may straddle.
            group_manager.max_admission_blocks_per_request -= 1


FAMILY.declare(
    FaultDeclaration(
        number=19,
        name="window-admission-cap-one-block-short",
        description=(
            "the sliding-window admission cap of the whole-request gate leaves out the block a "
            "window may straddle: a request is admitted whose window does not fit"
        ),
        kvcore=plant_window_admission_cap_one_block_short,
        vllm=VllmPlant(
            number=7,
            description="vLLM's sliding-window admission cap without the block a window may straddle",
            plant=plant_window_admission_cap_one_block_short_in_vllm,
        ),
    )
)


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


def plant_rswa_gap_starts_inside_the_prompt_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=24,
        name="rswa-gap-starts-inside-the-prompt",
        description=(
            "R-SWA's gap starts at the block holding the prompt's last token (rounded down): a "
            "prompt ending inside a block loses that block"
        ),
        kvcore=plant_rswa_gap_starts_inside_the_prompt,
        vllm=VllmPlant(
            number=14,
            description=(
                "vLLM RSWAManager starting the gap at the block holding the prompt's last token (rounded down)"
            ),
            plant=plant_rswa_gap_starts_inside_the_prompt_in_vllm,
        ),
    )
)


def plant_sliding_window_caches_unreachable_blocks(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        if isinstance(group_manager, SlidingWindowManager):
            # The bug: every full block is cached, also those no hit on a scheduler-block boundary needs.
            group_manager.cached_positions = (  # type: ignore[method-assign]
                lambda request, start, end, replay_boundaries: list(range(start, end))
            )


def plant_sliding_window_caches_unreachable_blocks_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    for group_manager in manager.coordinator.single_type_managers:
        if isinstance(group_manager, SlidingWindowManager):
            # The bug: no mask, every full block cached.
            group_manager.reachable_block_mask = lambda *args, **kwargs: None


FAMILY.declare(
    FaultDeclaration(
        number=33,
        name="sliding-window-caches-unreachable-blocks",
        description=(
            "a sliding window whose hits land on boundaries several blocks apart caches every full "
            "block, not only the window's before each boundary"
        ),
        kvcore=plant_sliding_window_caches_unreachable_blocks,
        vllm=VllmPlant(
            number=22,
            description=("vLLM SlidingWindowManager.reachable_block_mask returning no mask: every full block cached"),
            plant=plant_sliding_window_caches_unreachable_blocks_in_vllm,
        ),
    )
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


def plant_retention_drops_the_replay_boundary_in_vllm(manager: Any) -> None:
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


FAMILY.declare(
    FaultDeclaration(
        number=34,
        name="retention-drops-the-replay-boundary",
        description=(
            "under a retention interval a sliding window keeps the blocks before each interval's "
            "end but not those before the prompt's replay boundary: a resend of the prompt falls back to an interval's "
            "end"
        ),
        kvcore=plant_retention_drops_the_replay_boundary,
        vllm=VllmPlant(
            number=23,
            description=("vLLM SlidingWindowManager.cache_blocks building its mask without the replay boundaries"),
            plant=plant_retention_drops_the_replay_boundary_in_vllm,
        ),
    )
)


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


def plant_shared_prefix_boundary_dropped_in_vllm(manager: Any) -> None:
    get_computed_blocks = manager.get_computed_blocks

    def hit_without_shared_prefix(request: Any, max_cache_hit_length: int | None = None) -> Any:
        blocks, num_tokens, _ = get_computed_blocks(request, max_cache_hit_length)
        # The bug: the shared prefix the lookup found is dropped.
        return blocks, num_tokens, 0

    manager.get_computed_blocks = hit_without_shared_prefix


FAMILY.declare(
    FaultDeclaration(
        number=35,
        name="shared-prefix-boundary-dropped",
        description=(
            "the scheduler keeps a lookup's hit but drops the shared prefix it found past the hit: "
            "under a retention interval no window keeps that prefix's end, so requests sharing it keep missing"
        ),
        kvcore=plant_shared_prefix_boundary_dropped,
        vllm=VllmPlant(
            number=24,
            description=("vLLM's scheduler dropping the shared_prefix_boundary get_computed_blocks returns"),
            plant=plant_shared_prefix_boundary_dropped_in_vllm,
        ),
    )
)
