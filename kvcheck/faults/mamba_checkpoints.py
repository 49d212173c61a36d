"""Align-mode Mamba states cached during a prefill: checkpoints, state retention, and when a cached
state may be hit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import aligned_mamba_managers, aligned_mamba_managers_in_vllm

FAMILY = Family()


def allocate_without_checkpoint(group_managers: Iterable[Any], checkpoints: str) -> None:
    """Each align-mode Mamba allocation runs as if no prefill checkpoint were recorded (the group
    manager's dict named ``checkpoints``), which the caching after it still finds: the checkpoint's
    position is padded with the null block."""
    for group_manager in group_managers:
        allocate = group_manager.allocate_new_blocks

        def allocate_new_blocks(
            request_id: str,
            *args: Any,
            group_manager: Any = group_manager,
            allocate: Callable[..., list[Any]] = allocate,
        ) -> list[Any]:
            recorded = getattr(group_manager, checkpoints)
            checkpoint = recorded.pop(request_id, None)
            try:
                return allocate(request_id, *args)
            finally:
                if checkpoint is not None:
                    recorded[request_id] = checkpoint

        group_manager.allocate_new_blocks = allocate_new_blocks


def plant_checkpoint_block_left_null(manager: kvcore.KVCacheManager) -> None:
    # The bug: the allocation pads a prefill checkpoint's position with the null block, as any position a
    # chunk skips; admission counted a block for it, and the backend exports the checkpoint there.
    allocate_without_checkpoint(aligned_mamba_managers(manager), "checkpoints")


def plant_checkpoint_block_left_null_in_vllm(manager: Any) -> None:
    allocate_without_checkpoint(aligned_mamba_managers_in_vllm(manager), "_checkpoints")


FAMILY.declare(
    FaultDeclaration(
        number=45,
        name="checkpoint-block-left-null",
        layout="mamba",
        description=(
            "an align-mode Mamba allocation pads a prefill checkpoint's position with the null "
            "block, as any position a chunk skips: the backend exports the checkpoint into the null block, and the "
            "block admission counted for it is never taken"
        ),
        kvcore=plant_checkpoint_block_left_null,
        vllm=VllmPlant(
            number=34,
            description=(
                "vLLM MambaManager.allocate_new_blocks in the align mode run as if "
                "_checkpoints held nothing for the request: the checkpoint's position padded with the null block"
            ),
            plant=plant_checkpoint_block_left_null_in_vllm,
        ),
    )
)


def keep_transient_checkpoints(group_managers: Iterable[Any], cache_checkpoint: str, pool: str, evict: str) -> None:
    """The group managers' method named ``cache_checkpoint`` runs with the method named ``evict`` of their
    block pool (their attribute named ``pool``), which drops a transient checkpoint's keys and nothing
    else there, doing nothing."""
    for group_manager in group_managers:
        cache = getattr(group_manager, cache_checkpoint)
        block_pool = getattr(group_manager, pool)

        def cache_keeping_keys(
            *args: Any, block_pool: Any = block_pool, cache: Callable[..., Any] = cache, **kwargs: Any
        ) -> Any:
            setattr(block_pool, evict, lambda *_: None)
            try:
                return cache(*args, **kwargs)
            finally:
                delattr(block_pool, evict)

        setattr(group_manager, cache_checkpoint, cache_keeping_keys)


def plant_transient_checkpoint_keeps_its_key(manager: kvcore.KVCacheManager) -> None:
    # The bug: a transient checkpoint's block keeps the full key its position was cached under this step,
    # though it holds the state at another boundary.
    keep_transient_checkpoints(aligned_mamba_managers(manager), "_cache_checkpoint", "pool", "evict_blocks")


def plant_transient_checkpoint_keeps_its_key_in_vllm(manager: Any) -> None:
    keep_transient_checkpoints(
        aligned_mamba_managers_in_vllm(manager), "_cache_partial_tail_block", "block_pool", "_maybe_evict_cached_block"
    )


FAMILY.declare(
    FaultDeclaration(
        number=46,
        name="transient-checkpoint-keeps-its-key",
        layout="mamba",
        description=(
            "a transient prefill checkpoint (inside a block, neither the prompt's nor a shared "
            "prefix's end) keeps the full-block key its position was cached under: a later hit on that block boundary "
            "reads the state of another boundary"
        ),
        kvcore=plant_transient_checkpoint_keeps_its_key,
        vllm=VllmPlant(
            number=35,
            description=(
                "vLLM MambaManager._cache_partial_tail_block without "
                "BlockPool._maybe_evict_cached_block for a transient checkpoint"
            ),
            plant=plant_transient_checkpoint_keeps_its_key_in_vllm,
        ),
    )
)


def cache_every_state(group_managers: Iterable[Any], keeps_every_state: str, keep: Callable[..., Any]) -> None:
    """The group managers' method named ``keeps_every_state`` (what decides which states a retention
    interval keeps) is replaced by ``keep``, which answers that it keeps all of them."""
    for group_manager in group_managers:
        setattr(group_manager, keeps_every_state, keep)


def plant_retention_caches_every_state(manager: kvcore.KVCacheManager) -> None:
    # The bug: an align-mode Mamba group under a retention interval caches its states as densely as with
    # none (as if it kept the base class's dense policy), every checkpoint on a block boundary too.
    cache_every_state(aligned_mamba_managers(manager), "_states_per_segment", lambda: None)


def plant_retention_caches_every_state_in_vllm(manager: Any) -> None:
    cache_every_state(aligned_mamba_managers_in_vllm(manager), "reachable_block_mask", lambda *_, **__: None)


FAMILY.declare(
    FaultDeclaration(
        number=47,
        name="retention-caches-every-state",
        layout="mamba",
        description=(
            "an align-mode Mamba group under a retention interval caches every state it computes, "
            "as with no interval: the prefix cache fills with states the interval thins out, evicting those kept for "
            "hits"
        ),
        kvcore=plant_retention_caches_every_state,
        vllm=VllmPlant(
            number=36,
            description=(
                "vLLM MambaManager.reachable_block_mask returning None (cache every state) whatever the interval"
            ),
            plant=plant_retention_caches_every_state_in_vllm,
        ),
    )
)


def ignore_prefill_end(coordinator: Any, count_blocks: str) -> None:
    """The coordinator's method named ``count_blocks`` runs with ``prefill_end=0`` whatever it is given."""
    count = getattr(coordinator, count_blocks)

    def count_without_prefill_end(*args: Any, **kwargs: Any) -> Any:
        kwargs["prefill_end"] = 0
        return count(*args, **kwargs)

    setattr(coordinator, count_blocks, count_without_prefill_end)


