"""The kvcore target: kvcore's KVCacheManager driven the way vLLM's scheduler drives it."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcheck.config import TargetConfig
from kvcheck.observation import CacheKey, Observation
from kvcheck.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    GroupIds,
    Operation,
    Preempt,
    ResetPrefixCache,
    Schedule,
    StepResult,
    plan_schedule,
)


def to_kvcore_config(config: TargetConfig) -> kvcore.KVCacheConfig:
    """The kvcore configuration of a target configuration."""
    specs: list[kvcore.AttentionSpec] = []
    for group in config.groups:
        if group.kind == "full":
            specs.append(kvcore.FullAttentionSpec(config.block_size))
        elif group.kind == "sliding_window":
            assert group.window is not None
            specs.append(kvcore.SlidingWindowSpec(config.block_size, group.window))
        else:
            assert group.window is not None
            specs.append(kvcore.ChunkedLocalAttentionSpec(config.block_size, group.window))
    return kvcore.KVCacheConfig(config.num_blocks, specs, enable_caching=config.enable_caching)


def _ids(groups: tuple[list[kvcore.KVBlock], ...]) -> GroupIds:
    return tuple(tuple(block.block_id for block in group) for group in groups)


class KvcoreTarget:
    """Drives a :class:`kvcore.KVCacheManager`.

    ``manager_factory`` builds the manager from the kvcore configuration; a
    fault replaces it with one that builds a manager carrying a planted bug.
    """

    name = "kvcore"

    def __init__(
        self,
        config: TargetConfig,
        manager_factory: Callable[[kvcore.KVCacheConfig], kvcore.KVCacheManager] = kvcore.KVCacheManager,
    ) -> None:
        self.config = config
        self.manager = manager_factory(to_kvcore_config(config))
        self.requests: dict[str, kvcore.Request] = {}
        self.running: set[str] = set()
        # Hashes are opaque bytes; observations speak of token prefixes.
        self._prefix_of_hash: dict[bytes, tuple[int, ...]] = {}

    # -- operations -----------------------------------------------------------

    def apply(self, op: Operation) -> StepResult:
        manager = self.manager
        if isinstance(op, AddRequest):
            request = kvcore.Request(op.request_id, op.prompt, self.config.block_size)
            self.requests[op.request_id] = request
            self._learn_hashes(request)
            return StepResult()
        if isinstance(op, Schedule):
            return self._schedule(op)
        if isinstance(op, Finish):
            manager.free(op.request_id)
            del self.requests[op.request_id]
            self.running.discard(op.request_id)
            return StepResult()
        if isinstance(op, FailedLoad):
            held = {block_id for table in manager.get_block_ids(op.request_id) for block_id in table if block_id}
            manager.evict_blocks(sorted(held))
            self._preempt(op.request_id)
            return StepResult()
        if isinstance(op, Preempt):
            self._preempt(op.request_id)
            return StepResult()
        if isinstance(op, EvictBlocks):
            manager.evict_blocks(op.block_ids)
            return StepResult()
        if isinstance(op, ResetPrefixCache):
            return StepResult(reset_done=manager.reset_prefix_cache())
        raise TypeError(f"unknown operation {op!r}")

    def _schedule(self, op: Schedule) -> StepResult:
        request = self.requests[op.request_id]
        waiting = op.request_id not in self.running
        if waiting:
            hit_blocks, hit_length = self.manager.get_computed_blocks(request)
            amounts = plan_schedule(op, request.num_tokens, request.num_computed_tokens, hit_length)
            new_blocks = self.manager.allocate_slots(
                request,
                amounts.num_new_tokens,
                hit_length,
                hit_blocks,
                num_external_computed_tokens=amounts.num_external_tokens,
            )
            hit_ids: GroupIds | None = _ids(hit_blocks)
        else:
            hit_length, hit_ids = 0, None
            amounts = plan_schedule(op, request.num_tokens, request.num_computed_tokens, None)
            new_blocks = self.manager.allocate_slots(request, amounts.num_new_tokens)
        result_hit_length = hit_length if waiting else None
        if new_blocks is None:
            return StepResult(admitted=False, hit_length=result_hit_length, hit_block_ids=hit_ids)
        self.running.add(op.request_id)
        request.num_computed_tokens += hit_length + amounts.num_external_tokens + amounts.num_new_tokens
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token_ids(op.sampled_token)
            self._learn_hashes(request)
        return StepResult(
            admitted=True,
            hit_length=result_hit_length,
            hit_block_ids=hit_ids,
            new_block_ids=_ids(new_blocks),
            num_external_tokens=amounts.num_external_tokens,
        )

    def _preempt(self, request_id: str) -> None:
        self.manager.free(request_id)
        self.requests[request_id].num_computed_tokens = 0
        self.running.discard(request_id)

    def _learn_hashes(self, request: kvcore.Request) -> None:
        block_size = self.config.block_size
        tokens = request.all_token_ids
        for index, block_hash in enumerate(request.block_hashes):
            if block_hash not in self._prefix_of_hash:
                self._prefix_of_hash[block_hash] = tuple(tokens[: (index + 1) * block_size])

    # -- observation ----------------------------------------------------------

    def _key(self, key: tuple[bytes, int]) -> CacheKey:
        block_hash, group_id = key
        return group_id, self._prefix_of_hash[block_hash]

    def observe(self) -> Observation:
        manager = self.manager
        pool = manager.block_pool
        tables = {}
        for request_id in manager.request_ids():
            ids = manager.get_block_ids(request_id)
            if any(ids):
                tables[request_id] = tuple(tuple(group) for group in ids)
        return Observation(
            free_order=tuple(pool.free_queue.block_ids()),
            free_order_backward=tuple(pool.free_queue.block_ids_from_tail()),
            num_free=pool.num_free_blocks,
            ref_counts=pool.ref_counts(),
            tables=tables,
            cache_entries=frozenset((*self._key(key), block_id) for key, block_id in pool.cache_entries()),
            block_cache_keys={
                block.block_id: self._key(block.block_hash) for block in pool.blocks if block.block_hash is not None
            },
        )

    def check_internal(self) -> None:
        self.manager.check_invariants()
