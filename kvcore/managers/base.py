"""What every single-type manager shares: tables, allocation, caching, freeing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from kvcore.block import KVBlock
from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec
from kvcore.events import BlockStored
from kvcore.hashing import BlockHash
from kvcore.request import Request

HitBlocks = tuple[list[KVBlock], ...]
"""Blocks of a prefix hit, one list per KV-cache group."""


def block_hashes_at(
    block_hashes: Sequence[BlockHash], hash_block_size: int | None, block_size: int
) -> Sequence[BlockHash]:
    """A request's block hashes (one per ``hash_block_size`` tokens) seen at ``block_size``: each
    block's hash is the one at its last hash boundary, which chains over the whole prefix."""
    if hash_block_size is None or hash_block_size == block_size:
        return block_hashes
    scale = block_size // hash_block_size
    return block_hashes[scale - 1 :: scale]


def hash_boundary_event(request: Request, num_hashes: int, hash_block_size: int, group_id: int) -> BlockStored:
    """The event of entering a block under the key of the request's hash boundary after ``num_hashes``
    hash blocks (one hash block of tokens, after the boundary before it)."""
    boundary = num_hashes * hash_block_size
    tokens = request.all_token_ids
    lookahead = request.num_hash_lookahead_tokens
    return BlockStored(
        block_hashes=(request.block_hashes[num_hashes - 1],),
        parent_block_hash=request.block_hashes[num_hashes - 2] if num_hashes > 1 else None,
        token_ids=tuple(tokens[boundary - hash_block_size : boundary]),
        block_size=hash_block_size,
        group_idx=group_id,
        lookahead_token_ids=(tuple(tokens[boundary : boundary + lookahead]),) if lookahead else None,
    )


def drop_last_block(hit: HitBlocks) -> None:
    """Drop a non-empty hit's last block in every group: an EAGLE drafter recomputes that position."""
    if hit[0]:
        for group_blocks in hit:
            group_blocks.pop()


