"""The allocator's side of a scheduler-driven target: the calls vLLM's scheduler makes of a
``KVCacheManager``, each a hook an adapter supplies for its allocator.

A hook without a default raises :class:`NotImplementedError`; the others do what an allocator
without the feature does (no block copies, no step boundary, hashes published as they are).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from kvmodel.observation import Observation
from kvmodel.ops import GroupIds


def block_ids(groups: Any) -> GroupIds:
    """Block ids of per-group block lists."""
    return tuple(tuple(block.block_id for block in group) for group in groups)


class AllocatorHooks:
    """The allocator-specific calls of a scheduler-driven target, as vLLM's scheduler names them."""

    def _new_request(self, request_id: str, prompt: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def _get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """The local hit: blocks per group (as the allocator passes them back) and its length in tokens."""
        raise NotImplementedError

    def _allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        hit: tuple[Any, int] | None,
        external: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> Any:
        """``allocate_slots``; ``hit`` is ``None`` for a running request. Returns the new blocks or ``None``."""
        raise NotImplementedError

    def _get_num_cached_tokens(self, request: Any) -> int:
        """``get_num_cached_tokens``: the probe of a release that has it."""
        raise NotImplementedError

    def observe(self) -> Observation:
        raise NotImplementedError

    def _truncate_computed_blocks(self, blocks: Any, num_tokens: int) -> Any:
        """``truncate_computed_blocks``: a hit's blocks cut back to its first ``num_tokens`` tokens."""
        raise NotImplementedError

    def _free(self, request: Any) -> None:
        raise NotImplementedError

    def _pop_blocks_for_free(self, request: Any) -> Any:
        """``pop_blocks_for_free``: the request's blocks, forgotten by the allocator but still referenced."""
        raise NotImplementedError

    def _free_popped(self, popped: Any) -> None:
        """Return blocks from :meth:`_pop_blocks_for_free` to the pool, tail first, as the scheduler does."""
        raise NotImplementedError

    def _take_block_copies(self) -> tuple[list[tuple[int, int]], list[Any]]:
        """The block copies the step queued, as (source, destination) block ids, and their endpoints
        (each copy's source, then its destination), held until :meth:`_free_retained` (none by default)."""
        return [], []

    def _free_retained(self, blocks: list[Any]) -> None:
        """Release the endpoints of run block copies, in the order given."""
        raise NotImplementedError

    def _take_new_block_ids(self) -> list[int]:
        """``take_new_block_ids``: the blocks recorded for the worker to zero since the last call."""
        raise NotImplementedError

    def _take_state_offloads(self) -> Mapping[str, Sequence[tuple[int, int, int]]]:
        """``take_boundary_state_offloads``: the boundary states offered a connector since the last call."""
        raise NotImplementedError

    def _finalize_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """``finalize_partial_tail_offloads``: a finishing request's states left inside the blocks it was
        writing, offered before its free."""
        raise NotImplementedError

    def _new_step_starts(self) -> None:
        """``new_step_starts``, called as a scheduler step begins (nothing by default)."""

    def _take_events(self) -> list[Any]:
        """``take_events``: the allocator's KV cache events queued since the last call."""
        raise NotImplementedError

    def _event_hash(self, block_hash: bytes) -> Hashable:
        """A block hash as the allocator's KV cache events publish it (as it is, by default)."""
        return block_hash

    def _cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """``cache_blocks``, as a scheduler calls it after a speculative step's output."""
        raise NotImplementedError

    def _evict(self, block_ids: set[int]) -> None:
        raise NotImplementedError

    def _reset_prefix_cache(self) -> bool:
        raise NotImplementedError

    def _table(self, request_id: str) -> GroupIds:
        raise NotImplementedError

    def _block_ids(self, blocks: Any) -> GroupIds:
        """Block ids of what the allocator returned for a hit or an allocation (per-group lists by default)."""
        return block_ids(blocks)

    def _popped_ids(self, popped: Any) -> tuple[int, ...]:
        """Block ids of what :meth:`_pop_blocks_for_free` returned."""
        return tuple(block.block_id for block in popped)

    def _on_admitted(self, request: Any) -> None:
        """Status bookkeeping after admission (nothing by default)."""

    def _on_preempted(self, request: Any, was_running: bool) -> None:
        """Status bookkeeping after preemption (nothing by default)."""

    def _on_finished(self, request: Any) -> None:
        """Status bookkeeping before the request is freed for good (nothing by default)."""
