"""The KV-cache manager, as lists and dicts: tables per request and group over one pool model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from kvmodel.config import GroupSpec, TargetConfig
from kvmodel.observation import CacheEvent, CacheKey, Observation, StoredEvent, block_keys
from kvmodel.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    FinishAsyncLoad,
    GroupIds,
    Operation,
    Preempt,
    ProcessOutput,
    ResetPrefixCache,
    Schedule,
    SpecDecode,
    StartAsyncLoad,
    StateOffload,
    StepResult,
    ends_short_of_its_state,
    flat_state_offloads,
    plan_async_load,
    plan_step,
    prefill_checkpoint_fits,
    reusable_boundary,
)
from kvmodel.pipeline import StepPipeline
from kvmodel.pool_model import NULL, PoolModel
from kvmodel.semantics import NEWEST, Semantics


def ceil_div(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


def skipped_tokens(group: GroupSpec, num_computed_tokens: int) -> int:
    """Leading tokens that no future token attends to once ``num_computed_tokens`` are computed."""
    return group.first_attended_token(num_computed_tokens)


def needed_positions(group: GroupSpec, hit_blocks: int, block_size: int) -> range:
    """Block positions a hit of ``hit_blocks`` blocks must find cached in ``group``: what its kind's
    rules say, and none for a group outside the prefix cache."""
    if not group.rules.in_prefix_cache:
        return range(0)
    return group.rules.needed_positions(group, hit_blocks, block_size)


@attrs.define(eq=False)
class RequestModel:
    request_id: str
    tokens: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_in_flight_tokens: int = 0
    running: bool = False
    loading: bool = False
    waiting: bool = True
    """New or preempted, and not admitted since (vLLM's WAITING and PREEMPTED)."""
    shared_prefix_boundary: int = 0
    """Set by each lookup: the end of the longer prefix a group found cached when the hit fell short of
    it (0 when none did)."""
    max_draft_tokens: int = 0
    state_tokens: int | None = None
    """The tokens the request's last step ran up to, drafts included (``None``: none since it was
    admitted): an align-mode Mamba group's state is saved in that step's last block."""
    """The most draft tokens a speculative decode step of the request scheduled (0: it ran none)."""


class ManagerModel:
    """What a KV-cache manager must do with each operation, stated directly.

    A request's table in group ``g`` is the pool holder ``(request_id, g)``.
    Prefix-cache keys are the token prefixes themselves, so two blocks share
    a key exactly when their whole prefixes are equal.
    """

    def __init__(self, config: TargetConfig, semantics: Semantics | None = None) -> None:
        self.config = config
        self.block_size = config.block_size
        self.block_sizes = config.block_sizes
        self.hash_size = config.hash_size
        self.alignment = config.hit_alignment
        self.partial_hits = config.partial_hits
        self.groups = config.groups
        self.events: list[CacheEvent] | None = [] if config.enable_kv_cache_events else None
        self.pool = PoolModel(config.num_blocks, config.enable_caching, self.events)
        self.requests: dict[str, RequestModel] = {}
        self.num_cached: dict[tuple[str, int], int] = {}
        # The scheduler's calls follow the release's semantics (the newest unless told otherwise).
        self.semantics = Semantics(NEWEST) if semantics is None else semantics
        self.pipeline = StepPipeline.for_config(config, self.semantics)
        # A group drops a block from its hits if it, or a group of the same spec, holds the drafter.
        # Groups of one spec (kind, reach and block size) are looked up together.
        self.specs = tuple(attrs.evolve(group, block_size=size) for group, size in zip(config.groups, self.block_sizes))
        self.dropping_specs = frozenset(self.specs[g] for g in config.drop_group_ids)
        self.dropping_group_ids = frozenset(g for g, spec in enumerate(self.specs) if spec in self.dropping_specs)
        # The groups in the prefix cache by spec (looked up together), full attention's first, then in group order.
        spec_groups: dict[GroupSpec, list[int]] = {}
        for group_id, group in enumerate(self.specs):
            if group.rules.in_prefix_cache:
                spec_groups.setdefault(group, []).append(group_id)
        self.lookup_order = sorted(spec_groups.items(), key=lambda item: not item[0].rules.full_hit)
        # A sliding window caches only the blocks a hit needs: the window's (and an EAGLE peek's, which
        # shifts them a block up) before a boundary a hit can end on.  Those are every scheduler block
        # boundary, or with a retention interval every interval's end (none for 0), and then also the
        # request's replay boundaries and its shared prefix's end.  Group id -> (tokens between periodic
        # boundaries or None, blocks needed before one, the shift); absent: every block is cached.
        self.retention = config.prefix_cache_retention_interval
        periodic = self.alignment if self.retention is None else (self.retention or None)
        self.sparse_windows: dict[int, tuple[int | None, int, int]] = {}
        for group_id, group in enumerate(config.groups):
            if group.rules.sliding:
                assert group.window is not None
                block_size = self.block_sizes[group_id]
                shift = int(group_id in self.dropping_group_ids)
                needed = ceil_div(group.window - 1, block_size) + shift
                if periodic is None or needed < periodic // block_size:
                    self.sparse_windows[group_id] = (periodic, needed, shift)
        self.tracks_shared_prefix = self.retention is not None and bool(self.sparse_windows)
        """Whether a request's shared prefix changes what is cached."""
        self.aligned_mamba = config.has_aligned_mamba
        self.records_shared_prefix = self.tracks_shared_prefix or self.aligned_mamba
        """Whether a request's shared prefix changes what is cached or where a prefill chunk ends (beside
        an align-mode Mamba group), and so is worth looking up."""
        self._num_deferred = 0
        self.mamba_allocated: set[tuple[str, int]] = set()
        """The (request, align-mode Mamba group) pairs that have had an allocation since the request was
        last freed: their next allocations take no speculative blocks and move them instead."""
        self.checkpoints: dict[tuple[str, int], tuple[int, int]] = {}
        """(request, align-mode Mamba group) -> (tokens, position): the prefill checkpoint the request's
        latest allocation keeps, the state after that many tokens in the block at that table position."""
        self.copy_pending: dict[tuple[str, int], tuple[int, int]] = {}
        """(request, group) -> (position, block): a shared block the request's table holds where it writes
        next (a hit ending inside the block, or a state it cached inside the block it goes on writing),
        copied by the next allocation."""
        self.producer_tails: dict[tuple[str, int], int] = {}
        """(request, align-mode Mamba group) -> tokens: the request cached its state after that many tokens
        inside the block it goes on writing (its :attr:`copy_pending` block), until its next allocation
        copies it (the copy is offered a connector) or it finishes (offered then if no later token reached
        the block)."""
        self.state_offloads: list[tuple[int, str, int, int]] = []
        """The boundary states offered a connector during the current operation, as (group, request, block,
        tokens), in the order offered (see :meth:`_take_state_offloads`)."""
        self.step_copies: list[tuple[int, int]] = []
        """The block copies (source, destination) the allocation of the current step queued; each of
        their blocks holds one reference more until the step releases them (:meth:`_release_copies`)."""
        self.checkpoints_held_back = 0
        """Allocations of align-mode Mamba groups that kept no prefill checkpoint only because their chunk
        did not end the prefill (a retention interval of 0)."""
        self.states_thinned = 0
        """Full blocks of align-mode Mamba groups left uncached by a retention interval."""
        self.cached_this_step: set[CacheKey] = set()
        """The keys align-mode Mamba groups entered in the current scheduler step: a request may not hit a
        state under one of them before the next step starts (its state is not computed yet)."""
        self.hits_deferred = 0
        """Schedules refused because their Mamba hit was a state cached in the same step."""
        self.hits_cut_back = 0
        """Sub-block hits cut back to a block boundary because external tokens reach past them."""
        self.found_hit_tokens = 0
        """The hit the last schedule's lookup found, in tokens, before any cut back (0 where it looked up
        nothing: a running request's)."""
        self.junction_states_cached = 0
        """States an align-mode Mamba group entered at the end of a shared prefix (the shared-prefix
        checkpoint)."""
        self.zeroed_groups = config.zeroed_group_ids if config.needs_zeroing else frozenset()
        """The groups whose blocks taken from the pool the worker zeroes before the step."""
        self.to_zero: dict[int, list[int]] = {}
        """Per group, the blocks the current operation took that the worker zeroes, in the order taken."""

    def table(self, request_id: str, group_id: int) -> list[int]:
        return self.pool.holders.setdefault((request_id, group_id), [])

    def prefix(self, request_id: str, block_position: int, group_id: int = 0) -> tuple[int, ...]:
        """The cache key of the block at ``block_position`` of group ``group_id``'s table: the tokens up
        to its end, and the lookahead tokens its hash covers."""
        return self.prefix_to(request_id, (block_position + 1) * self.block_sizes[group_id])

    def prefix_to(self, request_id: str, num_tokens: int) -> tuple[int, ...]:
        """The cache key of a hash boundary after ``num_tokens`` tokens (and the lookahead it covers)."""
        return tuple(self.requests[request_id].tokens[: num_tokens + self.config.num_hash_lookahead_tokens])

    def num_hashed_tokens(self, request_id: str) -> int:
        """Tokens the request has hashes for: whole hash units followed by the lookahead tokens a hash covers."""
        num_tokens = len(self.requests[request_id].tokens) - self.config.num_hash_lookahead_tokens
        return max(0, num_tokens // self.hash_size) * self.hash_size

    def num_hashed_blocks(self, request_id: str, group_id: int = 0) -> int:
        """Blocks of group ``group_id`` the request has a hash for."""
        return self.num_hashed_tokens(request_id) // self.block_sizes[group_id]

    def truncate_hit(self, hit_ids: GroupIds, num_tokens: int) -> GroupIds:
        """A hit's blocks cut back to its first ``num_tokens`` tokens, a boundary of every group's blocks
        (``truncate_computed_blocks``): a Mamba group keeps what it has up to there."""
        return tuple(
            () if not group.rules.in_prefix_cache else hit[: num_tokens // self.block_sizes[group_id]]
            for group_id, (group, hit) in enumerate(zip(self.groups, hit_ids, strict=True))
        )

    def find_hit(self, request_id: str) -> tuple[int, GroupIds]:
        """The longest block-aligned prefix, below the last token, that every group finds cached.

        With an EAGLE drafter the hit is :meth:`eagle_hit_tokens` instead.
        The hit's blocks in each group are those its attention type needs
        before the boundary (null blocks elsewhere).  The request records the
        longest hit a single lookup found, where it exceeds the hit
        (``shared_prefix_boundary``)."""
        request = self.requests[request_id]
        request.shared_prefix_boundary = 0
        if all(not group.rules.in_prefix_cache for group in self.groups):
            return 0, tuple(() for _ in self.groups)  # no group takes part in the prefix cache
        if self.partial_hits:
            return self._sub_block_hit(request_id)
        if self.config.drop_group_ids:
            hit_tokens, longest = self.eagle_hit_tokens(request_id)
        else:
            hit_tokens = self.plain_hit_tokens(request_id)
            # Only a sparse window under a retention interval caches by it: look it up only there.
            longest = self.first_lookup_tokens(request_id) if self.records_shared_prefix else 0
        if longest > hit_tokens:
            request.shared_prefix_boundary = longest
        found = []
        for group_id, group in enumerate(self.groups):
            block_size = self.block_sizes[group_id]
            needed = needed_positions(group, hit_tokens // block_size, block_size)
            blocks = [self.pool.lookup((group_id, self.prefix(request_id, p, group_id))) for p in needed]
            assert None not in blocks
            found.append((NULL,) * needed.start + tuple(b for b in blocks if b is not None))
        return hit_tokens, tuple(found)

    def _sub_block_hit(self, request_id: str) -> tuple[int, GroupIds]:
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
        request.shared_prefix_boundary = longest if longest > hit_tokens else 0
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
        return hit_tokens, tuple(found_ids)

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

    def decode_ready(self) -> list[str]:
        """Running requests whose every token but the last is computed: a speculative step may run."""
        return sorted(r for r, m in self.requests.items() if m.running and m.num_computed_tokens == len(m.tokens) - 1)

    def min_draft_tokens(self, request_id: str) -> int:
        """The fewest draft tokens a speculative step of ``request_id`` runs with beside an align-mode Mamba
        group: as many as reach where its last step ended (:func:`~kvmodel.ops.ends_short_of_its_state`)."""
        request = self.requests[request_id]
        if request.state_tokens is None or not self.aligned_mamba:
            return 0
        return max(0, request.state_tokens - request.num_computed_tokens - 1)

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

    def observe(self) -> Observation:
        entries = self.pool.entries()
        tables = {}
        for request_id in self.requests:
            groups = tuple(tuple(self.pool.holders.get((request_id, g), ())) for g in range(len(self.groups)))
            if any(groups):
                tables[request_id] = groups
        return Observation(
            free_order=tuple(self.pool.free_order),
            free_order_backward=tuple(reversed(self.pool.free_order)),
            num_free=len(self.pool.free_order),
            ref_counts=self.pool.ref_counts(),
            tables=tables,
            cache_entries=frozenset((g, prefix, b) for (g, prefix), b in entries),
            block_cache_keys=block_keys(entries),
            deferred_frees=tuple(tuple(self.pool.holders[key]) for _, key in self.pipeline.deferred),
            events=tuple(self.events or ()),
            prompt_lengths={rid: request.num_prompt_tokens for rid, request in self.requests.items()},
            state_tokens={
                rid: request.state_tokens for rid, request in self.requests.items() if request.state_tokens is not None
            },
            draft_tokens={
                rid: request.max_draft_tokens for rid, request in self.requests.items() if request.max_draft_tokens
            },
        )

    def apply(self, op: Operation) -> StepResult:
        result = self._apply(op)
        offloads = self._take_state_offloads()
        if offloads:
            result = attrs.evolve(result, state_offloads=result.state_offloads + offloads)
        if self.to_zero:
            # The allocator hands them over group by group.
            zeroed = tuple(block for group_id in sorted(self.to_zero) for block in self.to_zero[group_id])
            self.to_zero = {}
            result = attrs.evolve(result, zeroed_block_ids=zeroed)
        return result

    def _apply(self, op: Operation) -> StepResult:
        if isinstance(op, AddRequest):
            self.requests[op.request_id] = RequestModel(op.request_id, list(op.prompt), len(op.prompt))
            return StepResult()
        if isinstance(op, SpecDecode):
            return self._spec_decode(op)
        if isinstance(op, Schedule):
            return self._schedule(op)
        if isinstance(op, ProcessOutput):
            self._process_output()
            return StepResult()
        if isinstance(op, StartAsyncLoad):
            return self._start_async_load(op)
        if isinstance(op, FinishAsyncLoad):
            request = self.requests[op.request_id]
            if request.loading:
                request.loading, request.running = False, True
                if self.config.enable_caching:
                    self._cache_full_blocks(op.request_id, request.num_computed_tokens)
            return StepResult()
        if isinstance(op, Finish):
            tails = self._finalize_tail_offloads(op.request_id)
            self._release(op.request_id, finished=True)
            del self.requests[op.request_id]
            return StepResult(state_offloads=tails)
        if isinstance(op, FailedLoad):
            # A set, walked in its own order, as the scheduler hands it to evict_blocks.
            held = {b for g in range(len(self.groups)) for b in self.pool.holders.get((op.request_id, g), ()) if b}
            self.pool.evict(held)
            self._preempt(op.request_id)
            return StepResult()
        if isinstance(op, Preempt):
            self._preempt(op.request_id)
            return StepResult()
        if isinstance(op, EvictBlocks):
            self.pool.evict(set(op.block_ids))
            return StepResult()
        if isinstance(op, ResetPrefixCache):
            return StepResult(reset_done=self.pool.reset_prefix_cache())
        raise TypeError(f"unknown operation {op!r}")

    def _schedule(self, op: Schedule) -> StepResult:
        rid = op.request_id
        request = self.requests[rid]
        num_groups = len(self.groups)
        self.found_hit_tokens = 0
        if request.loading:
            return StepResult()
        if self.pipeline.full():
            self._process_output()
        waiting = not request.running
        placeholders = self.pipeline.num_placeholders(rid)
        if not waiting and request.num_computed_tokens >= len(request.tokens) + placeholders:
            return StepResult()
        if not op.same_step:
            self.cached_this_step.clear()  # a new scheduler step starts
        hit_length = 0
        hit_ids: GroupIds = tuple(() for _ in range(num_groups))
        if waiting and self.config.enable_caching:
            hit_length, hit_ids = self.find_hit(rid)
        self.found_hit_tokens = hit_length
        # The probe finds what the lookup finds (no request here bounds its hit below num_tokens - 1).
        probed = hit_length if waiting and self.pipeline.probes_before_lookup else None
        amounts = plan_step(
            op,
            self.config,
            len(request.tokens),
            request.num_computed_tokens,
            request.num_prompt_tokens,
            request.shared_prefix_boundary,
            hit_length if waiting else None,
            placeholders,
        )
        if not waiting and ends_short_of_its_state(
            self.config, request.state_tokens, request.num_computed_tokens + amounts.num_new_tokens
        ):
            return StepResult()
        if waiting and amounts.hit_length is not None and amounts.hit_length != hit_length:
            hit_length, hit_ids = amounts.hit_length, self.truncate_hit(hit_ids, amounts.hit_length)
            self.hits_cut_back += 1
        external = amounts.num_external_tokens
        total_computed = request.num_computed_tokens + hit_length + external
        main_model_tokens = total_computed + amounts.num_new_tokens
        # Slots past the computed tokens are reserved for a drafter's tokens.
        slots = main_model_tokens + self.config.num_lookahead_tokens
        result_hit = (hit_length, hit_ids) if waiting else (None, None)

        new_ids = self._allocate(rid, waiting, hit_ids, total_computed, external, slots, main_model_tokens)
        if new_ids is None:
            return StepResult(
                admitted=False, hit_length=result_hit[0], hit_block_ids=result_hit[1], probed_tokens=probed
            )

        if self.config.enable_caching:
            # Only tokens that exist are cached: never the drafter's slots.
            self._cache_full_blocks(rid, min(main_model_tokens, len(request.tokens)))
        request.running = True
        request.waiting = False
        request.num_computed_tokens = total_computed + amounts.num_new_tokens
        request.state_tokens = request.num_computed_tokens
        if self.pipeline.scheduled(request, rid, amounts.num_new_tokens, len(request.tokens), op.sampled_token, ()):
            request.tokens.append(op.sampled_token)
            if self.pipeline.caches_sync_output:
                self._cache_full_blocks(rid, request.num_computed_tokens)
        return StepResult(
            admitted=True,
            hit_length=result_hit[0],
            hit_block_ids=result_hit[1],
            new_block_ids=new_ids,
            num_external_tokens=external,
            num_slots=slots,
            block_copies=self._release_copies(),
            probed_tokens=probed,
        )

    def _release_copies(self) -> tuple[tuple[int, int], ...]:
        """The step's block copies; their endpoints (each copy's source, then its destination) are
        released once the copies have run: at once, or with deferred frees once the step is processed."""
        copies, self.step_copies = tuple(self.step_copies), []
        endpoints = [block for copy in copies for block in copy]
        if endpoints and self.pipeline.defer_block_free:
            # Deferred frees are released last block first: the endpoints are kept reversed.
            self._defer_free(endpoints[::-1])
        elif endpoints:
            self.pool.release(endpoints)
        return copies

    def _defer_free(self, blocks: list[int]) -> None:
        """Hold ``blocks`` until every step scheduled so far is processed, then free them last first."""
        key = ("deferred", self._num_deferred)
        self._num_deferred += 1
        self.pool.holders[key] = blocks
        self.pipeline.defer_free(key)

    def _allocate(
        self,
        rid: str,
        waiting: bool,
        hit_ids: GroupIds,
        total_computed: int,
        external: int,
        slots: int,
        main_model_tokens: int | None = None,
        load_lands_later: bool = False,
    ) -> GroupIds | None:
        """``allocate_slots``: the request's table grows to ``slots`` token positions (an align-mode
        Mamba group's to ``main_model_tokens``, the slots without a drafter's lookahead), a waiting
        request first taking its hit and ``external`` loaded tokens (not zeroed where
        ``load_lands_later`` writes them); the new blocks, or ``None`` when refused."""
        main = slots if main_model_tokens is None else main_model_tokens
        request = self.requests[rid]
        num_groups = len(self.groups)
        config = self.config
        # A waiting request (new or preempted) is admitted with the scheduler's
        # gates: the watermark while another request runs, the reserved blocks,
        # and, asked for, room for the whole request.
        watermark = reserved = 0
        if request.waiting:
            others_run = any(m.running for r, m in self.requests.items() if r != rid)
            watermark = int(config.watermark * config.num_blocks) if others_run else 0
            reserved = config.reserved_blocks
            if config.reserve_full_sequence:
                whole = self._blocks_needed(
                    rid, waiting, hit_ids, total_computed, external, len(request.tokens), cap=True
                )
                if whole + watermark > len(self.pool.free_order):
                    return None
        # Blocks that left every future token's window are released whether
        # or not the step is admitted; tokens of steps in flight do not count.
        for group_id in range(num_groups):
            self._release_skipped(rid, group_id, max(0, total_computed - request.num_in_flight_tokens))

        # Admission: the step fits when the free queue holds every block it
        # takes: new blocks for the tables, plus hit blocks now sitting free.
        taken = self._blocks_needed(rid, waiting, hit_ids, total_computed, external, slots, cap=False, main=main)
        if taken + watermark > len(self.pool.free_order) - reserved:
            return None

        # Every group takes its local hit before any group allocates for
        # external tokens.
        if waiting and (any(hit_ids) or external > 0):
            for group_id, group in enumerate(self.groups):
                if not group.rules.in_prefix_cache:
                    continue
                num_skipped = skipped_tokens(group, total_computed) // self.block_sizes[group_id]
                kept_hits = list(hit_ids[group_id][num_skipped:])
                self.pool.touch(kept_hits)
                table = self.table(rid, group_id)
                table.extend([NULL] * num_skipped + kept_hits)
                self.num_cached[(rid, group_id)] = len(table)
                block_size = self.block_sizes[group_id]
                if self._hit_ends_inside_block(kept_hits, total_computed - external, block_size):
                    # The shared block is copied to one of the request's own before it writes there.
                    position = total_computed // block_size
                    self.copy_pending[(rid, group_id)] = (position, kept_hits[-1])
                    self.num_cached[(rid, group_id)] = position
            for group_id, group in enumerate(self.groups):
                if external > 0 and (
                    group.rules.scratch_block
                    or (not group.rules.encoder_blocks and total_computed - skipped_tokens(group, total_computed) > 0)
                ):
                    zero = not (load_lands_later and group_id in self.config.async_loaded_group_ids)
                    self._grow(rid, group_id, total_computed, loaded=True, zero=zero)
        return tuple(
            tuple(self._grow(rid, group_id, main if group.rules.aligned_states else slots))
            for group_id, group in enumerate(self.groups)
        )

    def _blocks_needed(
        self,
        rid: str,
        waiting: bool,
        hit_ids: GroupIds,
        total_computed: int,
        external: int,
        num_tokens: int,
        cap: bool,
        main: int | None = None,
    ) -> int:
        """Free blocks the request takes to have ``num_tokens`` slots (``main`` of them the main
        model's; ``external`` of its ``total_computed`` tokens loaded): new blocks for the tables, plus
        hit blocks now sitting free.  With ``cap``, a group that frees blocks as it goes counts at most
        what a request holds at once with ``max_in_flight_tokens`` tokens in flight.  An align-mode
        Mamba group counts one new block when the main model's slots reach past its table (hit
        included), and the shortfall (as a negative count, vLLM 0.33.0 sums it) when its table reaches
        past them."""
        taken = 0
        for group_id, group in enumerate(self.groups):
            block_size = self.block_sizes[group_id]
            copies = waiting and self._hit_ends_inside_block(hit_ids[group_id], total_computed - external, block_size)
            if group.rules.aligned_states:
                hit = hit_ids[group_id] if waiting else ()
                if hit and self.pool.cache.get(hit[-1]) in self.cached_this_step:
                    # The state is computed by this step: the request waits for the next (vLLM asks for
                    # more blocks than the pool has).
                    self.hits_deferred += not cap
                    taken += self.config.num_blocks + 1
                    continue
                taken += sum(1 for b in hit if b in self.pool.free_order)
                end = num_tokens if main is None else main
                wanted = self._slot_blocks(rid, group_id, end)
                most = 1 if (rid, group_id) in self.mamba_allocated else 1 + group.speculative_blocks
                copies = copies or (rid, group_id) in self.copy_pending
                num_new = wanted - len(hit) - len(self.table(rid, group_id))
                if copies:
                    num_new = max(num_new, 0) + 1
                checkpoint = self._checkpoint_tokens(rid, group_id, total_computed, end)
                request = self.requests[rid]
                if checkpoint and self.retention == 0 and end < max(request.num_prompt_tokens, len(request.tokens) - 1):
                    # Under a retention interval of 0 only the chunk ending the prefill keeps one.
                    checkpoint = 0
                    self.checkpoints_held_back += not cap
                if not cap:
                    # The allocation that follows (and the caching after it) writes this checkpoint.
                    if checkpoint:
                        self.checkpoints[(rid, group_id)] = (checkpoint, ceil_div(end, block_size) - 2)
                    else:
                        self.checkpoints.pop((rid, group_id), None)
                taken += min(num_new, most + copies + (checkpoint > 0))
                continue
            if not group.rules.in_prefix_cache:
                taken += max(0, self._slot_blocks(rid, group_id, num_tokens) - len(self.table(rid, group_id)))
                continue
            required = self._slot_blocks(rid, group_id, num_tokens)
            limit = self._admission_cap(group, self.config.spec_block_size(group_id)) if cap else None
            if limit is not None:
                required = min(required, limit)
            length_before_growth = len(self.table(rid, group_id))
            if waiting:
                num_skipped = skipped_tokens(group, total_computed) // block_size
                kept_hits = hit_ids[group_id][num_skipped:]
                taken += sum(1 for b in kept_hits if b in self.pool.free_order)
                length_before_growth = max(num_skipped, len(hit_ids[group_id]))
            taken += max(0, required - length_before_growth) + copies
        return taken

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
        table = self.table(rid, group_id)
        taken = (rid, group_id) in self.mamba_allocated and position >= len(table) - group.speculative_blocks
        return tokens if position >= len(table) or table[position] == NULL or taken else 0

    def _reusable_boundary(self, num_tokens: int, step: int) -> int:
        """Where an align-mode Mamba group keeps the reusable state of a prefix of ``num_tokens`` tokens, on
        multiples of ``step``: short of the last token (and of the hash lookahead), or with an EAGLE
        drafter a ``step`` below the last multiple (:func:`kvmodel.ops.reusable_boundary`)."""
        return reusable_boundary(num_tokens, step, self.config.num_hash_lookahead_tokens, self.config.use_eagle)

    def _hit_ends_inside_block(self, hit: Sequence[int], hit_tokens: int, block_size: int) -> bool:
        """Whether a waiting request's hit of ``hit_tokens`` tokens (its computed tokens but the loaded
        ones) in a group ends inside one of its blocks (only with sub-block hits)."""
        return self.partial_hits and bool(hit) and hit_tokens % block_size != 0

    def _admission_cap(self, group: GroupSpec, block_size: int) -> int | None:
        """Blocks a request of ``group`` holds at once with the configured tokens in flight (``None``:
        no cap): a window's last ``W - 1`` tokens, or a chunk, plus the tokens in flight (a window one
        block more, as it may start inside a block), in blocks of ``block_size`` tokens: the group's
        size on one rank, as vLLM 0.33.0 counts them under decode context parallelism."""
        in_flight = self.config.max_in_flight_tokens
        if in_flight is None:
            return None
        return group.rules.admission_cap(group, in_flight, block_size)

    def _spec_decode(self, op: SpecDecode) -> StepResult:
        """The last token and the drafts get slots (plus lookahead); rejected drafts are rolled back
        but keep their slots; accepted drafts and a bonus token are appended, then every full
        computed block is cached."""
        rid = op.request_id
        request = self.requests[rid]
        if not request.running or request.num_computed_tokens != len(request.tokens) - 1 or self.pipeline.steps:
            return StepResult()
        if not self.config.runs_spec_decode:
            return StepResult()
        main = request.num_computed_tokens + 1 + op.num_draft_tokens
        if ends_short_of_its_state(self.config, request.state_tokens, main):
            return StepResult()
        self.cached_this_step.clear()  # a new scheduler step starts
        num_drafts = op.num_draft_tokens
        num_accepted = min(op.num_accepted_tokens, num_drafts)
        slots = request.num_computed_tokens + 1 + num_drafts + self.config.num_lookahead_tokens
        no_hit = tuple(() for _ in self.groups)
        new_ids = self._allocate(rid, False, no_hit, request.num_computed_tokens, 0, slots, main)
        if new_ids is None:
            return StepResult(admitted=False)
        if self.config.enable_caching:
            # allocate_slots caches what exists before the verifier runs (the drafts do not).
            self._cache_full_blocks(rid, len(request.tokens))
        copies = self._release_copies()  # at scheduling, before the verifier's output
        request.max_draft_tokens = max(request.max_draft_tokens, num_drafts)
        request.state_tokens = main
        request.waiting = False
        request.num_computed_tokens += 1 + num_accepted
        request.tokens.extend([op.sampled_token] * (num_accepted + 1))
        if self.config.enable_caching:
            self._cache_full_blocks(rid, request.num_computed_tokens)
        return StepResult(admitted=True, new_block_ids=new_ids, num_slots=slots, block_copies=copies)

    def _slot_blocks(self, rid: str, group_id: int, num_tokens: int) -> int:
        """The blocks the request's table in ``group_id`` holds once it has ``num_tokens`` slots: a
        ring buffer's one; cross-attention's for the encoder's tokens, given as the request is
        scheduled from waiting (none more after); a block per ``block_size`` slots otherwise, and a
        Mamba group's speculative blocks past them."""
        group = self.groups[group_id]
        block_size = self.block_sizes[group_id]
        encoder_blocks = ceil_div(self.config.num_encoder_tokens, block_size) if self.requests[rid].waiting else 0
        return group.rules.slot_blocks(group, num_tokens, block_size, encoder_blocks)

    def _grow(self, rid: str, group_id: int, num_tokens: int, loaded: bool = False, zero: bool = True) -> list[int]:
        """Grow the table to give ``num_tokens`` slots; ``loaded``: blocks for tokens an external
        connector loads, which take a block per ``block_size`` tokens in every kind but a ring.  The
        blocks taken are recorded for zeroing in a zeroed group, unless not ``zero``."""
        table = self.table(rid, group_id)
        wanted = (
            ceil_div(num_tokens, self.block_sizes[group_id])
            if loaded and not self.groups[group_id].rules.scratch_block
            else self._slot_blocks(rid, group_id, num_tokens)
        )
        if self.groups[group_id].rules.aligned_states and not loaded:
            return self._grow_states(rid, group_id, wanted)
        copied = []
        pending = None if loaded else self.copy_pending.pop((rid, group_id), None)
        if pending is not None:
            position, source = pending
            copied = self.pool.take_free(1)
            table[position] = copied[0]
            self.step_copies.append((source, copied[0]))
        added = self.pool.take_free(max(0, wanted - len(table)))
        table.extend(added)
        if zero and group_id in self.zeroed_groups:
            self.to_zero.setdefault(group_id, []).extend(copied + added)
        return copied + added

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

    def _release_skipped(self, rid: str, group_id: int, total_computed: int) -> None:
        table = self.pool.holders.get((rid, group_id))
        if not table:
            return
        group = self.groups[group_id]
        released_range = group.released_blocks(
            total_computed, self.requests[rid].num_prompt_tokens, self.block_sizes[group_id]
        )
        end = min(released_range.stop, len(table))
        released: list[int] = []
        for position in range(end - 1, released_range.start - 1, -1):
            if table[position] == NULL:
                if group.rules.aligned_states:
                    continue  # an align-mode Mamba table has null gaps between states: all are freed
                break
            released.append(table[position])
            table[position] = NULL
        self.pool.release(released)

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

    def _reachable_boundaries(self, request: RequestModel, group_id: int) -> list[int]:
        """Where a later request can resume from this one's blocks in group ``group_id``, which a retention
        interval keeps whatever it thins: its replay boundaries (a resend's, all but the last prompt
        token; with a drafter's drop, a scheduler block below a resend's and a longer request's hit) and
        the end of a prefix it shares with a request looked up before (and a block below it in a group
        that drops: a request diverging right after it cannot peek past it)."""
        boundaries = [request.num_prompt_tokens - 1]
        if self.config.drop_group_ids:
            align = self.config.scheduler_block_size  # not the hash size: a hit's reach, not its step
            boundaries = [
                max(0, (request.num_prompt_tokens - 1) // align * align - align),
                max(0, request.num_prompt_tokens // align * align - align),
            ]
        junction = request.shared_prefix_boundary
        if junction:
            boundaries.append(junction)
            if group_id in self.dropping_group_ids:
                boundaries.append(junction - self.block_sizes[group_id])
        return boundaries

    def _interval_keeps_state(self, group_id: int, position: int) -> bool:
        """Whether the retention interval keeps an align-mode Mamba group's state at table ``position``
        (after ``position + 1`` blocks) for its own sake: every state with no interval or one spanning
        at most a block, none with 0, else the states after a whole number of ``interval // block``
        blocks."""
        blocks_per_interval = (self.retention or 0) // self.block_sizes[group_id]
        if self.retention is None or (self.retention and blocks_per_interval <= 1):
            return True
        return bool(self.retention) and (position + 1) % blocks_per_interval == 0

    def _cached_states(self, rid: str, group_id: int, start: int, end: int) -> list[int]:
        """The positions in ``[start, end)`` of an align-mode Mamba group's states that are cached: all of
        them with no retention interval; under one, those it keeps (:meth:`_interval_keeps_state`) and
        those ending where a later request can resume (:meth:`_reachable_boundaries`), rounded down to a
        hit boundary.  Counts the live states left out (:attr:`states_thinned`)."""
        if self.retention is None:
            return list(range(start, end))
        block_size = self.block_sizes[group_id]
        boundaries = self._reachable_boundaries(self.requests[rid], group_id)
        resumed = {b // self.alignment * self.alignment // block_size for b in boundaries}
        table = self.table(rid, group_id)
        kept = []
        for p in range(start, end):
            if self._interval_keeps_state(group_id, p) or p + 1 in resumed:
                kept.append(p)
            elif table[p] != NULL:
                self.states_thinned += 1
        return kept

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
        if boundary == request.shared_prefix_boundary and self.config.shared_prefix_checkpoint:
            self.junction_states_cached += 1
        if boundary % self.block_sizes[group_id]:
            self.copy_pending[(rid, group_id)] = (position, block)
            self.producer_tails[(rid, group_id)] = boundary
            self.num_cached[(rid, group_id)] = position

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

    def _start_async_load(self, op: StartAsyncLoad) -> StepResult:
        """A waiting request's hit and external tokens get blocks, as :meth:`_schedule` gives them, with no
        new tokens and no lookahead; nothing is cached until the load finishes."""
        rid = op.request_id
        request = self.requests[rid]
        if request.running or request.loading:
            return StepResult()
        self.cached_this_step.clear()  # a new scheduler step starts
        num_groups = len(self.groups)
        hit_length = 0
        hit_ids: GroupIds = tuple(() for _ in range(num_groups))
        if self.config.enable_caching:
            hit_length, hit_ids = self.find_hit(rid)
        adopted, external = plan_async_load(op, self.config, len(request.tokens), hit_length)
        if external <= 0:
            return StepResult()
        if adopted != hit_length:
            hit_length, hit_ids = adopted, self.truncate_hit(hit_ids, adopted)
            self.hits_cut_back += 1
        total_computed = request.num_computed_tokens + hit_length + external
        new_ids = self._allocate(rid, True, hit_ids, total_computed, external, total_computed, load_lands_later=True)
        if new_ids is None:
            return StepResult(admitted=False, hit_length=hit_length, hit_block_ids=hit_ids)
        request.num_computed_tokens = total_computed
        request.loading = True
        return StepResult(
            admitted=True,
            hit_length=hit_length,
            hit_block_ids=hit_ids,
            new_block_ids=new_ids,
            num_external_tokens=external,
            num_slots=total_computed,
        )

    def _process_output(self) -> None:
        def cache(request: RequestModel, num_tokens: int) -> None:
            if self.config.enable_caching:
                self._cache_full_blocks(request.request_id, num_tokens)

        def free_popped(key: tuple[str, int]) -> None:
            self.pool.release(reversed(self.pool.holders.pop(key)))

        self.pipeline.process_next(
            self.requests.get,
            lambda rid: self.requests[rid].running,
            lambda request, token: request.tokens.append(token),
            cache,
            free_popped,
        )

    def _release(self, rid: str, finished: bool) -> None:
        """Free the request, or (a step of it in flight, frees deferred) hold its blocks until that
        step is processed: group 0's table first, each without its leading null blocks."""
        if self.pipeline.must_defer_free(rid):
            popped: list[int] = []
            for group_id in range(len(self.groups)):
                table = self.pool.holders.pop((rid, group_id), [])
                self.num_cached.pop((rid, group_id), None)
                self.mamba_allocated.discard((rid, group_id))
                self.checkpoints.pop((rid, group_id), None)
                self.copy_pending.pop((rid, group_id), None)
                self.producer_tails.pop((rid, group_id), None)
                start = next((i for i, b in enumerate(table) if b != NULL), len(table))
                popped.extend(table[start:])
            if popped:
                self._defer_free(popped)
        else:
            self._free(rid)
        self.pipeline.freed(self.requests[rid], rid, finished)

    def _free(self, rid: str) -> None:
        for group_id in range(len(self.groups)):
            table = self.pool.holders.pop((rid, group_id), [])
            self.num_cached.pop((rid, group_id), None)
            self.mamba_allocated.discard((rid, group_id))
            self.checkpoints.pop((rid, group_id), None)
            self.copy_pending.pop((rid, group_id), None)
            self.producer_tails.pop((rid, group_id), None)
            self.pool.release(reversed(table))

    def _preempt(self, rid: str) -> None:
        self._release(rid, finished=False)
        request = self.requests[rid]
        request.num_computed_tokens = 0
        request.state_tokens = None
        request.running = False
        request.loading = False
        request.waiting = True
