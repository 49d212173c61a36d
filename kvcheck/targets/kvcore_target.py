"""The kvcore target: kvcore's KVCacheManager driven the way vLLM's scheduler drives it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kvcore
from kvcheck.kinds import kind_of
from kvcheck.targets.scheduler import SchedulerDrivenTarget
from kvmodel.config import TargetConfig
from kvmodel.fields import allocator_keywords
from kvmodel.group_spec import GroupSpec
from kvmodel.observation import CacheKey, Observation, block_keys
from kvmodel.ops import GroupIds
from kvmodel.semantics import Semantics


def kvcore_spec(group: GroupSpec, block_size: int) -> kvcore.AttentionSpec:
    """kvcore's attention spec of one group, with blocks of ``block_size`` tokens (:mod:`kvcheck.kinds`)."""
    return kind_of(group.kind).kvcore_spec(group, block_size)


def to_kvcore_config(config: TargetConfig) -> kvcore.KVCacheConfig:
    """The kvcore configuration of a target configuration: the fields kvcore takes by name
    (:func:`~kvmodel.fields.allocator_keywords`) and the sizes and groups derived from the rest."""
    specs = [kvcore_spec(group, block_size) for group, block_size in zip(config.groups, config.spec_block_sizes)]
    return kvcore.KVCacheConfig(
        groups=specs,
        **allocator_keywords(config, "kvcore"),
        scheduler_block_size=config.scheduler_block_size,
        hash_block_size=config.hash_size,
        dcp_replicated_group_ids=config.dcp_replicated_group_ids,
        kv_cache_dtypes=tuple(group.kv_cache_dtype for group in config.groups),
    )


class KvcoreTarget(SchedulerDrivenTarget):
    """Drives a :class:`kvcore.KVCacheManager`.

    ``manager_factory`` builds the manager from the kvcore configuration; a
    fault replaces it with one that builds a manager carrying a planted bug.
    """

    name = "kvcore"

    def __init__(
        self,
        config: TargetConfig,
        manager_factory: Callable[[kvcore.KVCacheConfig], kvcore.KVCacheManager] = kvcore.KVCacheManager,
        semantics: Semantics | None = None,
    ) -> None:
        super().__init__(config, semantics)
        self.manager = manager_factory(to_kvcore_config(config))

    def _new_request(self, request_id: str, prompt: tuple[int, ...]) -> kvcore.Request:
        return kvcore.Request(
            request_id, prompt, self.config.hash_size, num_hash_lookahead_tokens=self.config.num_hash_lookahead_tokens
        )

    def _get_num_cached_tokens(self, request: kvcore.Request) -> int:
        return self.manager.get_num_cached_tokens(request)

    def _get_computed_blocks(self, request: kvcore.Request) -> tuple[Any, int]:
        return self.manager.get_computed_blocks(request)

    def _truncate_computed_blocks(self, blocks: Any, num_tokens: int) -> Any:
        return self.manager.truncate_computed_blocks(blocks, num_tokens)

    def _allocate_slots(
        self,
        request: kvcore.Request,
        num_new_tokens: int,
        hit: tuple[Any, int] | None,
        external: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> Any:
        gates = self._admission_gates(request.request_id, request.waiting)
        if hit is None:
            return self.manager.allocate_slots(
                request, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens, **gates
            )
        hit_blocks, hit_length = hit
        return self.manager.allocate_slots(
            request,
            num_new_tokens,
            hit_length,
            hit_blocks,
            num_lookahead_tokens=num_lookahead_tokens,
            num_external_computed_tokens=external,
            delay_cache_blocks=delay_cache_blocks,
            skip_zeroing_group_ids=self.config.async_loaded_group_ids if delay_cache_blocks else (),
            **gates,
        )

    def _on_admitted(self, request: kvcore.Request) -> None:
        request.waiting = False

    def _on_preempted(self, request: kvcore.Request, was_running: bool) -> None:
        request.waiting = True

    def _free(self, request: kvcore.Request) -> None:
        self.manager.free(request)

    def _pop_blocks_for_free(self, request: kvcore.Request) -> list[Any]:
        return self.manager.pop_blocks_for_free(request)

    def _free_popped(self, popped: list[Any]) -> None:
        self.manager.free_popped_blocks(popped)

    def _take_block_copies(self) -> tuple[list[tuple[int, int]], list[Any]]:
        return self.manager.take_block_copies()

    def _free_retained(self, blocks: list[Any]) -> None:
        self.manager.free_retained_blocks(blocks)

    def _take_new_block_ids(self) -> list[int]:
        return self.manager.take_new_block_ids()

    def _take_state_offloads(self) -> Mapping[str, Sequence[tuple[int, int, int]]]:
        return self.manager.take_boundary_state_offloads()

    def _finalize_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return self.manager.finalize_partial_tail_offloads(request)

    def _new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def _cache_blocks(self, request: kvcore.Request, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(request, num_computed_tokens)

    def _take_events(self) -> list[Any]:
        return self.manager.take_events()

    def _evict(self, block_ids: set[int]) -> None:
        # In the set's order, as vLLM's evict_blocks walks it: the removal events come in that order.
        self.manager.evict_blocks(block_ids)

    def _reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def _table(self, request_id: str) -> GroupIds:
        return tuple(tuple(table) for table in self.manager.get_block_ids(request_id))

    def _holding_request_ids(self) -> list[str]:
        return self.manager.request_ids()

    # -- observation ----------------------------------------------------------

    def _key(self, key: tuple[bytes, int]) -> CacheKey:
        block_hash, group_id = key
        return group_id, self._prefix_of_hash[block_hash]

    def observe(self) -> Observation:
        manager = self.manager
        pool = manager.block_pool
        return Observation(
            free_order=tuple(pool.free_queue.block_ids()),
            free_order_backward=tuple(pool.free_queue.block_ids_from_tail()),
            num_free=pool.num_free_blocks,
            ref_counts=pool.ref_counts(),
            tables=self.tables(),
            cache_entries=frozenset((*self._key(key), block_id) for key, block_id in pool.cache_entries()),
            block_cache_keys=block_keys(
                (self._key(key), block.block_id) for block in pool.blocks for key in pool.block_keys(block)
            ),
            **self.pipeline_fields(),
        )

    def check_internal(self) -> None:
        self.manager.check_invariants()
