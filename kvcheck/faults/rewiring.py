"""Ways of rewiring one manager instance that the plants of several families share.

Each works on one instance: a method replaced on the object, or the object moved to a subclass of
its own class (and its coordinator's record of the class updated); classes are never patched.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

import kvcore
from kvcore.block import KVBlock
from kvcore.errors import InvalidArgument, OutOfBlocks
from kvcore.managers.base import SingleTypeManager
from kvcore.managers.mamba import AlignedMambaManager


def reuse_cached_blocks_by(pool: kvcore.BlockPool, uncache: Callable[[KVBlock], None]) -> None:
    """Make ``pool.get_new_blocks`` hand out blocks as kvcore does, but drop a reused cached block's
    entry with ``uncache`` in place of the pool's own eviction."""

    def get_new_blocks(n_blocks: int) -> list[KVBlock]:
        if n_blocks < 0:
            raise InvalidArgument("n_blocks", n_blocks, "must be >= 0")
        if n_blocks > pool.free_queue.num_free:
            raise OutOfBlocks(requested=n_blocks, available=pool.free_queue.num_free)
        blocks = pool.free_queue.popleft_n(n_blocks)
        for block in blocks:
            if block.block_hash is not None:
                uncache(block)
            block.ref_cnt = 1
        return blocks

    pool.get_new_blocks = get_new_blocks  # type: ignore[method-assign]


def move_managers(manager: kvcore.KVCacheManager, cls: type[Any], faulty: type[Any]) -> None:
    """Move this manager's single-type managers of class ``cls`` to the subclass ``faulty``."""
    coordinator = manager.coordinator
    for group_manager in coordinator.managers:
        if type(group_manager) is cls:
            group_manager.__class__ = faulty
    # A hybrid coordinator looks hits up through the class it recorded per spec group.
    spec_groups = getattr(coordinator, "spec_groups", None)
    if spec_groups is not None:
        coordinator.spec_groups = tuple(  # type: ignore[attr-defined]
            attrs.evolve(g, manager_class=faulty) if g.manager_class is cls else g for g in spec_groups
        )


def borrow_method(managers: Iterable[Any], kind: type, name: str, lender: type) -> None:
    """Give every manager of class ``kind`` the method ``name`` as ``lender`` defines it: a manager that
    skips its own override (kvcore's and vLLM's managers alike)."""
    for group_manager in managers:
        if isinstance(group_manager, kind):
            setattr(group_manager, name, types.MethodType(getattr(lender, name), group_manager))


def aligned_mamba_managers(manager: kvcore.KVCacheManager) -> list[AlignedMambaManager]:
    """The manager's Mamba groups in the ``align`` mode."""
    return [m for m in manager.coordinator.managers if isinstance(m, AlignedMambaManager)]


def aligned_mamba_managers_in_vllm(manager: Any) -> list[Any]:
    """The manager's Mamba groups in the ``align`` mode."""
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    return [
        group_manager
        for group_manager in manager.coordinator.single_type_managers
        if isinstance(group_manager, MambaManager) and group_manager.mamba_cache_mode == "align"
    ]


Recount = Callable[[SingleTypeManager, int, str, int, Sequence[KVBlock], int], int]
"""A planted admission count: (group manager, its count, request id, slots, hit blocks, tokens of the
local hit) -> the count the bug gives."""


def recount_blocks(group_manager: SingleTypeManager, recount: Recount) -> None:
    """Plant ``recount`` into the group manager's admission count.  A count above the pool (a Mamba
    state cached this step: refused either way) is left as it is."""
    count_blocks = group_manager.num_blocks_to_allocate

    def num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
        **more: Any,
    ) -> int:
        count = count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
            num_local_computed_tokens,
            **more,
        )
        if count > group_manager.pool.num_blocks:
            return count
        local = total_computed_tokens if num_local_computed_tokens is None else num_local_computed_tokens
        return recount(group_manager, count, request_id, num_tokens, new_computed_blocks, local)

    group_manager.num_blocks_to_allocate = num_blocks_to_allocate  # type: ignore[method-assign]


def recount_blocks_in_vllm(group_manager: Any, recount: Callable[[Any, int, str, int, Any, int], int]) -> None:
    """Plant ``recount(group_manager, count, request_id, num_tokens_main_model, hit blocks, tokens of
    the local hit)`` into a vLLM group manager's admission count; a count above the pool (a Mamba state
    cached this step: refused either way) is left as it is."""
    count_blocks: Callable[..., int] = group_manager.get_num_blocks_to_allocate

    def get_num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        count = count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_local_computed_tokens,
            num_tokens_main_model,
            apply_admission_cap=apply_admission_cap,
            prefill_end=prefill_end,
        )
        if count > group_manager.block_pool.num_gpu_blocks:
            return count
        return recount(
            group_manager, count, request_id, num_tokens_main_model, new_computed_blocks, num_local_computed_tokens
        )

    group_manager.get_num_blocks_to_allocate = get_num_blocks_to_allocate


def after_hit_taken(group_managers: Iterable[Any], then: Callable[[Any, str, Sequence[Any]], None]) -> None:
    """Run ``then(group_manager, request_id, hit_blocks)`` each time a group manager has taken a hit
    (``add_local_computed_blocks``, a name kvcore's and vLLM's managers share)."""
    for group_manager in group_managers:
        take_hit = group_manager.add_local_computed_blocks

        def add_local_computed_blocks(
            request_id: str,
            new_computed_blocks: Sequence[Any],
            *args: Any,
            group_manager: Any = group_manager,
            take_hit: Callable[..., None] = take_hit,
        ) -> None:
            take_hit(request_id, new_computed_blocks, *args)
            then(group_manager, request_id, new_computed_blocks)

        group_manager.add_local_computed_blocks = add_local_computed_blocks
