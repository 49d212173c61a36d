"""Coordinators: the groups of one KV cache, driven together over one block pool."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvcore.block import KVBlock
from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec, KVCacheConfig, is_full_attention, is_prefix_cacheable
from kvcore.hashing import BlockHash
from kvcore.managers import CrossAttentionManager, SingleTypeManager, manager_class_for
from kvcore.managers.base import HitBlocks
from kvcore.managers.mamba import AlignedMambaManager
from kvcore.request import Request


class KVCacheCoordinator:
    """Drives one manager per KV-cache group over a shared block pool.

    Subclasses differ only in how they find a prefix hit.
    """

    def __init__(self, config: KVCacheConfig, enable_caching: bool) -> None:
        self.config = config
        self.pool = BlockPool(
            config.num_blocks, enable_caching, config.enable_kv_cache_events, hash_block_size=config.hash_block_size
        )
        self.managers: tuple[SingleTypeManager, ...] = tuple(
            manager_class_for(spec)(spec, self.pool, group_id, enable_caching)
            for group_id, spec in enumerate(config.manager_specs)
        )
        self.hit_alignment = config.hash_block_size if config.partial_hits else config.scheduler_block_size
        """Hits are a multiple of this many tokens: the scheduler block size, or the hash block size with
        sub-block hits."""
        for manager in self.managers:
            manager.hit_alignment = self.hit_alignment
            if isinstance(manager, AlignedMambaManager):
                manager.drops_checkpoint_block = config.use_eagle
                manager.shared_prefix_checkpoint = config.shared_prefix_checkpoint
            manager.retention_interval = config.prefix_cache_retention_interval
            manager.records_new_blocks = config.needs_zeroing and manager.zeroed
        if config.max_in_flight_tokens is not None:
            for manager, spec in zip(self.managers, config.groups):
                manager.max_admission_blocks = manager.admission_cap(
                    config.max_in_flight_tokens, config.max_model_len, spec.block_size
                )

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) -> tuple[HitBlocks, int, int]:
        """The hit blocks per group, the hit length in tokens, and how many tokens past the hit some
        group found cached (a prefix shared with an earlier request that another group has not cached)."""
        raise NotImplementedError

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        num_local_computed_tokens: int | None = None,
        num_hash_lookahead_tokens: int = 0,
        prefill_end: int = 0,
    ) -> int:
        """Free blocks all groups together consume to give the request ``num_tokens`` slots (and a
        cross-attention group ``num_encoder_tokens`` slots, an align-mode Mamba group
        ``num_tokens_main_model``: ``num_tokens`` without the lookahead, by default all of them).
        ``num_local_computed_tokens`` (by default ``total_computed_tokens``) ends the local hit; an
        align-mode Mamba group places a prefill checkpoint short of ``num_hash_lookahead_tokens``, the
        tokens the request's hashes look ahead, and, under a retention interval of 0, only in a chunk
        reaching ``prefill_end`` (where the request's prefill ends)."""
        if self.config.prefix_cache_retention_interval != 0:
            prefill_end = 0
        total = 0
        for manager, hit in zip(self.managers, new_computed_blocks):
            if isinstance(manager, CrossAttentionManager):
                total += manager.num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0, apply_admission_cap)
                continue
            slots = _slots_of(manager, num_tokens, num_tokens_main_model)
            arguments = (request_id, slots, hit, total_computed_tokens, apply_admission_cap, num_local_computed_tokens)
            if isinstance(manager, AlignedMambaManager):
                total += manager.num_blocks_to_allocate(
                    *arguments, num_hash_lookahead_tokens=num_hash_lookahead_tokens, prefill_end=prefill_end
                )
            else:
                total += manager.num_blocks_to_allocate(*arguments)
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: HitBlocks,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> None:
        """Take a new request's local hit in every group, then allocate for its external tokens (not
        recorded for zeroing in the groups of ``skip_zeroing_group_ids``, which a load writes later).

        The two phases are not interleaved per group: allocating one group's
        external blocks pops the head of the free queue, which may be another
        group's cached hit block that was not touched yet.  Touching every
        group's hit first takes all of them out of the queue.  A running
        request gets no new hit, so this is a no-op for it.
        """
        if any(request_id in manager.num_cached_blocks for manager in self.managers):
            return
        for manager, hit in zip(self.managers, new_computed_blocks):
            manager.add_local_computed_blocks(request_id, hit, num_local_computed_tokens, num_external_computed_tokens)
        if num_external_computed_tokens > 0:
            for manager in self.managers:
                manager.allocate_external_computed_blocks(
                    request_id,
                    num_local_computed_tokens,
                    num_external_computed_tokens,
                    record_for_zeroing=manager.group_id not in skip_zeroing_group_ids,
                )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_encoder_tokens: int = 0, num_tokens_main_model: int | None = None
    ) -> tuple[list[KVBlock], ...]:
        """Grow every table to ``num_tokens`` slots; a cross-attention group's to ``num_encoder_tokens``, an
        align-mode Mamba group's to ``num_tokens_main_model`` (by default ``num_tokens``)."""
        return tuple(
            manager.allocate_new_blocks(
                request_id,
                num_encoder_tokens
                if isinstance(manager, CrossAttentionManager)
                else _slots_of(manager, num_tokens, num_tokens_main_model),
            )
            for manager in self.managers
        )

    def num_cacheable_tokens(self, num_tokens: int, group_id: int) -> int:
        """How many of the first ``num_tokens`` computed tokens group ``group_id`` may cache: all but
        the ones a multi-module drafter may prefill again."""
        return max(0, num_tokens - self.config.num_reprefillable_tokens)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        # Only a retention interval keeps blocks for the replay boundaries.
        boundaries = (
            replay_boundaries(
                request.num_prompt_tokens, self.config.scheduler_block_size, bool(self.config.drop_group_ids)
            )
            if self.config.prefix_cache_retention_interval is not None
            else ()
        )
        for group_id, manager in enumerate(self.managers):
            if manager.enable_caching:
                manager.cache_blocks(request, self.num_cacheable_tokens(num_tokens, group_id), boundaries)

    def new_step_starts(self) -> None:
        for manager in self.managers:
            manager.new_step_starts()

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int) -> None:
        for manager in self.managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)

    def free(self, request_id: str) -> None:
        """Free the request in every group, group 0 first, each table tail first."""
        for manager in self.managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVBlock]:
        """Forget the request in every group and return its blocks, group 0's first, still referenced."""
        return [block for manager in self.managers for block in manager.pop_blocks_for_free(request_id)]

    def take_new_block_ids(self) -> list[int]:
        """Every group's blocks recorded for zeroing since the last call, group by group."""
        return [block_id for manager in self.managers for block_id in manager.take_new_block_ids()]

    def take_pending_copies(self) -> list[tuple[KVBlock, KVBlock]]:
        """Every group's queued block copies (source, destination), group 0's first."""
        return [copy for manager in self.managers for copy in manager.take_pending_copies()]

    def take_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Every group's offered boundary states, group 0's first, per request (in the order requests first
        appear) as (group, block id, the tokens the state is after)."""
        offloads: dict[str, list[tuple[int, int, int]]] = {}
        for manager in self.managers:
            for request_id, block, num_tokens in manager.take_state_offloads():
                offloads.setdefault(request_id, []).append((manager.group_id, block.block_id, num_tokens))
        return offloads

    def finalize_tail_offloads(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> list[tuple[int, int, int]]:
        """Each group's state a finishing request left inside the block it was writing, to offer, as
        (group, block id, the tokens the state is after)."""
        offloads = []
        for manager in self.managers:
            tail = manager.finalize_tail_offload(request_id, num_computed_tokens, num_in_flight_tokens)
            if tail is not None:
                offloads.append((manager.group_id, tail[0].block_id, tail[1]))
        return offloads

    def get_blocks(self, request_id: str) -> tuple[list[KVBlock], ...]:
        return tuple(list(manager.req_to_blocks.get(request_id, ())) for manager in self.managers)


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Any number of groups, prefix caching off: there is never a hit."""

    def __init__(self, config: KVCacheConfig) -> None:
        super().__init__(config, enable_caching=False)

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) -> tuple[HitBlocks, int, int]:
        return tuple([] for _ in self.managers), 0, 0


