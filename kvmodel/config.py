"""The configuration every target is built from: plain data, independent of any allocator."""

from __future__ import annotations

import math
from typing import Any

import attrs

from kvmodel.config_checks import check_declared, int_tuple
from kvmodel.config_rules import check_fields_together
from kvmodel.fields import ALLOCATORS, Declaration, declared, to_json
from kvmodel.group_spec import GroupSpec
from kvmodel.limits import (
    MAX_BLOCK_SIZE,
    MAX_DCP_WORLD_SIZE,
    MAX_GROUPS,
    MAX_LOOKAHEAD_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_SCHEDULE_TOKENS,
)

_BOTH = ALLOCATORS
_LOOKAHEAD = Declaration(holds="integer", maximum=MAX_LOOKAHEAD_TOKENS, unit="tokens")
"""A count of tokens looked ahead (slots past a step, hashes past a block, a drafter's prefill)."""


@attrs.frozen(kw_only=True)
class TargetConfig:
    """A KV cache to test: ``num_blocks`` blocks (block 0 is the null block) of
    ``block_size`` tokens shared by ``groups``, with prefix caching on or off;
    ``use_eagle`` serves an EAGLE/MTP drafter (a prefix hit drops its last
    matched block); every step reserves ``num_lookahead_tokens`` slots past
    the tokens it computes, for a drafter's tokens (vLLM's scheduler passes
    its speculative token count to every ``allocate_slots``).

    ``async_scheduling`` schedules a step before the previous one's output
    is processed (vLLM's async scheduler): a step's tokens stay in flight
    until a ``process_output`` operation, outputs are processed in the
    order the steps were scheduled, and a step's sampled token exists only
    then.  ``defer_block_free`` (async only; vLLM sets it for a KV-consumer
    connector) holds the blocks of a request freed while one of its steps is
    in flight until that step is processed.

    ``num_hash_lookahead_tokens`` (L) makes every block hash cover the L
    tokens after its block (vLLM's lookahead block hashes, the default for
    an EAGLE/MTP drafter with prefix caching, in place of the drop);
    ``num_prefill_lookahead`` is how many tokens past a prefill chunk the
    drafter writes (1 for EAGLE, k for k-module MTP), of which all but one
    are never cached; ``eagle_group_ids`` names the groups holding the
    drafter's layers (none named: every group, for an EAGLE drafter).

    Admission of a waiting request, as vLLM's scheduler asks for it:
    ``reserve_full_sequence`` (its ``scheduler_reserve_full_isl``) admits it
    only if the whole request fits, a sliding-window or chunked-local group
    counting at most what it holds at once with ``max_in_flight_tokens``
    tokens in flight (``None``: no cap); ``reserved_blocks`` stay free for
    other requests' steps; ``watermark`` keeps that fraction of the pool
    free while any request runs.

    ``enable_kv_cache_events`` has the allocator queue a KV cache event
    (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) for every change
    to its prefix cache; the target takes them after every step.

    ``num_encoder_tokens`` is the encoder's output length of an
    encoder-decoder model (Whisper pads every input to one length): a
    cross-attention group gets blocks for that many tokens when a request is
    scheduled from waiting.  It is set exactly when a group is
    ``cross_attention``, which needs prefix caching off.

    ``prefix_cache_retention_interval`` thins what a sliding window caches
    (vLLM's sparse checkpoints): ``None`` caches what a hit on any scheduler
    block boundary needs; a positive multiple of the scheduler block size
    only what a hit at the end of each such interval needs, and ``0`` none
    of those; both keep what hits at the request's replay boundaries and at
    the end of a prefix shared with an earlier request need."""

    num_blocks: int = declared(Declaration(holds="integer", minimum=2, maximum=MAX_NUM_BLOCKS, allocators=_BOTH))
    block_size: int = declared(Declaration(holds="integer", minimum=1, maximum=MAX_BLOCK_SIZE))
    enable_caching: bool = declared(Declaration(holds="flag", allocators=_BOTH))
    groups: tuple[GroupSpec, ...] = declared(Declaration(holds="groups", maximum=MAX_GROUPS))
    use_eagle: bool = declared(Declaration(holds="flag", allocators=_BOTH), default=False)
    num_lookahead_tokens: int = declared(_LOOKAHEAD, default=0)
    eagle_group_ids: tuple[int, ...] = declared(
        Declaration(holds="group_ids", maximum=MAX_GROUPS, allocators=_BOTH), default=(), converter=int_tuple
    )
    num_hash_lookahead_tokens: int = declared(attrs.evolve(_LOOKAHEAD, allocators=("vllm",)), default=0)
    num_prefill_lookahead: int = declared(attrs.evolve(_LOOKAHEAD, allocators=_BOTH), default=0)
    reserve_full_sequence: bool = declared(Declaration(holds="flag"), default=False)
    max_in_flight_tokens: int | None = declared(
        Declaration(holds="integer", minimum=1, maximum=MAX_SCHEDULE_TOKENS, allocators=_BOTH), default=None
    )
    reserved_blocks: int = declared(Declaration(holds="integer", maximum=MAX_NUM_BLOCKS), default=0)
    watermark: float = declared(Declaration(holds="fraction", allocators=_BOTH), default=0.0)
    async_scheduling: bool = declared(Declaration(holds="flag"), default=False)
    defer_block_free: bool = declared(Declaration(holds="flag"), default=False)
    enable_kv_cache_events: bool = declared(Declaration(holds="flag", allocators=_BOTH), default=False)
    num_encoder_tokens: int = declared(
        Declaration(holds="integer", maximum=MAX_SCHEDULE_TOKENS, unit="tokens"), default=0
    )
    hash_block_size: int | None = declared(
        Declaration(holds="integer", minimum=1, maximum=MAX_BLOCK_SIZE), default=None
    )
    prefix_cache_retention_interval: int | None = declared(
        Declaration(holds="integer", maximum=MAX_SCHEDULE_TOKENS, unit="tokens", allocators=_BOTH), default=None
    )
    dcp_world_size: int = declared(
        Declaration(holds="integer", minimum=1, maximum=MAX_DCP_WORLD_SIZE, allocators=_BOTH), default=1
    )
    enable_mamba_shared_prefix_checkpoint: bool = declared(Declaration(holds="flag", allocators=_BOTH), default=False)

    def spec_block_size(self, group_id: int) -> int:
        """Group ``group_id``'s block size on one rank: its own, or the cache's."""
        size = self.groups[group_id].block_size
        return self.block_size if size is None else size

    def dcp_sharded(self, group_id: int) -> bool:
        """Whether decode context parallelism shards group ``group_id``: every attention group not
        ``dcp_replicated``; never a Mamba state."""
        group = self.groups[group_id]
        return not group.dcp_replicated and not group.rules.holds_state

    def group_block_size(self, group_id: int) -> int:
        """The tokens a block of group ``group_id`` holds over all ranks (vLLM's manager block size):
        its block size on one rank, times ``dcp_world_size`` if the group is sharded."""
        size = self.spec_block_size(group_id)
        if self.dcp_world_size == 1:
            return size
        return size * self.dcp_world_size if self.dcp_sharded(group_id) else size

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """Every group's block size over all ranks, in group order."""
        return tuple(self.group_block_size(g) for g in range(len(self.groups)))

    @property
    def spec_block_sizes(self) -> tuple[int, ...]:
        """Every group's block size on one rank, in group order."""
        return tuple(self.spec_block_size(g) for g in range(len(self.groups)))

    @property
    def dcp_replicated_group_ids(self) -> tuple[int, ...]:
        """The groups marked ``dcp_replicated``."""
        return tuple(g for g, group in enumerate(self.groups) if group.dcp_replicated)

    @property
    def mixed_block_sizes(self) -> bool:
        """Whether the groups' block sizes (over all ranks) differ."""
        return len(set(self.block_sizes)) > 1

    @property
    def scheduler_block_size(self) -> int:
        """The granularity of a prefix hit and of what a hybrid cache caches: the least common multiple
        of the groups' block sizes (vLLM's scheduler block size)."""
        return math.lcm(*self.block_sizes)

    @property
    def hash_size(self) -> int:
        """The tokens per request block hash: ``hash_block_size`` when given (vLLM's
        ``prefix_match_unit``); else, with prefix caching and several groups, the greatest common divisor
        of the block sizes of the groups in the prefix cache; else the scheduler block size."""
        if self.hash_block_size is not None:
            return self.hash_block_size
        if len(self.groups) == 1 or not self.enable_caching:
            return self.scheduler_block_size
        cacheable = [self.group_block_size(g) for g, group in enumerate(self.groups) if group.rules.in_prefix_cache]
        return math.gcd(*(cacheable or self.block_sizes))

    @property
    def needs_zeroing(self) -> bool:
        """Whether the worker zeroes every new block of an attention group (not a ring buffer) before
        the step: with a Mamba group (its state is read before it is fully written) or attention groups
        of different KV cache dtypes (a block reused across groups would be read in the other dtype), as
        vLLM 0.33.0 decides ``needs_kv_cache_zeroing``."""
        if any(group.rules.holds_state for group in self.groups):
            return True
        return len({group.kv_cache_dtype for group in self.groups}) > 1

    @property
    def zeroed_group_ids(self) -> frozenset[int]:
        """The groups whose new blocks are zeroed, when the cache needs zeroing: attention, not rings."""
        return frozenset(
            i for i, group in enumerate(self.groups) if not (group.rules.holds_state or group.rules.scratch_block)
        )

    @property
    def async_loaded_group_ids(self) -> tuple[int, ...]:
        """The groups an asynchronous external load writes (a connector's default: every group in the
        prefix cache, so not a ring buffer), whose load blocks are therefore not zeroed."""
        return tuple(i for i, group in enumerate(self.groups) if not group.rules.scratch_block)

    @property
    def has_aligned_mamba(self) -> bool:
        """Whether a group is Mamba in vLLM's ``align`` mode."""
        return any(group.rules.aligned_states for group in self.groups)

    @property
    def aligned_mamba_group_ids(self) -> tuple[int, ...]:
        """The groups that are Mamba in vLLM's ``align`` mode."""
        return tuple(g for g, group in enumerate(self.groups) if group.rules.aligned_states)

    @property
    def prefill_checkpoint_alignment(self) -> int | None:
        """The alignment of the prefill checkpoints beside ``mamba_align`` groups, or ``None`` for none:
        vLLM 0.33.0's scheduler plans them when every Mamba group has a checkpoint block, on the first
        one's alignment (kvcheck draws every Mamba group of one spec)."""
        mamba = [group for group in self.groups if group.rules.holds_state]
        if not mamba or any(group.prefill_checkpoint_alignment is None for group in mamba):
            return None
        return mamba[0].prefill_checkpoint_alignment

    @property
    def partial_hits(self) -> bool:
        """Whether hits may end inside a block (vLLM 0.33.0's fine-grained hits): with prefix caching,
        several groups, a ``mamba_align`` group asking for them (:attr:`asks_for_sub_block_hits`), and every other
        group in the prefix cache either hashed at its block size or full attention (``full``, ``mla``,
        ``rswa``) or ``mamba_align``.  A hit is then a multiple of the hash size, and a group whose hit
        ends inside a block copies that block to one of the request's own (copy on write).  Beside a
        sliding-window or chunked-local group hashed finer than its blocks vLLM 0.33.0 turns them off:
        hits stay on the scheduler block size, though full attention with blocks larger than the hashes
        still keys the prompt's last hash boundary inside a block, and a ``mamba_align`` group enters the
        state at that boundary under its one-hash-unit key when the tokens it caches end there."""
        return self.asks_for_sub_block_hits and not self._groups_without_sub_block_lookup()

    @property
    def asks_for_sub_block_hits(self) -> bool:
        """Whether, with prefix caching and several groups, a ``mamba_align`` group asks for sub-block hits
        (on if every other group can take them, :attr:`partial_hits`): on one rank, when its blocks are
        larger than the hashes; over decode context parallel ranks, when they are at least as large, as
        the sharded full-attention blocks, ``dcp_world_size`` times larger, are then the ones hits end
        inside (vLLM 0.33.0's ``partial_hash_hits_enabled``)."""
        if not self.enable_caching or len(self.groups) == 1:
            return False
        if self.dcp_world_size > 1:
            return any(
                group.rules.aligned_states and self.group_block_size(index) >= self.hash_size
                for index, group in enumerate(self.groups)
            )
        return self.states_finer_than_hashes

    @property
    def states_finer_than_hashes(self) -> bool:
        """Whether, with prefix caching and several groups, a ``mamba_align`` group's blocks are larger than
        the hashes, so states sit inside its blocks (sub-block hits on or off)."""
        if not self.enable_caching or len(self.groups) == 1:
            return False
        return any(
            group.rules.aligned_states and self.group_block_size(index) > self.hash_size
            for index, group in enumerate(self.groups)
        )

    def _groups_without_sub_block_lookup(self) -> list[int]:
        """Groups in the prefix cache hashed finer than their blocks whose lookups cannot end inside a
        block (sliding window, chunked local): beside one, vLLM 0.33.0 turns sub-block hits off."""
        return [
            index
            for index, group in enumerate(self.groups)
            if group.rules.in_prefix_cache
            and not (group.rules.full_hit or group.rules.aligned_states)
            and self.group_block_size(index) != self.hash_size
        ]

    @property
    def hit_alignment(self) -> int:
        """Hits are a multiple of this many tokens: the hash size with sub-block hits, else the scheduler
        block size."""
        return self.hash_size if self.partial_hits else self.scheduler_block_size

    @property
    def runs_spec_decode(self) -> bool:
        """Whether speculative decode steps run: not beside an align-mode Mamba group with prefill
        checkpoints, where vLLM 0.33.0 asserts (a step's drafts place its checkpoint past the request's
        hashes, ``tests/vllm/test_known_defects.py``)."""
        return not any(
            group.rules.aligned_states and group.prefill_checkpoint_alignment is not None for group in self.groups
        )

    @property
    def drafter_group_ids(self) -> frozenset[int]:
        """The groups holding the drafter's layers: those named, or every group for an EAGLE drafter."""
        if self.eagle_group_ids:
            return frozenset(self.eagle_group_ids)
        return frozenset(range(len(self.groups))) if self.use_eagle else frozenset()

    @property
    def drop_group_ids(self) -> frozenset[int]:
        """The groups whose prefix hit drops its last block (before merging groups of one spec)."""
        return self.drafter_group_ids if self.use_eagle else frozenset()

    @property
    def num_reprefillable_tokens(self) -> int:
        """Trailing computed tokens a multi-module drafter may prefill again, which are never cached."""
        return max(0, self.num_prefill_lookahead - 1)

    @property
    def shared_prefix_checkpoint(self) -> bool:
        """Whether ``enable_mamba_shared_prefix_checkpoint`` is in force, as vLLM 0.33.0 narrows it: with
        a drafter's groups, sub-block hits and no tokens a drafter prefills again.  ``mamba_align`` groups
        then also cache the state at the end of a prefix a lookup found shared, where a prefill chunk
        ends (inside a block or not)."""
        return (
            self.enable_mamba_shared_prefix_checkpoint
            and bool(self.drafter_group_ids)
            and self.partial_hits
            and not self.num_reprefillable_tokens
        )

    def validate(self) -> TargetConfig:
        """This configuration, once every field is checked; raises :class:`ConfigError` naming the first bad one.

        Each field's range (its declaration) is checked first, then each group, then what fields say of
        each other (:func:`kvmodel.config_rules.check_fields_together`)."""
        check_declared(self)
        check_fields_together(self)
        return self

    def describe(self) -> str:
        kinds = ", ".join(group.describe() for group in self.groups)
        caching = "on" if self.enable_caching else "off"
        eagle = ", EAGLE drafter" if self.use_eagle else ""
        if self.eagle_group_ids:
            eagle += f" in groups {list(self.eagle_group_ids)}"
        if self.num_hash_lookahead_tokens:
            eagle += f", hashes look {self.num_hash_lookahead_tokens} ahead"
        if self.num_prefill_lookahead:
            eagle += f", prefill lookahead {self.num_prefill_lookahead}"
        lookahead = f", lookahead {self.num_lookahead_tokens}" if self.num_lookahead_tokens else ""
        steps = ""
        if self.async_scheduling:
            steps = ", async steps with deferred frees" if self.defer_block_free else ", async steps"
        if self.reserve_full_sequence:
            steps += ", the whole request must fit"
            if self.max_in_flight_tokens is not None:
                steps += f" ({self.max_in_flight_tokens} tokens in flight at most)"
        if self.reserved_blocks:
            steps += f", {self.reserved_blocks} blocks reserved"
        if self.watermark:
            steps += f", watermark {self.watermark}"
        if self.enable_kv_cache_events:
            steps += ", KV cache events"
        if self.num_encoder_tokens:
            steps += f", {self.num_encoder_tokens} encoder tokens"
        if self.hash_size != self.scheduler_block_size or self.mixed_block_sizes:
            plural = "s" * (self.hash_size != 1)
            inside = " (inside blocks)" if self.partial_hits else ""
            steps += f", hashes of {self.hash_size} token{plural}, hits of {self.hit_alignment}{inside}"
        if self.prefix_cache_retention_interval is not None:
            steps += f", retention interval {self.prefix_cache_retention_interval}"
        if self.dcp_world_size > 1:
            steps += f", DCP over {self.dcp_world_size} ranks"
        if self.enable_mamba_shared_prefix_checkpoint:
            steps += ", shared-prefix checkpoints" + ("" if self.shared_prefix_checkpoint else " (not in force)")
        return (
            f"{self.num_blocks} blocks x {self.block_size} tokens, caching {caching}{eagle}{lookahead}{steps}, "
            f"groups [{kinds}]"
        )

    def to_json(self) -> dict[str, Any]:
        """The configuration as a trace writes it (:func:`kvmodel.fields.to_json`)."""
        return to_json(self)
