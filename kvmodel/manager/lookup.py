"""The prefix lookup: the longest hit every group finds cached, as vLLM's hybrid lookup finds it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvmodel.group_spec import GroupSpec
from kvmodel.kinds.base import ceil_div
from kvmodel.manager.state import ManagerState, needed_positions
from kvmodel.ops import GroupIds
from kvmodel.pool_model import NULL


class PrefixLookup(ManagerState):
    """Finding a waiting request's prefix hit; nothing here changes the cache."""

    def truncate_hit(self, hit_ids: GroupIds, num_tokens: int) -> GroupIds:
        """A hit's blocks cut back to its first ``num_tokens`` tokens, a boundary of every group's blocks
        (``truncate_computed_blocks``): a Mamba group keeps what it has up to there."""
        return tuple(
            () if not group.rules.in_prefix_cache else hit[: num_tokens // self.block_sizes[group_id]]
            for group_id, (group, hit) in enumerate(zip(self.groups, hit_ids, strict=True))
        )

    def find_hit(self, request_id: str) -> tuple[int, GroupIds]:
        """The hit :meth:`lookup_prefix` finds: its tokens and its blocks in each group."""
        hit_tokens, hit_ids, _ = self.lookup_prefix(request_id)
        return hit_tokens, hit_ids

    def lookup_prefix(self, request_id: str) -> tuple[int, GroupIds, int]:
        """The longest block-aligned prefix, below the last token, that every group finds cached, and the
        end of the longest hit a single lookup found where it exceeds the hit (0 otherwise: the request's
        ``shared_prefix_boundary`` once it is looked up).

        With an EAGLE drafter the hit is :meth:`eagle_hit_tokens` instead.
        The hit's blocks in each group are those its attention type needs
        before the boundary (null blocks elsewhere)."""
        if all(not group.rules.in_prefix_cache for group in self.groups):
            return 0, tuple(() for _ in self.groups), 0  # no group takes part in the prefix cache
        if self.partial_hits:
            return self._sub_block_hit(request_id)
        if self.config.drop_group_ids:
            hit_tokens, longest = self.eagle_hit_tokens(request_id)
        else:
            hit_tokens = self.plain_hit_tokens(request_id)
            # Only a sparse window under a retention interval caches by it: look it up only there.
            longest = self.first_lookup_tokens(request_id) if self.records_shared_prefix else 0
        found = []
        for group_id, group in enumerate(self.groups):
            block_size = self.block_sizes[group_id]
            needed = needed_positions(group, hit_tokens // block_size, block_size)
            blocks = [self.pool.lookup((group_id, self.prefix(request_id, p, group_id))) for p in needed]
            assert None not in blocks
            found.append((NULL,) * needed.start + tuple(b for b in blocks if b is not None))
        return hit_tokens, tuple(found), longest if longest > hit_tokens else 0

    def _sub_block_hit(self, request_id: str) -> tuple[int, GroupIds, int]:
        """The hit with sub-block hits on, as vLLM 0.33.0's hybrid lookup finds it.

        The spec groups' fixed point (:meth:`_fixed_point`) from the
        ``num_tokens - 1`` cap.  Full attention takes its run of whole cached
        blocks, then the last hash boundary cached inside the next block
        (within the cap), and accepts any candidate below that.  An align-mode Mamba group accepts a hash
        boundary whose state is cached; a group hashed at its block size
        accepts a block boundary whose blocks it has.  A full-attention hit
        ending inside a block takes the block cached at the boundary found
        inside it, even when the hit ends below that boundary.

        With an EAGLE drafter a dropping group's lookup (as in
        :meth:`eagle_hit_tokens`: on its first lookup, and again only after a
        lookup without a drop lowered the candidate) looks one hash block past
        the candidate and drops the last one: full attention a hash block
        off its hit (which may now end inside a block it found whole), a
        group hashed at its block size a block whose successor it also has.
        A Mamba lookup neither looks further nor drops."""
        request = self.requests[request_id]
        hashed = self.num_hashed_tokens(request_id)
        hash_size = self.hash_size
        inner: dict[int, tuple[int, int]] = {}  # full-attention group -> (position, block) found inside a block
        verified: set[GroupSpec] = set()

        def lookup(spec: GroupSpec, group_ids: list[int], current: int) -> int:
            dropping = spec in self.dropping_specs and spec not in verified
            drop = dropping and not spec.rules.aligned_states
            limit = min(current + hash_size, hashed) if drop else current
            if spec.rules.full_hit:
                found = self._full_sub_block_hit(request_id, group_ids, limit, inner)
                found = max(0, found - hash_size) if drop else found
            elif drop:
                found = self._longest_accepted(request_id, group_ids, limit, peek=True)
            else:
                step = hash_size if spec.rules.aligned_states else self.block_sizes[group_ids[0]]
                found = next(
                    (
                        t
                        for t in range(min(current, hashed) // step * step, 0, -step)
                        if all(self._accepts_tokens(request_id, g, t) for g in group_ids)
                    ),
                    0,
                )
            if dropping:
                verified.add(spec)
            elif found < current:
                verified.clear()
            return found

        hit_tokens, longest = self._fixed_point(len(request.tokens) - 1, lookup)
        found_ids: list[tuple[int, ...]] = []
        for group_id, group in enumerate(self.groups):
            block_size = self.block_sizes[group_id]
            if not group.rules.in_prefix_cache or hit_tokens == 0:
                found_ids.append(())
            elif group.rules.aligned_states:
                state = self.pool.lookup((group_id, self.prefix_to(request_id, hit_tokens)))
                assert state is not None
                found_ids.append((NULL,) * (ceil_div(hit_tokens, block_size) - 1) + (state,))
            elif group.rules.full_hit:
                blocks = [
                    inner[group_id][1]
                    if inner.get(group_id, (-1,))[0] == p
                    else self.pool.lookup((group_id, self.prefix(request_id, p, group_id)))
                    for p in range(ceil_div(hit_tokens, block_size))
                ]
                assert None not in blocks
                found_ids.append(tuple(b for b in blocks if b is not None))
            else:
                needed = needed_positions(group, hit_tokens // block_size, block_size)
                blocks = [self.pool.lookup((group_id, self.prefix(request_id, p, group_id))) for p in needed]
                assert None not in blocks
                found_ids.append((NULL,) * needed.start + tuple(b for b in blocks if b is not None))
        return hit_tokens, tuple(found_ids), longest if longest > hit_tokens else 0

    def _full_sub_block_hit(
        self, request_id: str, group_ids: list[int], limit: int, inner: dict[int, tuple[int, int]]
    ) -> int:
        """A full-attention spec group's sub-block hit within ``limit`` tokens: its whole cached blocks from
        the first on, then the last hash boundary cached inside the next block (recorded in ``inner``)."""
        block_size = self.block_sizes[group_ids[0]]
        hash_size = self.hash_size
        hashed = self.num_hashed_tokens(request_id)
        whole = 0
        while whole < min(limit, hashed) // block_size and all(
            self.pool.lookup((g, self.prefix(request_id, whole, g))) is not None for g in group_ids
        ):
            whole += 1
        hit = whole * block_size
        if block_size % hash_size or block_size == hash_size:
            return hit
        top = min(hit + block_size - hash_size, limit // hash_size * hash_size, hashed)
        for boundary in range(top, hit, -hash_size):
            blocks = [self.pool.lookup((g, self.prefix_to(request_id, boundary))) for g in group_ids]
            if None not in blocks:
                for g, block in zip(group_ids, blocks):
                    assert block is not None
                    inner[g] = (whole, block)
                return boundary
        return hit

    def _accepts_tokens(self, request_id: str, group_id: int, num_tokens: int) -> bool:
        """Group ``group_id`` (not full attention) has what a hit of ``num_tokens`` tokens needs: an
        align-mode Mamba group the state at that hash boundary; another its blocks before that block
        boundary."""
        if self.groups[group_id].rules.aligned_states:
            return self.pool.lookup((group_id, self.prefix_to(request_id, num_tokens))) is not None
        return self.accepts(request_id, group_id, num_tokens // self.block_sizes[group_id])

    def plain_hit_tokens(self, request_id: str) -> int:
        """The longest hit, in tokens, below the last token and on the scheduler block size, that every
        group accepts (no drafter)."""
        return self._longest_hit_accepted_by(request_id, range(len(self.groups)))

    def _longest_hit_accepted_by(self, request_id: str, group_ids: Sequence[int]) -> int:
        """The longest hit, in tokens, below the last token and on the scheduler block size, that the
        groups ``group_ids`` accept (no drafter)."""
        num_tokens = len(self.requests[request_id].tokens)
        align = self.alignment
        top = min(num_tokens - 1, self.num_hashed_tokens(request_id)) // align
        return next(
            h * align
            for h in range(top, -1, -1)
            if all(self.accepts(request_id, g, h * align // self.block_sizes[g]) for g in group_ids)
        )

    def first_lookup_tokens(self, request_id: str) -> int:
        """The hit, in tokens, the first spec group's lookup finds (no drafter): the longest every group
        of that spec accepts, below the last token and on the scheduler block size.  No later lookup
        finds a longer one."""
        if len(self.groups) == 1:
            return 0  # one group: no other lookup can fall short of it
        return self._longest_hit_accepted_by(request_id, self.lookup_order[0][1])

    def accepts(self, request_id: str, group_id: int, hit_blocks: int, peek: bool = False) -> bool:
        """Group ``group_id`` finds cached what a hit of ``hit_blocks`` of its blocks needs; with ``peek``,
        the block right after the boundary too (an EAGLE drafter's look at the next block)."""
        block_size = self.block_sizes[group_id]
        positions = list(needed_positions(self.groups[group_id], hit_blocks, block_size))
        if peek:
            positions.append(hit_blocks)
        return all(self.pool.lookup((group_id, self.prefix(request_id, p, group_id))) is not None for p in positions)

    def eagle_hit_tokens(self, request_id: str) -> tuple[int, int]:
        """The hit, in tokens, for an EAGLE drafter, as vLLM 0.33.0 finds it, and the longest hit a
        single lookup found.

        A group's lookup with the drop takes the longest hit on the
        scheduler block size whose next block of the group (the peek) is
        cached too, and may look one of its blocks past the candidate, up to
        the request's last hash.  With one group there is no look past: the
        candidate is the ``num_tokens - 1`` cap.  With several, the spec
        groups' fixed point (:meth:`_fixed_point`) from that cap.  A group
        drops (needs the peek) on its first lookup and again only after a
        lookup without a drop lowered the candidate.
        """
        num_tokens = len(self.requests[request_id].tokens)
        if len(self.groups) == 1:
            peek = not self.groups[0].rules.aligned_states
            return self._longest_accepted(request_id, [0], num_tokens - 1, peek=peek), 0
        hashed = self.num_hashed_tokens(request_id)
        verified: set[GroupSpec] = set()

        def lookup(spec: GroupSpec, group_ids: list[int], current: int) -> int:
            drop = spec in self.dropping_specs and spec not in verified
            assert spec.block_size is not None
            # A Mamba group's lookup looks no further and drops nothing (a drafter has no Mamba layers),
            # though it counts as having dropped.
            peek = drop and not spec.rules.aligned_states
            limit = min(current + spec.block_size, hashed) if peek else current
            found = self._longest_accepted(request_id, group_ids, limit, peek=peek)
            if drop:
                verified.add(spec)
            elif found < current:
                verified.clear()
            return found

        # The cap in tokens, as the first candidate: num_tokens - 1, not aligned.
        return self._fixed_point(num_tokens - 1, lookup)

    def _fixed_point(self, candidate: int, lookup: Callable[[GroupSpec, list[int], int], int]) -> tuple[int, int]:
        """vLLM 0.33.0's hybrid lookup from the first ``candidate``: groups of one spec are looked up
        together (``lookup(spec, group_ids, candidate)`` gives the longest hit they accept within the
        candidate), full attention first; each lowers the candidate, and the passes repeat until none
        lowers it (one pass for full attention and one other spec).  Full attention is looked up once
        and only trims after.  The hit, and the longest hit a single lookup found."""
        order = self.lookup_order
        one_pass = len(order) == 2 and order[0][0].rules.full_hit
        full_hits: dict[GroupSpec, int] = {}
        longest = 0
        while True:
            current = candidate
            for spec, group_ids in order:
                if spec in full_hits:
                    current = min(current, full_hits[spec])
                    continue
                current = lookup(spec, group_ids, current)
                longest = max(longest, current)
                if spec.rules.full_hit:
                    full_hits[spec] = current
            if current >= candidate or one_pass:
                return min(current, candidate), longest
            candidate = current

    def _longest_accepted(self, request_id: str, group_ids: list[int], limit: int, peek: bool) -> int:
        """The longest hit, in tokens on the scheduler block size, the groups (of one spec) all accept
        within ``limit`` tokens, the peek block included.

        A sliding window's hit shorter than its window (cached blocks from
        block 0 on) loses a whole scheduler block to the peek when its blocks
        are smaller: vLLM 0.33.0 trims such a run to the alignment before
        dropping the peeked block and again after."""
        block_size = self.block_sizes[group_ids[0]]
        align = self.alignment
        top = (limit - block_size if peek else limit) // align
        group = self.groups[group_ids[0]]
        for hit in range(top * align, 0, -align):
            if all(self.accepts(request_id, g, hit // block_size, peek) for g in group_ids):
                if peek and group.rules.sliding and block_size < align:
                    assert group.window is not None
                    if hit // block_size < ceil_div(group.window - 1, block_size):
                        return hit - align
                return hit
        return 0