class SingleTypeManager:
    """The block tables of one KV-cache group (layers of one attention type).

    ``req_to_blocks[request_id]`` is the request's table: one block per
    ``block_size`` tokens, in position order; positions the attention type no
    longer needs hold the null block.  ``num_cached_blocks[request_id]`` counts
    the leading table entries already entered in the prefix cache (or known to
    be cached because they came from a hit); a request is *running* for this
    manager once it has such an entry.
    """

    kind: ClassVar[str] = ""
    counts_main_model_slots: ClassVar[bool] = False
    """The group's slots are the main model's tokens only, not a drafter's lookahead (align-mode Mamba)."""
    zeroed: ClassVar[bool] = True
    """The worker zeroes this group's new blocks when the cache needs zeroing (attention groups; not a
    ring buffer's scratch block, not Mamba states)."""

    def __init__(self, spec: AttentionSpec, pool: BlockPool, group_id: int, enable_caching: bool) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.pool = pool
        self.group_id = group_id
        self.enable_caching = enable_caching
        self.null_block = pool.null_block
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.drops_hits = False
        """The group's hits drop a block for an EAGLE drafter (set by the coordinator)."""
        self.hit_alignment = spec.block_size
        """Hits are a multiple of this many tokens (set by the coordinator: the scheduler block size)."""
        self.retention_interval: int | None = None
        """The configuration's ``prefix_cache_retention_interval`` (set by the coordinator)."""
        self.max_admission_blocks: int | None = None
        """The most blocks a request of this group holds at once (groups that free blocks as they go), set
        by the coordinator from ``max_in_flight_tokens``; ``None``: a request may hold a block per slot."""
        self.partial_hits: dict[str, tuple[int, KVBlock]] = {}
        """Per request: a shared block its table holds at a position where it writes next (a hit ending
        inside the block), to be copied to a block of its own by the next allocation."""
        self.pending_copies: list[tuple[KVBlock, KVBlock]] = []
        self.records_new_blocks = False
        """Whether new blocks are recorded for the worker to zero (set by the coordinator)."""
        self.new_block_ids: list[int] = []
        """Blocks taken for this group since the last :meth:`take_new_block_ids`, to be zeroed."""
        """Block copies (source, destination) the worker must run before the step's writes, not yet taken
        by the caller; each endpoint holds one reference more until the caller releases it."""

    # -- the attention type -------------------------------------------------------

    def admission_cap(self, max_in_flight_tokens: int, max_model_len: int | None, block_size: int) -> int | None:
        """The most blocks a request holds at once when at most ``max_in_flight_tokens`` tokens are
        scheduled and not yet processed (and never more than ``max_model_len`` tokens), counted in
        blocks of ``block_size`` tokens; ``None`` for a group that keeps every block.  (vLLM 0.33.0
        counts blocks of the spec's size on one rank, not the manager's under decode context
        parallelism.)"""
        return None

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """How many leading tokens no future token attends to, once ``num_computed_tokens`` are computed."""
        return 0

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: BlockPool,
        spec: AttentionSpec,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        """The longest prefix hit of at most ``max_length`` tokens that this type accepts.

        Returns one block list per group of ``group_ids`` (null blocks where
        the type needs nothing) and the hit length in tokens.  With
        ``drop_last`` (an EAGLE drafter) the matched run's last block is
        dropped: the drafter recomputes its position.  A hit's length is a
        multiple of ``alignment`` tokens (default: ``spec.block_size``; a
        hybrid cache passes its scheduler block size).
        """
        raise NotImplementedError

    # -- admission and allocation ---------------------------------------------

    def has_partial_hit(self, new_computed_blocks: Sequence[KVBlock], num_local_computed_tokens: int) -> bool:
        """Whether a local hit ends inside one of this group's blocks: its last (shared) block is then
        copied to a block of the request's own before the request writes there."""
        return bool(new_computed_blocks) and num_local_computed_tokens % self.block_size != 0

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
    ) -> int:
        """Free blocks this group consumes to give the request ``num_tokens`` slots.

        Hit blocks that sit in the free queue with ``ref_cnt == 0`` count as
        consumed: touching them takes them out of the queue.  A hit ending
        inside a block (``num_local_computed_tokens``, by default
        ``total_computed_tokens``, not a multiple of the block size) needs one
        block more, for its copy.  With ``apply_admission_cap`` the slots are
        capped at what a request of a group that frees blocks as it goes holds
        at once.
        """
        num_required_blocks = ceil_div(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks is not None:
            num_required_blocks = min(num_required_blocks, self.max_admission_blocks)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_blocks:
            return max(num_required_blocks - num_req_blocks, 0)
        num_skipped_blocks = self.num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks), 0)
        first_kept_hit = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable_hits = sum(
            1 for block in new_computed_blocks[first_kept_hit:] if block.ref_cnt == 0 and not block.is_null
        )
        if num_local_computed_tokens is None:
            num_local_computed_tokens = total_computed_tokens
        if self.has_partial_hit(new_computed_blocks, num_local_computed_tokens):
            num_new_blocks += 1
        return num_new_blocks + num_evictable_hits

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Put a new request's local hit in its table and take a reference on each hit block.

        Hit positions already outside the attention window (counting the
        external tokens too) become null blocks and are not touched.  A hit
        ending inside a block leaves that block's position uncached (its copy
        is cached once full) and marks the block for copying.
        """
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, f"request {request_id!r} already has blocks in group {self.group_id}"
        total_computed_tokens = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_blocks = self.num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = new_computed_blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.pool.touch(kept)
        table.extend([self.null_block] * num_skipped_blocks)
        table.extend(kept)
        self.num_cached_blocks[request_id] = len(table)
        if self.has_partial_hit(kept, num_local_computed_tokens):
            position = num_local_computed_tokens // self.block_size
            self.partial_hits[request_id] = (position, kept[-1])
            self.num_cached_blocks[request_id] = position

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        """Give a new request blocks for the tokens an external connector loads; ``record_for_zeroing=False`` leaves
        them out of the blocks to zero (a load landing after the step writes them).

        Must run only after every group's local hit was taken
        (:meth:`add_local_computed_blocks`): otherwise this group's allocation
        could pop another group's not-yet-touched hit block off the free queue.
        """
        total_computed_tokens = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_tokens = self.num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens > 0:
            num_external_computed_tokens = min(total_computed_tokens - num_skipped_tokens, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        table = self.req_to_blocks.setdefault(request_id, [])
        num_new_blocks = max(0, ceil_div(total_computed_tokens, self.block_size) - len(table))
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        table.extend(new_blocks)
        if record_for_zeroing:
            self.record_new_blocks(new_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVBlock]:
        """Copy a partially hit block to a new block of the request's own (put in its place), then grow
        the table to hold ``num_tokens`` tokens; returns the copy and the blocks added."""
        copies = []
        if request_id in self.partial_hits:
            position, source = self.partial_hits.pop(request_id)
            copy = self.pool.get_new_blocks(1)[0]
            self._copy_on_write(request_id, position, source, copy)
            copies.append(copy)
            self.record_new_blocks(copies)
        table = self.req_to_blocks.setdefault(request_id, [])
        num_new_blocks = ceil_div(num_tokens, self.block_size) - len(table)
        if num_new_blocks <= 0:
            return copies
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        table.extend(new_blocks)
        self.record_new_blocks(new_blocks)
        return copies + new_blocks

    def record_new_blocks(self, blocks: Sequence[KVBlock]) -> None:
        """Record blocks just taken from the pool for the worker to zero, if this group's are zeroed."""
        if self.records_new_blocks:
            self.new_block_ids.extend(block.block_id for block in blocks)

    def take_new_block_ids(self) -> list[int]:
        """The blocks recorded for zeroing since the last call, in the order taken; the record is emptied."""
        block_ids, self.new_block_ids = self.new_block_ids, []
        return block_ids

    def _copy_on_write(self, request_id: str, position: int, source: KVBlock, copy: KVBlock) -> None:
        """Put ``copy`` in place of the shared ``source`` at ``position`` of the request's table and queue
        the block copy.  Both keep one reference more until the caller releases the copy's endpoints
        (the source its hit's, the copy one beside its table slot): nothing can reuse them before the
        worker has copied."""
        table = self.req_to_blocks[request_id]
        assert table[position] is source and not source.is_null and source.ref_cnt > 0
        table[position] = copy
        self.pending_copies.append((source, copy))
        copy.ref_cnt += 1

    def take_pending_copies(self) -> list[tuple[KVBlock, KVBlock]]:
        """The block copies queued since the last call, (source, destination), oldest first."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def take_state_offloads(self) -> list[tuple[str, KVBlock, int]]:
        """Boundary states offered a connector since the last call, as (request id, block, the tokens the
        state is after); only an align-mode Mamba group offers any."""
        return []

    def finalize_tail_offload(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> tuple[KVBlock, int] | None:
        """A finishing request's state left inside the block it was writing, to offer (align-mode Mamba)."""
        return None

    # -- caching and freeing --------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int, replay_boundaries: Sequence[int] = ()) -> None:
        """Enter the request's full blocks among its first ``num_tokens`` tokens in the prefix cache (those
        :meth:`cached_positions` names; ``replay_boundaries`` are where a request repeating the prompt
        resumes)."""
        request_id = request.request_id
        num_cached = self.num_cached_blocks.get(request_id, 0)
        block_hashes = self.block_hashes(request)
        num_full = min(num_tokens, len(block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        table = self.req_to_blocks[request_id]
        positions = self.cached_positions(request, num_cached, num_full, replay_boundaries)
        self.pool.cache_blocks([table[p] for p in positions], [block_hashes[p] for p in positions], self.group_id)
        self.num_cached_blocks[request_id] = num_full
        if self.pool.enable_kv_cache_events:
            self.pool.record_event(self._stored_event(request, num_cached, num_full, positions))

    def block_hashes(self, request: Request) -> Sequence[BlockHash]:
        """The request's block hashes at this group's block size."""
        return block_hashes_at(request.block_hashes, self.pool.hash_block_size, self.block_size)

    def reachable_boundaries(self, request: Request, replay_boundaries: Sequence[int]) -> list[int]:
        """Where a later request can resume from this one's blocks, which a retention interval keeps:
        ``replay_boundaries`` and the end of a prefix the request shares with an earlier one (and, in a
        group that drops, a block below it: a request diverging right after it cannot peek past it)."""
        boundaries = list(replay_boundaries)
        junction = request.shared_prefix_boundary
        if junction:
            boundaries += [junction, junction - self.block_size] if self.drops_hits else [junction]
        return boundaries

    def cached_positions(self, request: Request, start: int, end: int, replay_boundaries: Sequence[int]) -> list[int]:
        """The table positions in ``[start, end)`` whose full blocks can serve a hit, and so are cached:
        every one here."""
        return list(range(start, end))

    def _stored_event(self, request: Request, num_cached: int, num_full: int, positions: Sequence[int]) -> BlockStored:
        """The event of caching blocks ``num_cached`` to ``num_full`` of the request's table, entering those
        at ``positions`` that are not null."""
        block_size = self.block_size
        table = self.req_to_blocks[request.request_id]
        positions = [p for p in positions if not table[p].is_null]
        tokens = request.all_token_ids
        lookahead = request.num_hash_lookahead_tokens
        block_hashes = self.block_hashes(request)
        return BlockStored(
            block_hashes=tuple(block_hashes[p] for p in positions),
            parent_block_hash=block_hashes[num_cached - 1] if num_cached else None,
            token_ids=tuple(tokens[num_cached * block_size : num_full * block_size]),
            block_size=block_size,
            group_idx=self.group_id,
            lookahead_token_ids=(
                tuple(tuple(tokens[(p + 1) * block_size : (p + 1) * block_size + lookahead]) for p in positions)
                if lookahead
                else None
            ),
        )

    def released_block_range(self, num_computed_tokens: int, num_prompt_tokens: int) -> tuple[int, int]:
        """The table positions ``[start, end)`` no future token attends to once ``num_computed_tokens``
        are computed (of a request with a ``num_prompt_tokens``-token prompt): the skipped leading tokens'
        whole blocks."""
        return 0, self.num_skipped_tokens(num_computed_tokens) // self.block_size

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int) -> None:
        """Free the blocks no future token attends to and put the null block in their place.

        The range (:meth:`released_block_range`) is freed from its last block
        backwards, stopping at the first null block (everything before it was
        freed earlier).
        """
        first, end = self.released_block_range(num_computed_tokens, num_prompt_tokens)
        table = self.req_to_blocks.get(request_id)
        if not table or end <= first:
            return
        end = min(end, len(table))
        start = end
        while start > first and not table[start - 1].is_null:
            start -= 1
        if start >= end:
            return
        released = table[start:end]
        table[start:end] = [self.null_block] * (end - start)
        self.pool.free_table(released)

    def pop_blocks_for_free(self, request_id: str) -> list[KVBlock]:
        """Forget the request and return its blocks, in table order without the leading null
        blocks, still referenced: the caller frees them later (tail first)."""
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_blocks.pop(request_id, None)
        self.partial_hits.pop(request_id, None)
        start = 0
        while start < len(table) and table[start].is_null:
            start += 1
        return table[start:]

    def free(self, request_id: str) -> None:
        """Free the request's table, tail block first; an unknown request is a no-op."""
        self.pool.free_table(self.pop_blocks_for_free(request_id))

    def new_step_starts(self) -> None:
        """A scheduler step begins (no per-step state by default)."""

    def check_invariants(self) -> None:
        """Every table is free of repeated blocks; cached counts fit their tables."""
        for request_id, table in self.req_to_blocks.items():
            ids = [block.block_id for block in table if not block.is_null]
            assert len(ids) == len(set(ids)), (
                f"group {self.group_id} request {request_id!r}: a block appears twice in {ids}"
            )
            for block in table:
                assert block.is_null or block.ref_cnt > 0, (
                    f"group {self.group_id} request {request_id!r} holds block {block.block_id} with ref_cnt 0"
                )
            assert self.num_cached_blocks.get(request_id, 0) <= len(table), (
                f"group {self.group_id} request {request_id!r}: more cached blocks than table entries"
            )


class TakesNoHit:
    """Mixin for a group that never takes part in a prefix hit (its slot of a hit stays empty)."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: BlockPool,
        spec: AttentionSpec,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        return tuple([] for _ in group_ids), 0
