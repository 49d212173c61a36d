"""The manager model's state: the requests, their tables in the pool model, what is cached and what is
in flight, and the questions about them that every concern of the model asks."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds.base import ceil_div
from kvmodel.manager.in_flight import StepsInFlight
from kvmodel.manager.request import RequestModel
from kvmodel.observation import CacheEvent, CacheKey, Observation, block_keys
from kvmodel.pool_model import PoolModel
from kvmodel.semantics import NEWEST, Semantics
from kvmodel.step_plans import reusable_boundary


def skipped_tokens(group: GroupSpec, num_computed_tokens: int) -> int:
    """Leading tokens that no future token attends to once ``num_computed_tokens`` are computed."""
    return group.first_attended_token(num_computed_tokens)


def needed_positions(group: GroupSpec, hit_blocks: int, block_size: int) -> range:
    """Block positions a hit of ``hit_blocks`` blocks must find cached in ``group``: what its kind's
    rules say, and none for a group outside the prefix cache."""
    if not group.rules.in_prefix_cache:
        return range(0)
    return group.rules.needed_positions(group, hit_blocks, block_size)


class ManagerState:
    """What the manager holds, and what it reads of it.

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
        self.pipeline = StepsInFlight(config, self.semantics)
        """The steps in flight under async scheduling, their placeholders, stale outputs and deferred frees."""
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
        self.cached_this_step: set[CacheKey] = set()
        """The keys align-mode Mamba groups entered in the current scheduler step: a request may not hit a
        state under one of them before the next step starts (its state is not computed yet)."""
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

    def _reusable_boundary(self, num_tokens: int, step: int) -> int:
        """Where an align-mode Mamba group keeps the reusable state of a prefix of ``num_tokens`` tokens, on
        multiples of ``step``: short of the last token (and of the hash lookahead), or with an EAGLE
        drafter a ``step`` below the last multiple (:func:`kvmodel.step_plans.reusable_boundary`)."""
        return reusable_boundary(num_tokens, step, self.config.num_hash_lookahead_tokens, self.config.use_eagle)

    def _hit_ends_inside_block(self, hit: Sequence[int], hit_tokens: int, block_size: int) -> bool:
        """Whether a waiting request's hit of ``hit_tokens`` tokens (its computed tokens but the loaded
        ones) in a group ends inside one of its blocks (only with sub-block hits)."""
        return self.partial_hits and bool(hit) and hit_tokens % block_size != 0

    def _slot_blocks(self, rid: str, group_id: int, num_tokens: int) -> int:
        """The blocks the request's table in ``group_id`` holds once it has ``num_tokens`` slots: a
        ring buffer's one; cross-attention's for the encoder's tokens, given as the request is
        scheduled from waiting (none more after); a block per ``block_size`` slots otherwise, and a
        Mamba group's speculative blocks past them."""
        group = self.groups[group_id]
        block_size = self.block_sizes[group_id]
        encoder_blocks = ceil_div(self.config.num_encoder_tokens, block_size) if self.requests[rid].waiting else 0
        return group.rules.slot_blocks(group, num_tokens, block_size, encoder_blocks)

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

    def decode_ready(self) -> list[str]:
        """Running requests whose every token but the last is computed: a speculative step may run."""
        return sorted(r for r, m in self.requests.items() if m.running and m.num_computed_tokens == len(m.tokens) - 1)

    def min_draft_tokens(self, request_id: str) -> int:
        """The fewest draft tokens a speculative step of ``request_id`` runs with beside an align-mode Mamba
        group: as many as reach where its last step ended (:func:`~kvmodel.step_plans.ends_short_of_its_state`)."""
        request = self.requests[request_id]
        if request.state_tokens is None or not self.aligned_mamba:
            return 0
        return max(0, request.state_tokens - request.num_computed_tokens - 1)

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