class UnitaryCoordinator(KVCacheCoordinator):
    """One group with prefix caching: the hit is that group's own."""

    def __init__(self, config: KVCacheConfig) -> None:
        super().__init__(config, enable_caching=True)
        self.managers[0].drops_hits = 0 in config.drop_group_ids

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) -> tuple[HitBlocks, int, int]:
        """The group's own hit; for an EAGLE drafter, its last block dropped (no look past the cap).  No
        other group can have cached more."""
        manager = self.managers[0]
        blocks, hit_length = manager.find_longest_cache_hit(
            block_hashes, max_length, [0], self.pool, manager.spec, drop_last=0 in self.config.drop_group_ids
        )
        return blocks, hit_length, 0


@attrs.frozen
class _SpecGroup:
    """KV-cache groups with one spec, looked up together: a block position hits only if all do."""

    spec: AttentionSpec
    group_ids: list[int]
    manager_class: type[SingleTypeManager]
    drops: bool = False
    """An EAGLE drafter's layers are in one of the groups: the group's lookups drop a block."""


class HybridCoordinator(KVCacheCoordinator):
    """Several groups, possibly of different attention types, with prefix caching."""

    def __init__(self, config: KVCacheConfig) -> None:
        super().__init__(config, enable_caching=True)
        spec_groups: list[_SpecGroup] = []
        drop_group_ids = config.drop_group_ids

        def spec_key(group_id: int) -> tuple[AttentionSpec, bool, str | None]:
            # vLLM's spec: the block size per rank, whether decode context parallelism shards it, the dtype.
            dtype = config.kv_cache_dtypes[group_id] if config.kv_cache_dtypes else None
            return config.groups[group_id], config.dcp_sharded(group_id), dtype

        for group_id, manager in enumerate(self.managers):
            if not is_prefix_cacheable(manager.spec):
                # A ring buffer's scratch block is never shared: its slot of a hit stays empty.
                continue
            drops = group_id in drop_group_ids
            for index, spec_group in enumerate(spec_groups):
                if spec_key(spec_group.group_ids[0]) == spec_key(group_id):
                    spec_group.group_ids.append(group_id)
                    if drops and not spec_group.drops:
                        spec_groups[index] = attrs.evolve(spec_group, drops=True)
                    break
            else:
                spec_groups.append(_SpecGroup(manager.spec, [group_id], type(manager), drops))
        # Full attention first: its left-to-right scan gives the tightest
        # first bound for the other types.
        spec_groups.sort(key=lambda g: not is_full_attention(g.spec))
        self.spec_groups = tuple(spec_groups)
        # A group drops if any group sharing its spec holds the drafter.
        self.dropping_group_ids = frozenset(g for sg in self.spec_groups if sg.drops for g in sg.group_ids)
        for group_id in self.dropping_group_ids:
            self.managers[group_id].drops_hits = True

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) -> tuple[HitBlocks, int, int]:
        """The longest prefix every group accepts, found by a fixed-point iteration.

        Each spec group in turn either accepts the current candidate length or
        lowers it to the longest hit it accepts below it; a lowered candidate
        is checked again by every group.  The candidate only decreases and is
        bounded below by 0, so the iteration ends.  Full attention accepts
        every length below its own hit, so its lookup runs once and is then
        trimmed.  With exactly one full-attention and one other spec group,
        one pass suffices.

        With an EAGLE drafter (``use_eagle``), the lookups of the groups that
        hold its layers (and of groups sharing their spec) drop the last
        matched block, and so look one block past the candidate (never past
        the hashed blocks) to find it.  A group that dropped is *verified*;
        it drops again at a lower candidate only after a lookup that did not
        drop lowered the candidate (a lowering by another group's own drop
        keeps it verified).

        The longest length any lookup returned, less the hit, is the shared
        prefix some group cached and another did not (third value).
        """
        num_groups = len(self.managers)
        hit_blocks: list[list[KVBlock] | None] = [None] * num_groups
        hit_lengths = [0] * num_groups
        one_pass = len(self.spec_groups) == 2 and is_full_attention(self.spec_groups[0].spec)
        hashed_tokens = len(block_hashes) * self.config.hash_block_size
        alignment = self.hit_alignment
        verified: set[int] = set()
        hit_length = max_length
        longest = 0
        while True:
            candidate = hit_length
            for index, spec_group in enumerate(self.spec_groups):
                first = spec_group.group_ids[0]
                if is_full_attention(spec_group.spec) and hit_blocks[first] is not None:
                    candidate = min(candidate, hit_lengths[first])
                    continue
                drop = spec_group.drops and index not in verified
                # A Mamba lookup never drops (a drafter has no Mamba layers): no look past the candidate.
                peeks = drop and not issubclass(spec_group.manager_class, AlignedMambaManager)
                lookup_length = (
                    min(candidate + self._eagle_margin(spec_group.spec), hashed_tokens) if peeks else candidate
                )
                blocks, found = spec_group.manager_class.find_longest_cache_hit(
                    block_hashes,
                    lookup_length,
                    spec_group.group_ids,
                    self.pool,
                    spec_group.spec,
                    drop_last=drop,
                    alignment=alignment,
                )
                if drop:
                    verified.add(index)
                elif found < candidate:
                    verified.clear()
                candidate = found
                longest = max(longest, found)
                for group_id, group_blocks in zip(spec_group.group_ids, blocks):
                    hit_blocks[group_id] = group_blocks
                    hit_lengths[group_id] = candidate
            if candidate >= hit_length:
                break
            hit_length = candidate
            if one_pass:
                break
        for spec_group in self.spec_groups:
            if is_full_attention(spec_group.spec):
                num_blocks = ceil_div(hit_length, spec_group.spec.block_size)
                for group_id in spec_group.group_ids:
                    trimmed = hit_blocks[group_id]
                    if trimmed is not None:
                        del trimmed[num_blocks:]
        return tuple(blocks if blocks is not None else [] for blocks in hit_blocks), hit_length, longest - hit_length

    def _eagle_margin(self, spec: AttentionSpec) -> int:
        """How far a dropping lookup looks past the candidate: the unit it drops, a hash block with
        sub-block hits (every group's blocks are then a multiple of it), else one of its blocks."""
        return min(self.config.hash_block_size, spec.block_size) if self.config.partial_hits else spec.block_size

    def num_cacheable_tokens(self, num_tokens: int, group_id: int) -> int:
        """A hybrid cache caches up to a hit boundary (a multiple of the scheduler block size; every
        token with sub-block hits, whose copies would otherwise be cached again); only a group that
        drops keeps the tokens a multi-module drafter may prefill again out of the cache (with one more
        of its blocks: its lookups peek past the hit)."""
        alignment = 1 if self.config.partial_hits else self.config.scheduler_block_size
        aligned = num_tokens // alignment * alignment
        if group_id in self.dropping_group_ids and aligned > 0:
            finalized = max(0, num_tokens - self.config.num_reprefillable_tokens)
            return min(finalized, finalized // alignment * alignment + self.managers[group_id].block_size)
        return aligned


def _slots_of(manager: SingleTypeManager, num_tokens: int, num_tokens_main_model: int | None) -> int:
    """The slots ``manager`` is given: the main model's, for a group a drafter has no layers in."""
    if manager.counts_main_model_slots and num_tokens_main_model is not None:
        return num_tokens_main_model
    return num_tokens


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, drops: bool) -> tuple[int, ...]:
    """Where a later request repeating the prompt resumes: a resend hits up to its last token
    (``num_prompt_tokens - 1``).  With an EAGLE drafter, a hit lands one scheduler block below an
    aligned boundary: that of the resend and that of a longer request sharing the whole prompt."""
    if not drops:
        return (num_prompt_tokens - 1,)
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    longer = num_prompt_tokens // block * block
    return tuple(sorted({max(resend - block, 0), max(longer - block, 0)}))


def make_coordinator(config: KVCacheConfig) -> KVCacheCoordinator:
    """The coordinator for ``config``: no prefix cache, unitary, or hybrid."""
    if not config.enable_caching:
        return NoPrefixCacheCoordinator(config)
    if len(config.groups) == 1:
        return UnitaryCoordinator(config)
    return HybridCoordinator(config)
