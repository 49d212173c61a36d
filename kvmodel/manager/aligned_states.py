"""The rules of align-mode Mamba groups (``mamba_align``): which states are cached, prefill checkpoints,
how a table of states grows, and the states offered a connector."""

from __future__ import annotations

from kvmodel.kinds.base import ceil_div
from kvmodel.manager.state import ManagerState
from kvmodel.observation import StoredEvent
from kvmodel.ops import GroupIds, StateOffload, flat_state_offloads
from kvmodel.pool_model import NULL
from kvmodel.step_plans import prefill_checkpoint_fits


class AlignedStates(ManagerState):
    """An align-mode Mamba group's states: position ``p`` holds the state after ``(p + 1) * block_size``
    tokens, with null blocks between them."""

    def _checkpoint_tokens(self, rid: str, group_id: int, start: int, end: int) -> int:
        """The tokens the prefill checkpoint of an align-mode Mamba group's chunk from ``start`` to ``end``
        is after, or 0 for none: the last hit boundary short of the chunk's last token (of the hash
        lookahead), when the backend exports it inside the chunk and its table position (the one before
        the last state's) is past the table, null, or one of the speculative blocks already taken."""
        group = self.groups[group_id]
        if group.prefill_checkpoint_alignment is None:
            return 0
        block_size = self.block_sizes[group_id]
        tokens = self._reusable_boundary(end, self.alignment)
        fits = prefill_checkpoint_fits(
            group.prefill_checkpoint_alignment, block_size, self.hash_size, start, end, tokens
        )
        position = ceil_div(end, block_size) - 2
        if not fits:
            return 0
        table = self.pool.holders.get((rid, group_id), [])
        taken = (rid, group_id) in self.mamba_allocated and position >= len(table) - group.speculative_blocks
        return tokens if position >= len(table) or table[position] == NULL or taken else 0

    def _checkpoint_held_back(self, rid: str, end: int) -> bool:
        """Whether a retention interval of 0 holds back the prefill checkpoint of a chunk ending at ``end``:
        only the chunk ending the prefill keeps one."""
        request = self.requests[rid]
        return self.retention == 0 and end < max(request.num_prompt_tokens, len(request.tokens) - 1)

    def _planned_checkpoint(self, rid: str, group_id: int, start: int, end: int) -> int:
        """The tokens of the prefill checkpoint an allocation for the chunk from ``start`` to ``end`` keeps
        (:meth:`_checkpoint_tokens`, unless held back), or 0 for none."""
        checkpoint = self._checkpoint_tokens(rid, group_id, start, end)
        return 0 if checkpoint and self._checkpoint_held_back(rid, end) else checkpoint

    def holds_back_checkpoint(self, rid: str, group_id: int, start: int, end: int) -> bool:
        """Whether an allocation for the chunk from ``start`` to ``end`` keeps no prefill checkpoint in
        align-mode Mamba group ``group_id`` only because the chunk does not end the prefill (a retention
        interval of 0)."""
        return bool(self._checkpoint_tokens(rid, group_id, start, end)) and self._checkpoint_held_back(rid, end)

    def _state_cached_this_step(self, hit: tuple[int, ...]) -> bool:
        """Whether a hit of an align-mode Mamba group ends on a state entered in the current scheduler step
        (not computed yet: the request waits for the next step)."""
        return bool(hit) and self.pool.cache.get(hit[-1]) in self.cached_this_step

    def defers_hit(self, hit_ids: GroupIds) -> bool:
        """Whether a waiting request's hit ``hit_ids`` ends, in some align-mode Mamba group, on a state
        entered in the current scheduler step, so that its allocation is refused and the request waits
        for the next step."""
        return any(
            self._state_cached_this_step(hit_ids[group_id])
            for group_id, group in enumerate(self.groups)
            if group.rules.aligned_states
        )

    def _plan_checkpoints(self, rid: str, waiting: bool, hit_ids: GroupIds, start: int, end: int) -> None:
        """Record in each align-mode Mamba group the prefill checkpoint the allocation for the chunk from
        ``start`` to ``end`` writes (and the caching after it), or none; a group whose hit is a state
        entered in this step keeps what it had (the step is refused)."""
        for group_id, group in enumerate(self.groups):
            if not group.rules.aligned_states:
                continue
            if self._state_cached_this_step(hit_ids[group_id] if waiting else ()):
                continue
            checkpoint = self._planned_checkpoint(rid, group_id, start, end)
            if checkpoint:
                self.checkpoints[(rid, group_id)] = (checkpoint, ceil_div(end, self.block_sizes[group_id]) - 2)
            else:
                self.checkpoints.pop((rid, group_id), None)

    def _interval_keeps_state(self, group_id: int, position: int) -> bool:
        """Whether the retention interval keeps an align-mode Mamba group's state at table ``position``
        (after ``position + 1`` blocks) for its own sake: every state with no interval or one spanning
        at most a block, none with 0, else the states after a whole number of ``interval // block``
        blocks."""
        blocks_per_interval = (self.retention or 0) // self.block_sizes[group_id]
        if self.retention is None or (self.retention and blocks_per_interval <= 1):
            return True
        return bool(self.retention) and (position + 1) % blocks_per_interval == 0

    def caches_state(self, rid: str, group_id: int, position: int) -> bool:
        """Whether an align-mode Mamba group caches the request's state at table ``position`` once it is
        computed: every state with no retention interval; under one, a state the interval keeps
        (:meth:`_interval_keeps_state`) or one ending where a later request can resume
        (:meth:`_reachable_boundaries`), rounded down to a hit boundary."""
        if self.retention is None:
            return True
        if self._interval_keeps_state(group_id, position):
            return True
        block_size = self.block_sizes[group_id]
        boundaries = self._reachable_boundaries(self.requests[rid], group_id)
        return any(b // self.alignment * self.alignment // block_size == position + 1 for b in boundaries)

    def _cached_states(self, rid: str, group_id: int, start: int, end: int) -> list[int]:
        """The positions in ``[start, end)`` of an align-mode Mamba group's states that are cached
        (:meth:`caches_state`)."""
        return [p for p in range(start, end) if self.caches_state(rid, group_id, p)]

    def _cache_checkpoint(self, rid: str, group_id: int) -> None:
        """The block of the request's prefill checkpoint is entered under the key of the tokens its state is
        after, in place of every key it has, when those tokens end a block, are the prompt's checkpoint or
        end a prefix shared with an earlier request; otherwise it loses every key (a transient state)."""
        tokens, position = self.checkpoints[(rid, group_id)]
        request = self.requests[rid]
        table = self.table(rid, group_id)
        if position >= len(table) or table[position] == NULL:
            return
        block = table[position]
        prompt_checkpoint = self._reusable_boundary(request.num_prompt_tokens, self.alignment)
        block_size = self.block_sizes[group_id]
        kept_for_its_block = tokens % block_size == 0 and self._interval_keeps_state(group_id, tokens // block_size - 1)
        if tokens != prompt_checkpoint and not kept_for_its_block and tokens != request.shared_prefix_boundary:
            self.pool.evict([block])
            return
        key = (group_id, self.prefix_to(rid, tokens))
        if self.pool.cache.get(block) == key:
            return
        self.pool.evict([block])
        self.pool.add_key(block, key)
        self.cached_this_step.add(key)
        if self.events is not None:
            self.events.append(self._boundary_event(rid, group_id, tokens))

    def _recache_prompt_state(self, rid: str, group_id: int, num_tokens: int) -> None:
        """An align-mode Mamba group enters the state at the prompt's last hash boundary short of its
        last token (of the hash lookahead) when ``num_tokens`` is that boundary and the state's block is
        not cached there: again after it lost its key (evicted while held), or, with sub-block hits,
        inside the block.  With shared-prefix checkpoints in force, likewise the state at the end of a
        prefix a lookup found shared, when ``num_tokens`` ends there inside the prompt and past the tokens
        computed before the step.  The request goes on writing that block: its next allocation copies it
        to a block that takes its cache entry."""
        request = self.requests[rid]
        hash_size = self.hash_size
        boundary = self._reusable_boundary(request.num_prompt_tokens, hash_size)
        if (
            self.config.shared_prefix_checkpoint
            and num_tokens == request.shared_prefix_boundary
            and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens
            and num_tokens % hash_size == 0
        ):
            # The end of a prefix a lookup found shared, where the step's chunk ends: cached the same way.
            boundary = num_tokens
        table = self.table(rid, group_id)
        position = ceil_div(num_tokens, self.block_sizes[group_id]) - 1
        if num_tokens != boundary or boundary == 0 or position >= len(table) or table[position] == NULL:
            return
        key = (group_id, self.prefix_to(rid, boundary))
        block = table[position]
        if self.pool.cache.get(block) == key:
            return
        if self.pool.add_key(block, key) and self.events is not None:
            self.events.append(self._boundary_event(rid, group_id, boundary))
        self.cached_this_step.add(key)
        if boundary % self.block_sizes[group_id]:
            self.copy_pending[(rid, group_id)] = (position, block)
            self.producer_tails[(rid, group_id)] = boundary
            self.num_cached[(rid, group_id)] = position

    def _grow_states(self, rid: str, group_id: int, wanted: int) -> list[int]:
        """An align-mode Mamba table grown to ``wanted`` blocks: null blocks up to the last slot's position,
        where the new state goes; the speculative blocks after the last state that those positions pass
        over (once the request has had an allocation) moved, whole, to the table's end; new blocks up to
        ``wanted``.  The padding, the moved blocks and the new ones."""
        table = self.table(rid, group_id)
        key = (rid, group_id)
        pending = self.copy_pending.pop(key, None)
        checkpoint = int(key in self.checkpoints)
        if wanted <= len(table) and pending is None and not checkpoint:
            self.mamba_allocated.add(key)
            return []
        before = len(table)
        speculative = self.groups[group_id].speculative_blocks
        last_state = wanted - speculative - 1
        # A checkpoint's position (the one before the last state's) gets a block, or keeps its speculative one.
        table.extend([NULL] * max(0, last_state - checkpoint - before))
        if key in self.mamba_allocated:
            for position in range(before - speculative, min(before, last_state - checkpoint)):
                table.append(table[position])
                table[position] = NULL
        new = self.pool.take_free(max(0, wanted - len(table)) + (pending is not None))
        added = table[before:]
        if pending is not None:
            position, source = pending
            copy, new = new[0], new[1:]
            self.step_copies.append((source, copy))
            if key in self.mamba_allocated:
                # The request goes on writing its block: the cache keeps the copy instead, filled by this step.
                self.pool.move_keys(source, copy)
                moved = self.pool.cache.get(copy)
                if moved is not None:
                    self.cached_this_step.add(moved)
                tokens = self.producer_tails.pop(key, None)
                if tokens is not None:
                    self.state_offloads.append((group_id, rid, copy, tokens))
            else:
                table[position] = copy
                added.insert(0, copy)
        table.extend(new)
        self.mamba_allocated.add(key)
        return added + new

    def _take_state_offloads(self) -> tuple[StateOffload, ...]:
        """The operation's offered boundary states as the allocator hands them over: request by request in
        the order they first appear, taken group by group, each group's in the order offered."""
        if not self.state_offloads:
            return ()
        by_request: dict[str, list[tuple[int, int, int]]] = {}
        for group_id, rid, block, tokens in sorted(self.state_offloads, key=lambda offload: offload[0]):
            by_request.setdefault(rid, []).append((group_id, block, tokens))
        self.state_offloads = []
        return flat_state_offloads(by_request)

    def _finalize_tail_offloads(self, rid: str) -> tuple[StateOffload, ...]:
        """A finishing request's states cached inside the blocks it was writing and never copied, offered
        when no later token reached them: its computed tokens end at the state and none is in flight."""
        request = self.requests[rid]
        offloads = []
        for group_id in range(len(self.groups)):
            tokens = self.producer_tails.pop((rid, group_id), None)
            if tokens is not None and not request.num_in_flight_tokens and request.num_computed_tokens == tokens:
                offloads.append((rid, group_id, self.copy_pending[(rid, group_id)][1], tokens))
        return tuple(offloads)

    def _boundary_event(self, rid: str, group_id: int, boundary: int) -> StoredEvent:
        """The event of entering a block under the key of the hash boundary after ``boundary`` tokens."""
        tokens = self.requests[rid].tokens
        hash_size = self.hash_size
        lookahead = self.config.num_hash_lookahead_tokens
        return StoredEvent(
            group=group_id,
            prefixes=(self.prefix_to(rid, boundary),),
            parent=self.prefix_to(rid, boundary - hash_size) if boundary > hash_size else None,
            token_ids=tuple(tokens[boundary - hash_size : boundary]),
            block_size=hash_size,
            lookahead_token_ids=(tuple(tokens[boundary : boundary + lookahead]),) if lookahead else None,
        )
