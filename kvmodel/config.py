"""The configuration every target is built from: plain data, independent of any allocator."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeGuard

import attrs

from kvmodel.fields import ALLOCATORS, Declaration, declarations, declared, to_json
from kvmodel.kinds import CACHING_OFF_KINDS as CACHING_OFF_KINDS
from kvmodel.kinds import FULL_HIT_KINDS as FULL_HIT_KINDS
from kvmodel.kinds import GROUP_KINDS as GROUP_KINDS
from kvmodel.kinds import MAMBA_KINDS as MAMBA_KINDS
from kvmodel.kinds import SLIDING_KINDS as SLIDING_KINDS
from kvmodel.kinds import UNCACHED_KINDS as UNCACHED_KINDS
from kvmodel.kinds import WINDOW_KINDS as WINDOW_KINDS
from kvmodel.kinds import Kind, kind_named, kind_names
from kvmodel.limits import (
    MAX_BLOCK_SIZE,
    MAX_DCP_WORLD_SIZE,
    MAX_GROUPS,
    MAX_LOOKAHEAD_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_SCHEDULE_TOKENS,
    MAX_SPECULATIVE_BLOCKS,
    MAX_WINDOW_TOKENS,
    above,
    shown,
)


def int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    """The converter of fields holding block ids, group ids or tokens."""
    return tuple(values)


KV_CACHE_DTYPES = ("auto", "fp8")
"""A group's KV cache dtype: the model's (``auto``) or 8-bit floats (vLLM's ``--kv-cache-dtype fp8``)."""


class ConfigError(ValueError):
    """A target configuration field is out of range: ``field`` names it, ``detail`` says what is wrong
    (naming the value, and the limit when it is above one)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer (JSON ``true`` and ``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_declared(instance: Any, where: str = "") -> None:
    """Refuse the first declared field of ``instance`` outside what its declaration allows, naming it
    after ``where``; a field at its default of ``None`` (absent) passes."""
    for attribute, declaration in declarations(type(instance)):
        value = getattr(instance, attribute.name)
        if value is None and attribute.default is None:
            continue
        _check_value(where + attribute.name, value, declaration)


def _check_value(name: str, value: Any, declaration: Declaration) -> None:
    holds, minimum, maximum, unit = declaration.holds, declaration.minimum, declaration.maximum, declaration.unit
    if holds == "flag":
        if not isinstance(value, bool):
            raise ConfigError(name, f"must be true or false, got {shown(value)}")
    elif holds == "fraction":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(name, f"must be a fraction of the pool, got {shown(value)}")
        if not 0 <= value < 1:
            raise ConfigError(name, f"must be >= 0 and < 1, got {shown(value)}")
    elif holds == "choice":
        if not isinstance(value, str) or value not in declaration.choices:
            raise ConfigError(name, f"must be one of {', '.join(declaration.choices)}, got {shown(value)}")
    elif holds == "groups":
        if not value:
            raise ConfigError(name, "at least one group is needed")
        if len(value) > maximum:
            raise ConfigError(name, above(len(value), maximum, "groups"))
    elif holds == "group_ids":
        if not isinstance(value, tuple):
            raise ConfigError(name, f"must be a list of group indices, got {shown(value)}")
    elif declaration.spelled_as_range:
        if not is_int(value) or not (minimum or 0) <= value <= maximum:
            counted = f" {unit}" if unit else ""
            raise ConfigError(name, f"must be an integer from {minimum} to {maximum}{counted}, got {shown(value)}")
    else:
        if minimum is None:
            if not is_int(value):
                raise ConfigError(name, f"must be an integer number of {unit}, got {shown(value)}")
        elif not is_int(value) or value < minimum:
            raise ConfigError(name, f"must be an integer >= {minimum}, got {shown(value)}")
        if value > maximum:
            raise ConfigError(name, above(value, maximum, unit))


@attrs.frozen(kw_only=True)
class GroupSpec:
    """One KV-cache group: its attention kind and, for local kinds, the reach in tokens.

    ``window`` is the sliding window (``sliding_window``), the attention
    chunk (``chunked_local``) or the generated tokens an R-SWA group keeps
    beside the prompt (``rswa``), in tokens; ``None`` for the other kinds:
    ``full``, ``mla`` (multi-head latent attention: full attention of a spec
    of its own), ``ring`` (a ring buffer: one scratch block per request),
    ``cross_attention`` (blocks for the encoder's tokens), ``mamba`` (a
    Mamba state group in vLLM's ``none`` cache mode: the block holding the
    last computed token's state is kept, every one before it freed) and
    ``mamba_align`` (a Mamba state group in vLLM's ``align`` mode: position
    ``p`` holds the state after ``(p + 1) * block_size`` tokens, a step
    reaching a new block gets one there and null blocks before it, full
    blocks' states are prefix-cached and a hit needs only its last state).

    ``speculative_blocks`` (Mamba kinds only) is how many blocks past the
    slots every allocation reserves for the states of draft tokens; in the
    align mode they follow the last state, and a step whose new state
    positions pass over them moves them to the table's end.

    ``block_size`` is the group's own block size, when it differs from the
    cache's (``None``: the cache's ``block_size``).

    ``dcp_replicated`` keeps the group's blocks whole on every decode context
    parallel rank (a draft model running at DCP 1 beside a sharded target);
    only attention groups are sharded at all.

    ``kv_cache_dtype`` is the dtype of an attention group's KV cache
    (:data:`KV_CACHE_DTYPES`); attention groups of different dtypes make the
    worker zero every new block (:attr:`TargetConfig.needs_zeroing`).

    ``prefill_checkpoint_alignment`` (``mamba_align`` only) gives the group
    a prefill checkpoint block (vLLM's ``num_prefill_checkpoint_blocks=1``)
    and the token grid, counted from a chunk's start, that its backend can
    export a state on inside the chunk (vLLM's
    ``prefill_checkpoint_alignment``); ``None``: no checkpoint block.
    """

    kind: str = declared(Declaration(holds="choice", choices=GROUP_KINDS))
    window: int | None = declared(
        Declaration(holds="integer", minimum=None, maximum=MAX_WINDOW_TOKENS, unit="tokens"), default=None
    )
    speculative_blocks: int = declared(
        Declaration(holds="integer", maximum=MAX_SPECULATIVE_BLOCKS, spelled_as_range=True), default=0
    )
    block_size: int | None = declared(Declaration(holds="integer", minimum=1, maximum=MAX_BLOCK_SIZE), default=None)
    dcp_replicated: bool = declared(Declaration(holds="flag"), default=False)
    kv_cache_dtype: str = declared(Declaration(holds="choice", choices=KV_CACHE_DTYPES), default="auto")
    prefill_checkpoint_alignment: int | None = declared(
        Declaration(holds="integer", minimum=1, maximum=MAX_BLOCK_SIZE, unit="tokens", spelled_as_range=True),
        default=None,
    )

    def validate(self, block_size: int, where: str) -> None:
        check_declared(self, f"{where}.")
        if self.block_size is not None:
            block_size = self.block_size
        rules = self.rules
        if self.dcp_replicated and rules.holds_state:
            raise ConfigError(f"{where}.dcp_replicated", f"true for a {self.kind} group, whose state is never sharded")
        if self.kv_cache_dtype != "auto" and rules.holds_state:
            raise ConfigError(
                f"{where}.kv_cache_dtype",
                f"{self.kv_cache_dtype} for a {self.kind} group, which holds states, not a KV cache",
            )
        alignment = self.prefill_checkpoint_alignment
        if alignment is not None and not rules.aligned_states:
            raise ConfigError(
                f"{where}.prefill_checkpoint_alignment",
                f"only a {kind_names(lambda kind: kind.aligned_states)} group has prefill checkpoints, "
                f"got {shown(alignment)}",
            )
        if not rules.holds_state and self.speculative_blocks != 0:
            raise ConfigError(
                f"{where}.speculative_blocks",
                f"only a {kind_names(lambda kind: kind.holds_state)} group has speculative blocks, "
                f"got {shown(self.speculative_blocks)}",
            )
        field = f"{where}.window"
        if not rules.has_window:
            if self.window is not None:
                raise ConfigError(field, f"a {self.kind} group has no window, got {shown(self.window)}")
            return
        if self.window is None:
            raise ConfigError(field, f"must be an integer number of tokens, got {shown(self.window)}")
        wrong = rules.validate_window(self.window, block_size)
        if wrong is not None:
            raise ConfigError(field, wrong)

    @property
    def rules(self) -> Kind:
        """The group's kind: its traits and its model rules (:mod:`kvmodel.kinds`)."""
        return kind_named(self.kind)

    def first_attended_token(self, num_computed_tokens: int) -> int:
        """The first token that the token after ``num_computed_tokens`` computed ones attends to: token 0
        for full attention, the window's or the chunk's first for local attention, the last computed
        token for a Mamba state.  Every token before it is skipped: no later token reads it."""
        return self.rules.first_attended_token(self, num_computed_tokens)

    def released_blocks(self, num_computed_tokens: int, num_prompt_tokens: int, block_size: int) -> range:
        """The table positions no future token reads once ``num_computed_tokens`` are processed, of a
        request with a ``num_prompt_tokens``-token prompt: the whole blocks before the first attended
        token, or for R-SWA those between the prompt's last block and the window's first token."""
        return self.rules.released_blocks(self, num_computed_tokens, num_prompt_tokens, block_size)

    def describe(self) -> str:
        """The kind, with its window or speculative blocks, its own block size and whether DCP leaves it
        whole: ``sliding_window(4)``, ``mamba(+2 speculative)``, ``full/8``, ``full replicated``."""
        size = "" if self.block_size is None else f"/{self.block_size}"
        if self.dcp_replicated:
            size += " replicated"
        if self.kv_cache_dtype != "auto":
            size += f" {self.kv_cache_dtype}"
        if self.window is not None:
            return f"{self.kind}({self.window}){size}"
        if self.prefill_checkpoint_alignment is not None:
            size += f" checkpoints/{self.prefill_checkpoint_alignment}"
        if self.speculative_blocks:
            return f"{self.kind}(+{self.speculative_blocks} speculative){size}"
        return self.kind + size

    def to_json(self) -> dict[str, Any]:
        """The group as a trace writes it (:func:`kvmodel.fields.to_json`)."""
        return to_json(self)


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
        each other."""
        check_declared(self)
        for index, group in enumerate(self.groups):
            if not isinstance(group, GroupSpec):
                raise ConfigError(f"groups[{index}]", f"must be a group spec, got {shown(group)}")
            group.validate(self.block_size, f"groups[{index}]")
        for index, group_id in enumerate(self.eagle_group_ids):
            if not is_int(group_id) or not 0 <= group_id < len(self.groups):
                raise ConfigError(
                    f"eagle_group_ids[{index}]",
                    f"must name one of the {len(self.groups)} groups, got {shown(group_id)}",
                )
        if len(set(self.eagle_group_ids)) != len(self.eagle_group_ids):
            raise ConfigError("eagle_group_ids", f"names a group twice: {list(self.eagle_group_ids)}")
        if self.use_eagle and self.num_hash_lookahead_tokens:
            raise ConfigError(
                "num_hash_lookahead_tokens",
                f"{self.num_hash_lookahead_tokens} with use_eagle true: hashes that look ahead replace the EAGLE "
                "drop (vLLM's scheduler turns the drop off)",
            )
        checkpointed = [i for i, group in enumerate(self.groups) if group.prefill_checkpoint_alignment is not None]
        if checkpointed and self.async_scheduling and self.num_hash_lookahead_tokens:
            raise ConfigError(
                f"groups[{checkpointed[0]}].prefill_checkpoint_alignment",
                "prefill checkpoints with async scheduling and hashes that look ahead: vLLM 0.33.0 places a "
                "step's checkpoint past the hashes of a request whose step reaches a token still being sampled, "
                "and asserts (tests/vllm/test_known_defects.py)",
            )
        has_cross = any(group.rules.encoder_blocks for group in self.groups)
        encoder = self.num_encoder_tokens
        encoder_kinds = kind_names(lambda kind: kind.encoder_blocks)
        if has_cross and encoder == 0:
            raise ConfigError("num_encoder_tokens", f"a {encoder_kinds} group needs the encoder's token count (>= 1)")
        if encoder and not has_cross:
            raise ConfigError("num_encoder_tokens", f"{encoder} without a {encoder_kinds} group to hold them")
        if self.defer_block_free and not self.async_scheduling:
            raise ConfigError("defer_block_free", "true needs async_scheduling true: only steps in flight defer a free")
        if self.enable_caching:
            for index, group in enumerate(self.groups):
                reason = group.rules.caching_off_reason
                if reason is not None:
                    raise ConfigError("enable_caching", f"true with groups[{index}] {group.kind}: {reason}")
            if len(self.groups) > 1 and not any(group.rules.in_prefix_cache for group in self.groups):
                raise ConfigError(
                    "enable_caching",
                    "true with no group in the prefix cache: a hybrid cache needs one (vLLM 0.33.0 asserts on it)",
                )
            for index in sorted(self.drop_group_ids):
                if self.groups[index].rules.chunked:
                    raise ConfigError(
                        "use_eagle",
                        f"true with groups[{index}] {self.groups[index].kind} holding the drafter: a chunked-local "
                        "hit cannot drop a block (vLLM 0.33.0 asserts on it)",
                    )
            if self.drafter_group_ids and self.scheduler_block_size < self.num_prefill_lookahead:
                raise ConfigError(
                    "num_prefill_lookahead",
                    f"{self.num_prefill_lookahead} is above the scheduler block size {self.scheduler_block_size}: "
                    "with prefix caching a drafter's prefill lookahead must fit in a hit's last block (vLLM 0.33.0 "
                    "refuses it)",
                )
        self._validate_context_parallel()
        self._validate_block_sizes()
        self._validate_retention_interval()
        self._validate_aligned_mamba()
        return self

    def _validate_aligned_mamba(self) -> None:
        """Refuse what kvcheck does not model beside a ``mamba_align`` group (nor kvcore implements)."""
        if not self.enable_caching:
            return
        for index, group in enumerate(self.groups):
            if not group.rules.aligned_states:
                continue
            if self.states_finer_than_hashes and index in self.drop_group_ids and self.num_reprefillable_tokens:
                raise ConfigError(
                    "num_prefill_lookahead",
                    f"{self.num_prefill_lookahead} with groups[{index}] mamba_align in blocks larger than the hashes "
                    "holding the drafter: vLLM 0.33.0 then keys the prompt's state inside a block a step late, "
                    "after the forward that runs past it (tests/vllm/test_known_defects.py); name the drafter's "
                    "groups without it, or a lookahead of 1",
                )

    def _validate_context_parallel(self) -> None:
        """Refuse the world sizes vLLM 0.33.0 refuses: with prefix caching, sharded groups other than full
        attention in a hybrid cache, and one sharded local-attention group."""
        world = self.dcp_world_size
        if world == 1 or not self.enable_caching:
            return
        for index, group in enumerate(self.groups):
            if not self.dcp_sharded(index) or group.rules.full_hit:
                continue
            if len(self.groups) > 1:
                raise ConfigError(
                    "dcp_world_size",
                    f"{world} with prefix caching and groups[{index}] {group.kind} sharded: a hybrid cache shards "
                    "only full-attention groups (vLLM 0.33.0 asserts on it; mark it dcp_replicated)",
                )
            if group.rules.local_attention:
                raise ConfigError(
                    "dcp_world_size",
                    f"{world} with prefix caching and one {group.kind} group: vLLM 0.33.0 looks its hits up only "
                    "unsharded (it asserts at the first lookup)",
                )

    def _validate_retention_interval(self) -> None:
        """Refuse the retention intervals vLLM 0.33.0's coordinator refuses."""
        interval = self.prefix_cache_retention_interval
        if interval is None:
            return
        if interval and not any(group.rules.sliding or group.rules.holds_state for group in self.groups):
            raise ConfigError(
                "prefix_cache_retention_interval",
                f"{interval} with no sliding-window or Mamba group: retention thins only theirs (vLLM 0.33.0 "
                "refuses it; 0 is accepted)",
            )
        if interval % self.scheduler_block_size:
            raise ConfigError(
                "prefix_cache_retention_interval",
                f"{interval} is not a multiple of the scheduler block size {self.scheduler_block_size} (vLLM 0.33.0 "
                "refuses it)",
            )

    def _validate_block_sizes(self) -> None:
        """Refuse the hash granularity vLLM 0.33.0 refuses, and what kvcheck does not model of mixed sizes."""
        hashing = self.hash_block_size
        if hashing is not None and self.scheduler_block_size % hashing:
            raise ConfigError(
                "hash_block_size",
                f"{hashing} does not divide the scheduler block size {self.scheduler_block_size} (vLLM 0.33.0 "
                "asserts on it)",
            )
        if not self.enable_caching:
            return
        hashing = self.hash_size
        for index, group in enumerate(self.groups):
            size = self.group_block_size(index)
            if len(self.groups) == 1 and hashing != size:
                raise ConfigError(
                    "hash_block_size",
                    f"{hashing} with one group of block_size {size}: with prefix caching one group's hits land on "
                    "its blocks (vLLM 0.33.0 refuses it)",
                )
            if group.rules.in_prefix_cache and size % hashing:
                raise ConfigError(
                    "hash_block_size",
                    f"{hashing} does not divide groups[{index}]'s block_size {size}: every group in the prefix cache "
                    "must hash at a divisor of its block size (vLLM 0.33.0 asserts on it)",
                )
            if group.rules.chunked and len(self.groups) > 1 and size != self.hit_alignment:
                raise ConfigError(
                    f"groups[{index}].block_size",
                    f"{size} is not the hits' alignment {self.hit_alignment} (the scheduler block size, or the "
                    "hash size with sub-block hits): chunked-local hits align to its own blocks (vLLM 0.33.0 "
                    "asserts at the first lookup)",
                )
            if group.rules.scratch_block and size != hashing:
                raise ConfigError(
                    f"groups[{index}].block_size",
                    f"{size} with prefix caching and hashes of {hashing} tokens: vLLM 0.33.0 enters the ring's scratch "
                    "block in the prefix cache under a partial key (not modelled)",
                )

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