def plant_checkpoint_before_the_prefill_end(manager: kvcore.KVCacheManager) -> None:
    # The bug: the coordinator does not hand the prefill's end to the Mamba groups under a retention
    # interval of 0, so every chunk reserves (and writes) a prefill checkpoint.
    ignore_prefill_end(manager.coordinator, "num_blocks_to_allocate")


def plant_checkpoint_before_the_prefill_end_in_vllm(manager: Any) -> None:
    ignore_prefill_end(manager.coordinator, "get_num_blocks_to_allocate")


FAMILY.declare(
    FaultDeclaration(
        number=48,
        name="checkpoint-before-the-prefill-end",
        layout="mamba",
        description=(
            "under a retention interval of 0 the coordinator does not pass the prefill's end to "
            "align-mode Mamba groups: every prefill chunk reserves a checkpoint block, not only the one ending the "
            "prefill"
        ),
        kvcore=plant_checkpoint_before_the_prefill_end,
        vllm=VllmPlant(
            number=37,
            description=(
                "vLLM KVCacheCoordinator.get_num_blocks_to_allocate run with prefill_end=0 under an interval of 0"
            ),
            plant=plant_checkpoint_before_the_prefill_end_in_vllm,
        ),
    )
)


def clear_manager_flag(group_managers: Iterable[Any], flag: str) -> None:
    """The group managers' boolean attribute named ``flag``, which their coordinator or manager sets
    from the configuration, is cleared: the group acts as if the feature were off."""
    for group_manager in group_managers:
        setattr(group_manager, flag, False)


