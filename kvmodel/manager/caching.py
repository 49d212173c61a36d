"""The prefix cache's side of a step: which of a request's full blocks each group caches, under which key,
and the events that tell of it."""

from __future__ import annotations

from kvmodel.manager.aligned_states import AlignedStates
from kvmodel.observation import StoredEvent
from kvmodel.pool_model import NULL


class PrefixCaching(AlignedStates):
    """Entering a request's computed blocks in the prefix cache."""

    def _cacheable_tokens(self, group_id: int, num_tokens: int) -> int:
        """The tokens group ``group_id`` may cache once ``num_tokens`` are computed.

        Never (with one group, or in a group that drops) the last tokens a
        multi-module drafter may prefill again; a hybrid cache caches up to a
        hit boundary (a multiple of the scheduler block size), and a group that
        drops one of its blocks more than the finalized ones (its lookups peek
        past the hit)."""
        reprefillable = self.config.num_reprefillable_tokens
        if len(self.groups) == 1:
            return max(0, num_tokens - reprefillable)
        # With sub-block hits every token: a copy's block would otherwise be cached again at a boundary
        # inside it.
        align = 1 if self.partial_hits else self.alignment
        if group_id in self.dropping_group_ids and num_tokens >= align:
            finalized = max(0, num_tokens - reprefillable)
            return min(finalized, finalized // align * align + self.block_sizes[group_id])
        return num_tokens // align * align

    def _cache_full_blocks(self, rid: str, num_tokens: int) -> None:
        for group_id, group in enumerate(self.groups):
            if not group.rules.in_prefix_cache:
                continue
            cacheable = self._cacheable_tokens(group_id, num_tokens)
            # Never a block without a hash.
            num_full = min(cacheable // self.block_sizes[group_id], self.num_hashed_blocks(rid, group_id))
            table = self.table(rid, group_id)
            start = self.num_cached.get((rid, group_id), 0)
            positions = self._cached_positions(rid, group_id, start, num_full)
            for position in positions:
                self.pool.cache_block(table[position], (group_id, self.prefix(rid, position, group_id)))
            self.num_cached[(rid, group_id)] = max(start, num_full)
            if self.events is not None and start < num_full:
                self.events.append(self._stored_event(rid, group_id, start, num_full, positions))
            if group.rules.full_hit and len(self.groups) > 1 and self.block_sizes[group_id] != self.hash_size:
                self._cache_partial_tail(rid, group_id, cacheable)
            if group.rules.aligned_states and (rid, group_id) in self.checkpoints:
                self._cache_checkpoint(rid, group_id)
            elif group.rules.aligned_states:
                self._recache_prompt_state(rid, group_id, cacheable)
            if group.rules.aligned_states:
                # The states cached now, under the keys they hold after the checkpoint's re-keying, each
                # offered a connector under the tokens its key covers.
                lookahead = self.config.num_hash_lookahead_tokens
                for block in table[start:num_full]:
                    key = self.pool.cache.get(block)
                    if block != NULL and key is not None:
                        self.cached_this_step.add(key)
                        self.state_offloads.append((group_id, rid, block, len(key[1]) - lookahead))

    def _cached_positions(self, rid: str, group_id: int, start: int, end: int) -> list[int]:
        """The positions in ``[start, end)`` where group ``group_id`` caches the request's full blocks (see
        :attr:`sparse_windows`): those ``needed`` blocks up to ``shift`` past a boundary a hit can end on.
        An align-mode Mamba group's are its states a hit can resume from (:meth:`_cached_states`)."""
        if self.groups[group_id].rules.aligned_states:
            return self._cached_states(rid, group_id, start, end)
        sparse = self.sparse_windows.get(group_id)
        if sparse is None:
            return list(range(start, end))
        periodic, needed, shift = sparse
        block_size = self.block_sizes[group_id]
        ends: set[int] = set()  # the block positions the kept runs end before
        if periodic is not None:
            per = periodic // block_size
            # The boundaries k * periodic (k >= 1) whose runs can reach into [start, end).
            first = max(1, (start - shift) // per)
            ends.update(k * per + shift for k in range(first, (end - shift + needed) // per + 2))
        if self.retention is not None:
            request = self.requests[rid]
            boundaries = self._reachable_boundaries(request, group_id)
            ends.update(b // self.alignment * self.alignment // block_size + shift for b in boundaries)
        return [p for p in range(start, end) if any(stop - needed <= p < stop for stop in ends)]

    def _cache_partial_tail(self, rid: str, group_id: int, num_tokens: int) -> None:
        """A full-attention group with blocks larger than the hashes also caches the prompt's last hash
        boundary a later request can hit up to (its last token's, in a group that drops; the one before
        it otherwise) when it falls inside a block and its tokens are cacheable: that block gets the
        boundary's key beside any it has."""
        request = self.requests[rid]
        hash_size, block_size = self.hash_size, self.block_sizes[group_id]
        limit = request.num_prompt_tokens if group_id in self.dropping_group_ids else request.num_prompt_tokens - 1
        boundary = min(limit // hash_size * hash_size, self.num_hashed_tokens(rid))
        table = self.table(rid, group_id)
        if not 0 < boundary <= num_tokens or boundary % block_size == 0 or boundary // block_size >= len(table):
            return
        key = (group_id, self.prefix_to(rid, boundary))
        if self.pool.add_key(table[boundary // block_size], key) and self.events is not None:
            self.events.append(self._boundary_event(rid, group_id, boundary))

    def _stored_event(self, rid: str, group_id: int, start: int, end: int, positions: list[int]) -> StoredEvent:
        """The event of caching positions ``start`` to ``end`` of a table: every entry but the null
        blocks', after the prefix before ``start``, with the tokens of every position."""
        tokens = self.requests[rid].tokens
        table = self.table(rid, group_id)
        entered = [p for p in positions if table[p] != NULL]
        lookahead = self.config.num_hash_lookahead_tokens
        block_size = self.block_sizes[group_id]
        return StoredEvent(
            group=group_id,
            prefixes=tuple(self.prefix(rid, p, group_id) for p in entered),
            parent=self.prefix(rid, start - 1, group_id) if start else None,
            token_ids=tuple(tokens[start * block_size : end * block_size]),
            block_size=block_size,
            lookahead_token_ids=(
                tuple(tuple(tokens[(p + 1) * block_size : (p + 1) * block_size + lookahead]) for p in entered)
                if lookahead
                else None
            ),
        )
