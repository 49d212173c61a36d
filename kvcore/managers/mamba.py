"""Mamba state groups: vLLM's ``none`` cache mode (one live state, plus blocks for draft states) and its
``align`` mode (states on block boundaries, prefix-cached)."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block import KVBlock
from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec, MambaSpec
from kvcore.hashing import BlockHash, BlockHashWithGroup
from kvcore.managers.base import HitBlocks, SingleTypeManager, TakesNoHit, block_hashes_at, hash_boundary_event
from kvcore.request import Request


class MambaManager(TakesNoHit, SingleTypeManager):
    """A request keeps the block holding the state of its last computed token, and the blocks after it.

    Once ``n`` tokens are computed, the next token reads only token
    ``n - 1``'s state: every block before that token's is freed and replaced
    by the null block, like a one-token window.  Every allocation asks for
    ``num_speculative_blocks`` blocks more than the slots need: a verifier
    writes the states of draft tokens there.  The group takes no prefix hit
    (caching is off with this mode).
    """

    kind = "mamba"
    zeroed = False
    spec: MambaSpec

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)

    def _with_speculative_blocks(self, num_tokens: int) -> int:
        return num_tokens + self.spec.num_speculative_blocks * self.block_size

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
    ) -> int:
        return super().num_blocks_to_allocate(
            request_id,
            self._with_speculative_blocks(num_tokens),
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
            num_local_computed_tokens,
        )

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVBlock]:
        return super().allocate_new_blocks(request_id, self._with_speculative_blocks(num_tokens))


class AlignedMambaManager(MambaManager):
    """A Mamba group in vLLM's ``align`` cache mode: states on block boundaries, prefix-cached.

    Table position ``p`` holds the state after ``(p + 1) * block_size``
    tokens.  A step whose slots reach a new block gets exactly one new block,
    at the position of its last slot; the positions it skips hold the null
    block.  The block that held the state before the step (the *last state
    block*, copied from) stays until a later step's computed tokens pass it,
    and every block before the one holding the last computed token's state is
    freed, null gaps and all.  Slots are counted for the main model only: a
    drafter has no Mamba layers, so lookahead tokens get no state block.
    ``num_speculative_blocks`` blocks follow the last state; a request's
    first allocation takes them, and a later step whose new state positions
    pass over them moves them, whole, to the table's end.

    Full blocks are cached under their prefix's hash, like attention blocks,
    null positions skipped.  A hit needs only the state block at its end: the
    search runs right to left from the longest candidate and stops at the
    first cached state on the hit alignment, padding the positions before it
    with the null block.  A request may not hit a state cached in the current
    scheduler step (its state is not computed yet): admission then asks for
    more blocks than the pool has (``num_blocks + 1``), until
    :meth:`new_step_starts`.

    With hashes finer than the blocks and sub-block hits on (the
    coordinator's ``hit_alignment`` below the block size), the search runs
    over hash boundaries, and the state at the prompt's last hash boundary
    is also cached when a step ends there, inside its block, under that
    boundary's key.  A hit there is copied to a block of the request's own
    (the base class's copy on write).  The request that cached it goes on
    writing its block: its next allocation takes a new block, moves the
    state's cache entry to it and queues the copy into it.

    With prefill checkpoints (:attr:`MambaSpec.has_prefill_checkpoints`) a
    chunk whose backend can export a state inside it keeps one: the state at
    the last hit boundary (on :attr:`hit_alignment`) short of the chunk's last
    token, written into the block before the last state's position (a new
    block there instead of the null one, or the speculative block already
    there).  Its cache entry is that boundary's key, in place of the block's
    own full key, when the boundary is a block boundary, the prompt's
    checkpoint or the end of a prefix shared with an earlier request;
    otherwise the state is transient and the block keeps no key.  While a
    checkpoint is recorded, the prompt's last hash boundary is not cached
    inside its block (the checkpoint stands for it).

    Under a retention interval (vLLM's sparse state retention) only the
    states a later hit can resume from are cached: one per interval (none
    for 0), those at the prompt's replay boundary and at a shared prefix's
    end (:meth:`cached_positions`); a checkpoint on a block boundary the
    interval skips is transient.  With an interval of 0, only the chunk
    that ends the prefill keeps a checkpoint.
    """

    counts_main_model_slots = True

    def __init__(self, spec: MambaSpec, pool: BlockPool, group_id: int, enable_caching: bool) -> None:
        super().__init__(spec, pool, group_id, enable_caching)
        self.last_state_block: dict[str, int] = {}
        """Per request: the table position of the state the latest allocation copies from."""
        self.num_retired_blocks: dict[str, int] = {}
        """Per request: leading table positions already freed (only null blocks there)."""
        self.allocated_requests: set[str] = set()
        """Requests that have had an allocation (not only a hit) since they were last freed."""
        self.cached_this_step: set[BlockHashWithGroup] = set()
        """Keys of states cached in the current scheduler step."""
        self.checkpoints: dict[str, tuple[int, int]] = {}
        """Per request: the prefill checkpoint of its latest allocation, as (the tokens its state is
        after, the table position of its block)."""
        self.drops_checkpoint_block = False
        """An EAGLE drafter serves the model (set by the coordinator): its prompt's reusable state and
        its prefill checkpoints sit one hit boundary lower, where the attention groups' hits land."""
        self.shared_prefix_checkpoint = False
        """The state at the end of a prefix a lookup found shared is cached too (set by the coordinator:
        :attr:`kvcore.KVCacheConfig.shared_prefix_checkpoint`)."""
        self.state_offloads: list[tuple[str, KVBlock, int]] = []
        """Boundary states offered a connector since :meth:`take_state_offloads`, as (request id, the block
        holding the state, the tokens it is after): each state cached whole in a block, and the copy of a
        state a request cached inside the block it goes on writing."""
        self.producer_tails: dict[str, tuple[KVBlock, int]] = {}
        """Per request: a state it cached inside the block it goes on writing, as (that block, the tokens
        the state is after), until its next allocation copies it for the cache (the copy is offered) or it
        finishes (:meth:`finalize_tail_offload`)."""

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
        """The latest cached state at most ``max_length`` tokens in whose end is on ``alignment``: that
        block, after null blocks, in every group; with an alignment dividing the block size below it
        (sub-block hits), the latest state cached at any hash boundary.  (A drafter has no Mamba layers:
        nothing is dropped.)"""
        block_size = spec.block_size
        alignment = alignment or block_size
        if alignment < block_size and block_size % alignment == 0:
            for index in range(min(max_length // alignment, len(block_hashes)) - 1, -1, -1):
                cached = pool.get_cached_block(block_hashes[index], group_ids)
                if cached is not None:
                    position = index // (block_size // alignment)
                    return tuple([pool.null_block] * position + [block] for block in cached), (index + 1) * alignment
            return tuple([] for _ in group_ids), 0
        hashes = block_hashes_at(block_hashes, pool.hash_block_size, block_size)
        for position in range(min(max_length // block_size, len(hashes)) - 1, -1, -1):
            cached = pool.get_cached_block(hashes[position], group_ids)
            if cached is None or (position + 1) * block_size % alignment:
                continue
            return tuple([pool.null_block] * position + [block] for block in cached), (position + 1) * block_size
        return tuple([] for _ in group_ids), 0

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
        num_hash_lookahead_tokens: int = 0,
        prefill_end: int = 0,
    ) -> int:
        """At most one new block (and the speculative blocks, on a request's first allocation; none when
        the slots fit the table; one more for a copy on write, one more for a prefill checkpoint), plus
        hit blocks sitting free; a count below zero when the table already reaches past the slots (vLLM
        0.33.0 sums it as it is).  Unless ``apply_admission_cap`` (the whole-request gate), records the
        prefill checkpoint the chunk from ``total_computed_tokens`` to ``num_tokens`` keeps, if any, for
        the allocation and caching that follow (hashes covering ``num_hash_lookahead_tokens`` tokens
        past their end; only a chunk reaching ``prefill_end`` keeps one)."""
        if new_computed_blocks and new_computed_blocks[-1].block_hash in self.cached_this_step:
            return self.pool.num_blocks + 1
        num_new_blocks = (
            self._num_required_blocks(num_tokens)
            - len(new_computed_blocks)
            - len(self.req_to_blocks.get(request_id, ()))
        )
        if num_local_computed_tokens is None:
            num_local_computed_tokens = total_computed_tokens
        copies = self.has_partial_hit(new_computed_blocks, num_local_computed_tokens) or request_id in self.partial_hits
        if copies:
            num_new_blocks = max(num_new_blocks, 0) + 1
        checkpoint = self._checkpoint_position(
            request_id, total_computed_tokens, num_tokens, num_hash_lookahead_tokens, prefill_end
        )
        if not apply_admission_cap:
            # The allocation that follows (and the caching after it) writes this checkpoint.
            if checkpoint:
                self.checkpoints[request_id] = (checkpoint, ceil_div(num_tokens, self.block_size) - 2)
            else:
                self.checkpoints.pop(request_id, None)
        if num_new_blocks > 0:
            num_new_blocks = min(num_new_blocks, self._most_new_blocks(request_id) + copies + (checkpoint > 0))
        num_evictable_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0 and not block.is_null)
        return num_new_blocks + num_evictable_hits

    def _num_required_blocks(self, num_tokens: int) -> int:
        """The table length for ``num_tokens`` main-model slots: a state per block, then the speculative
        blocks."""
        return ceil_div(num_tokens, self.block_size) + self.spec.num_speculative_blocks

    def _checkpoint_position(
        self, request_id: str, query_start: int, query_end: int, lookahead: int, prefill_end: int = 0
    ) -> int:
        """The tokens the state a chunk from ``query_start`` to ``query_end`` keeps as its prefill checkpoint
        is after, or 0 for none (vLLM 0.33.0's ``get_mamba_prefill_checkpoint_position`` and
        ``is_mamba_prefill_checkpoint_valid``): the last hit boundary short of the chunk's last token (of
        the hash lookahead), when the chunk reaches ``prefill_end`` (the coordinator passes 0 unless the
        retention interval is 0, where only the chunk ending the prefill keeps a state worth a block) and
        starts on a hash boundary a hash block or more below it, a
        multiple of the backend's alignment below it, and in an earlier block than the checkpoint's
        table position (the one before the last state's); and that position is past the table, or holds
        the null block or (after a first allocation) a speculative block."""
        spec = self.spec
        alignment = spec.prefill_checkpoint_alignment
        if not spec.has_prefill_checkpoints or alignment is None or query_end < prefill_end:
            return 0
        block_size = self.block_size
        hash_block_size = self.pool.hash_block_size or block_size
        position = self.reusable_boundary(query_end, self.hit_alignment, lookahead)
        index = ceil_div(query_end, block_size) - 2
        valid = (
            query_start % hash_block_size == 0
            and index > (query_start - 1) // block_size
            and query_start + hash_block_size <= position
            and query_start < position < query_end
            and (position - query_start) % alignment == 0
        )
        if not valid:
            return 0
        table = self.req_to_blocks.get(request_id, [])
        writable = (
            index >= len(table)
            or table[index].is_null
            or (request_id in self.allocated_requests and index >= len(table) - spec.num_speculative_blocks)
        )
        return position if writable else 0

    def reusable_boundary(self, num_tokens: int, step: int, lookahead: int) -> int:
        """The last multiple of ``step`` tokens whose state a later request can reuse, of a prefix of
        ``num_tokens`` tokens (vLLM 0.33.0's ``get_mamba_prefill_checkpoint_position``): short of the
        last token and of the ``lookahead`` tokens the hashes look ahead; with an EAGLE drafter
        (:attr:`drops_checkpoint_block`), one ``step`` below the last multiple instead, where the
        attention groups' hits land after their drop."""
        if self.drops_checkpoint_block:
            return max(0, num_tokens // step * step - step)
        return max(0, (num_tokens - max(1, lookahead)) // step * step)

    def _most_new_blocks(self, request_id: str) -> int:
        """The new blocks one allocation takes at most: one state, and on a request's first allocation
        its speculative blocks."""
        return 1 if request_id in self.allocated_requests else 1 + self.spec.num_speculative_blocks

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVBlock]:
        """Pad the table with null blocks up to the position of the last slot, move the speculative blocks
        that now fall at or before it to the table's end, and take new blocks up to the table length;
        returns the padding, the moved blocks and the new ones.

        A partially hit state (:attr:`partial_hits`) takes a new block first:
        a new request's table holds that block in place of the shared one (and
        it comes first in the returned list); the request that cached the
        state there keeps its block, whose cache entry moves to the new one."""
        table = self.req_to_blocks.setdefault(request_id, [])
        num_speculative = self.spec.num_speculative_blocks
        num_required = self._num_required_blocks(num_tokens)
        partial_hit = self.partial_hits.pop(request_id, None)
        checkpoint = int(request_id in self.checkpoints)
        if num_required <= len(table) and partial_hit is None and not checkpoint:
            self.allocated_requests.add(request_id)
            return []
        num_before = len(table)
        allocated = request_id in self.allocated_requests
        if allocated:
            self.last_state_block[request_id] = num_before - 1 - num_speculative
        elif num_before > 0:
            self.last_state_block[request_id] = num_before - 1
        num_skipped = num_required - num_speculative - 1
        # A checkpoint's position (the one before the last state's) gets a block, not the null one.
        if num_before < num_skipped:
            table.extend([self.null_block] * (num_skipped - checkpoint - num_before))
        if allocated:
            # Speculative blocks the new state positions pass over move to the table's end, whole; one at
            # a checkpoint's position stays, the checkpoint's block.
            for position in range(num_before - num_speculative, num_before):
                if position >= num_skipped - checkpoint:
                    break
                table.append(table[position])
                table[position] = self.null_block
        new_blocks = self.pool.get_new_blocks(max(num_required - len(table), 0) + (partial_hit is not None))
        added = table[num_before:]
        if partial_hit is not None:
            position, source = partial_hit
            copy, new_blocks = new_blocks[0], new_blocks[1:]
            if allocated:
                # The request goes on writing its block: the cache keeps the copy instead.
                assert table[position] is source
                self.pool.move_block_hashes(source, copy)
                self.pending_copies.append((source, copy))
                source.ref_cnt += 1
                tail = self.producer_tails.pop(request_id, None)
                if tail is not None:
                    # The copy keeps the state once this step's copies have run: that block is offered.
                    self.state_offloads.append((request_id, copy, tail[1]))
                if copy.block_hash is not None:
                    self.cached_this_step.add(copy.block_hash)
            else:
                self._copy_on_write(request_id, position, source, copy)
                added.insert(0, copy)
        added += new_blocks
        table.extend(new_blocks)
        self.allocated_requests.add(request_id)
        return added

    def cache_blocks(self, request: Request, num_tokens: int, replay_boundaries: Sequence[int] = ()) -> None:
        """Cache the full blocks' states, and remember their keys for this scheduler step.

        A prefill checkpoint recorded for the request's latest allocation is
        entered under its boundary's key in place of its block's full key,
        or loses every key if transient (:meth:`_cache_checkpoint`).  With
        none recorded, the state at the prompt's last hash boundary a later
        request can hit up to is entered whenever ``num_tokens`` is that
        boundary and its block is not cached there yet: again after its key
        was evicted while held, or first, inside a block, with hashes finer
        than the blocks.  Inside a block the request then goes on writing
        that block: its next allocation moves the entry to a copy
        (:meth:`allocate_new_blocks`)."""
        request_id = request.request_id
        num_cached = self.num_cached_blocks.get(request_id, 0)
        super().cache_blocks(request, num_tokens, replay_boundaries)
        table = self.req_to_blocks.get(request_id, [])
        if request_id in self.checkpoints:
            key = self._cache_checkpoint(request, table)
        else:
            key = self._cache_prompt_state(request, num_tokens, table)
        if key is not None:
            self.cached_this_step.add(key)
        for position in range(num_cached, self.num_cached_blocks.get(request_id, 0)):
            block = table[position]
            if not block.is_null and block.block_hash is not None:
                self.cached_this_step.add(block.block_hash)
                # Offered under the tokens its key covers now (a checkpoint's, once re-keyed).
                tokens = self.pool.hash_tokens(block, (position + 1) * self.block_size)
                assert tokens is not None
                self.state_offloads.append((request_id, block, tokens))

    def _cache_checkpoint(self, request: Request, table: list[KVBlock]) -> BlockHashWithGroup | None:
        """Enter the request's prefill checkpoint block under the key of the tokens its state is after, in
        place of every key it has (the full key the block's position was just cached under speaks of
        another state), when the checkpoint is on a block boundary, is the prompt's own or ends a prefix
        shared with an earlier request; otherwise drop every key it has.  The key entered, if new."""
        position, index = self.checkpoints[request.request_id]
        block = table[index]
        if block.is_null:
            return None
        hash_block_size = self.pool.hash_block_size or self.block_size
        num_hashes = position // hash_block_size
        # A step reaching a token still being sampled (async scheduling) may place its checkpoint past the
        # request's hashes: no key says what it holds, so it is kept as a transient one (vLLM 0.33.0 asserts).
        if not self.checkpoint_is_kept(request, position) or num_hashes > len(request.block_hashes):
            if block.block_hash is not None:
                self.pool.evict_blocks([block.block_id])
            return None
        if self.pool.hash_tokens(block, (index + 1) * self.block_size) == position:
            return None
        key = (request.block_hashes[num_hashes - 1], self.group_id)
        self.pool.cache_partial_block(block, key, position, replace=True)
        if self.pool.enable_kv_cache_events:
            self.pool.record_event(hash_boundary_event(request, num_hashes, hash_block_size, self.group_id))
        return key

    def checkpoint_is_kept(self, request: Request, position: int) -> bool:
        """Whether the request's prefill checkpoint after ``position`` tokens stays hittable: on a block
        boundary whose state the retention interval keeps (:meth:`state_is_retained`), the prompt's own
        checkpoint (the last hit boundary short of its last token) or the end of a prefix a lookup found
        shared with an earlier request; any other is transient."""
        prompt_checkpoint = self.reusable_boundary(
            request.num_prompt_tokens, self.hit_alignment, request.num_hash_lookahead_tokens
        )
        return (
            position == prompt_checkpoint
            or (position % self.block_size == 0 and self.state_is_retained(position // self.block_size - 1))
            or position == request.shared_prefix_boundary
        )

    def _states_per_segment(self) -> int | None:
        """Under the retention interval, the table positions between two states kept for it: ``None`` for
        every state (no interval, or one of a block or less), 0 for none (an interval of 0)."""
        interval = self.retention_interval
        if interval is None:
            return None
        per_segment = interval // self.block_size
        if interval and per_segment <= 1:
            return None
        return per_segment

    def state_is_retained(self, position: int) -> bool:
        """Whether the retention interval keeps the state at table ``position`` for its own sake: every
        state without an interval (or with one of a block or less), the one ending each interval's last
        block otherwise, none with an interval of 0."""
        per_segment = self._states_per_segment()
        return per_segment is None or (per_segment > 0 and (position + 1) % per_segment == 0)

    def cached_positions(self, request: Request, start: int, end: int, replay_boundaries: Sequence[int]) -> list[int]:
        """The states a later hit can resume from (vLLM 0.33.0's sparse state retention): every one without
        a retention interval; with one, those :meth:`state_is_retained` keeps, and the states at the
        request's replay boundaries and at the end of a prefix it shares with an earlier request, each
        rounded down to a hit boundary."""
        if self._states_per_segment() is None:
            return list(range(start, end))
        kept = {position for position in range(start, end) if self.state_is_retained(position)}
        alignment = self.hit_alignment
        for boundary in self.reachable_boundaries(request, replay_boundaries):
            position = boundary // alignment * alignment // self.block_size - 1
            if start <= position < end:
                kept.add(position)
        return sorted(kept)

    def _cache_prompt_state(self, request: Request, num_tokens: int, table: list[KVBlock]) -> BlockHashWithGroup | None:
        """Enter the state at the prompt's last hash boundary, when ``num_tokens`` is that boundary and its
        block is not cached there yet (see :meth:`cache_blocks`); with :attr:`shared_prefix_checkpoint`,
        likewise the state at the end of a prefix a lookup found shared (``shared_prefix_boundary``) when
        the step's chunk ends there inside the prompt.  The key, if entered now."""
        hash_block_size = self.pool.hash_block_size or self.block_size
        boundary = self.reusable_boundary(request.num_prompt_tokens, hash_block_size, request.num_hash_lookahead_tokens)
        junction = (
            self.shared_prefix_checkpoint
            and num_tokens == request.shared_prefix_boundary
            and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens
            and num_tokens % hash_block_size == 0
        )
        if junction:
            boundary = num_tokens
        position = ceil_div(num_tokens, self.block_size) - 1
        if num_tokens != boundary or boundary == 0 or position >= len(table):
            return None
        block = table[position]
        if block.is_null or self.pool.hash_tokens(block, (position + 1) * self.block_size) == boundary:
            return None
        num_hashes = boundary // hash_block_size
        key = (request.block_hashes[num_hashes - 1], self.group_id)
        if self.pool.cache_partial_block(block, key, boundary) and self.pool.enable_kv_cache_events:
            self.pool.record_event(hash_boundary_event(request, num_hashes, hash_block_size, self.group_id))
        if boundary % self.block_size:
            self.partial_hits[request.request_id] = (position, block)
            self.producer_tails[request.request_id] = (block, boundary)
            self.num_cached_blocks[request.request_id] = position
        return key

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int) -> None:
        """Free every live block before the one holding token ``num_computed_tokens - 1``'s state, null
        gaps skipped over (last first), then the last state block once the computed tokens are past it."""
        table = self.req_to_blocks.get(request_id)
        if not table:
            return
        end = min(self.num_skipped_tokens(num_computed_tokens) // self.block_size, len(table))
        first = self.num_retired_blocks.get(request_id, 0)
        if first < end:
            released = [table[p] for p in range(end - 1, first - 1, -1) if not table[p].is_null]
            for position in range(first, end):
                table[position] = self.null_block
            self.pool.free_blocks(released)
            self.num_retired_blocks[request_id] = end
        last_state = self.last_state_block.get(request_id)
        if last_state is not None and last_state < ceil_div(num_computed_tokens, self.block_size) - 1:
            block = table[last_state]
            if not block.is_null:
                table[last_state] = self.null_block
                self.pool.free_blocks([block])

    def pop_blocks_for_free(self, request_id: str) -> list[KVBlock]:
        self.allocated_requests.discard(request_id)
        self.checkpoints.pop(request_id, None)
        self.last_state_block.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        self.producer_tails.pop(request_id, None)
        # Its blocks go back to the pool: offers not taken yet would name blocks others may get.
        self.state_offloads = [offload for offload in self.state_offloads if offload[0] != request_id]
        return super().pop_blocks_for_free(request_id)

    def take_state_offloads(self) -> list[tuple[str, KVBlock, int]]:
        """The boundary states offered since the last call (see :attr:`state_offloads`), oldest first."""
        offloads, self.state_offloads = self.state_offloads, []
        return offloads

    def finalize_tail_offload(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> tuple[KVBlock, int] | None:
        """A finishing request's state cached inside the block it was writing, as (that block, the tokens
        it is after), when no later token reached the block: its computed tokens end at the state and
        none is in flight.  The record is dropped either way."""
        tail = self.producer_tails.pop(request_id, None)
        if tail is None or num_in_flight_tokens or num_computed_tokens != tail[1]:
            return None
        return tail

    def new_step_starts(self) -> None:
        """A scheduler step begins: states cached before it may be hit."""
        self.cached_this_step.clear()