def plant_checkpoint_ignores_the_eagle_drop(manager: kvcore.KVCacheManager) -> None:
    # The bug: the coordinator does not tell the Mamba groups that an EAGLE drafter drops the attention
    # groups' last hit block, so checkpoints stay at the boundary short of the last token, a block above
    # where the attention groups' hits land.
    clear_manager_flag(aligned_mamba_managers(manager), "drops_checkpoint_block")


def plant_checkpoint_ignores_the_eagle_drop_in_vllm(manager: Any) -> None:
    clear_manager_flag(aligned_mamba_managers_in_vllm(manager), "drop_eagle_checkpoint_block")


FAMILY.declare(
    FaultDeclaration(
        number=49,
        name="checkpoint-ignores-the-eagle-drop",
        layout="mamba",
        description=(
            "beside an EAGLE drafter an align-mode Mamba group keeps its prefill checkpoints and "
            "its prompt's reusable state short of the last token, not a hit boundary lower: the attention groups' "
            "hits, one block shorter after the drop, find no state there"
        ),
        kvcore=plant_checkpoint_ignores_the_eagle_drop,
        vllm=VllmPlant(
            number=38,
            description=(
                "vLLM MambaManager.drop_eagle_checkpoint_block left False though the "
                "coordinator serves an EAGLE drafter"
            ),
            plant=plant_checkpoint_ignores_the_eagle_drop_in_vllm,
        ),
    )
)


def plant_shared_prefix_state_left_uncached(manager: kvcore.KVCacheManager) -> None:
    # The bug: the configuration's shared-prefix checkpoint flag, narrowed by the manager, never reaches
    # the Mamba groups: the scheduler ends a chunk on the junction for a state no group caches.
    clear_manager_flag(aligned_mamba_managers(manager), "shared_prefix_checkpoint")


def plant_shared_prefix_state_left_uncached_in_vllm(manager: Any) -> None:
    clear_manager_flag(aligned_mamba_managers_in_vllm(manager), "shared_prefix_checkpoint")


FAMILY.declare(
    FaultDeclaration(
        number=51,
        name="shared-prefix-state-left-uncached",
        layout="mamba",
        description=(
            "with shared-prefix checkpoints in force the Mamba groups never learn of them: the "
            "scheduler ends a prefill chunk at the end of a prefix a lookup found shared, and no state is cached there "
            "for the sibling requests that would resume from it"
        ),
        kvcore=plant_shared_prefix_state_left_uncached,
        vllm=VllmPlant(
            number=40,
            description=(
                "vLLM MambaManager.shared_prefix_checkpoint left False though KVCacheManager turned the checkpoint on"
            ),
            plant=plant_shared_prefix_state_left_uncached_in_vllm,
        ),
    )
)


class _HoldsNothing(set[Any]):
    """A set that drops whatever is added to it."""

    def add(self, element: Any) -> None:
        pass


def forget_states_cached_this_step(group_managers: Iterable[Any], cached_this_step: str) -> None:
    """The group managers' set named ``cached_this_step`` (the states cached in the current scheduler step,
    which a hit must wait for) keeps nothing."""
    for group_manager in group_managers:
        setattr(group_manager, cached_this_step, _HoldsNothing())


def plant_state_hit_in_the_step_that_caches_it(manager: kvcore.KVCacheManager) -> None:
    # The bug: the Mamba group does not remember the states it cached in this scheduler step, so a request
    # scheduled in the same step hits a state whose forward pass has not run yet.
    forget_states_cached_this_step(aligned_mamba_managers(manager), "cached_this_step")


def plant_state_hit_in_the_step_that_caches_it_in_vllm(manager: Any) -> None:
    forget_states_cached_this_step(aligned_mamba_managers_in_vllm(manager), "cached_blocks_this_step")


FAMILY.declare(
    FaultDeclaration(
        number=55,
        name="state-hit-in-the-step-that-caches-it",
        layout="mamba",
        description=(
            "an align-mode Mamba group forgets which states it cached in the current scheduler "
            "step: a request scheduled in the same step hits a state whose forward pass has not run yet, and reads "
            "garbage"
        ),
        kvcore=plant_state_hit_in_the_step_that_caches_it,
        vllm=VllmPlant(
            number=44,
            description="vLLM MambaManager.cached_blocks_this_step keeping nothing added to it",
            plant=plant_state_hit_in_the_step_that_caches_it_in_vllm,
        ),
    )
)
