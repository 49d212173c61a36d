"""Attention specs and the KV-cache configuration, as immutable values."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import attrs

from kvcore.errors import InvalidConfig


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _strs(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidConfig(attribute.name, value, "must be an int >= 1")


@attrs.frozen
class FullAttentionSpec:
    """Full attention: every token attends to every earlier token; all blocks are kept."""

    block_size: int = attrs.field(validator=_positive_int)

    kind = "full"


@attrs.frozen
class SlidingWindowSpec:
    """Sliding-window attention: a token attends to the ``sliding_window`` tokens ending with it.

    Blocks wholly before the window of every future token are freed and
    replaced by the null block.
    """

    block_size: int = attrs.field(validator=_positive_int)
    sliding_window: int = attrs.field(validator=_positive_int)

    kind = "sliding_window"


@attrs.frozen
class SlidingWindowMLASpec:
    """Sliding-window attention over MLA's latent vectors (DeepSeek V4's local layers).

    Its blocks leave the window, and its hits need the window's blocks, as a
    sliding window's; a spec of its own, it is looked up as a group apart
    from plain sliding-window attention in a hybrid cache.
    """

    block_size: int = attrs.field(validator=_positive_int)
    sliding_window: int = attrs.field(validator=_positive_int)

    kind = "sliding_window_mla"


@attrs.frozen
class ChunkedLocalAttentionSpec:
    """Chunked local attention: a token attends only to earlier tokens of its own chunk.

    Blocks before the current chunk are freed and replaced by the null block.
    """

    block_size: int = attrs.field(validator=_positive_int)
    attention_chunk_size: int = attrs.field(validator=_positive_int)

    kind = "chunked_local"


@attrs.frozen
class RSWASpec:
    """Reference sliding-window attention (R-SWA): the prompt stays visible to every token, and of
    the generated tokens only the last ``rswa_window``.

    Blocks wholly between the prompt's last block and the window are freed
    and replaced by the null block; a prefix hit is a full-attention hit.
    """

    block_size: int = attrs.field(validator=_positive_int)
    rswa_window: int = attrs.field(validator=_positive_int)

    kind = "rswa"


@attrs.frozen
class CircularBufferSpec:
    """A ring buffer: one block per request for its whole life, whatever its length.

    The block is scratch space (the keys of a group of tokens still being
    compressed): never cached, never part of a prefix hit.
    """

    block_size: int = attrs.field(validator=_positive_int)

    kind = "ring"


@attrs.frozen
class CrossAttentionSpec:
    """Cross-attention of an encoder-decoder model: blocks for the encoder's tokens.

    A request gets them in one allocation, when it is scheduled from waiting
    (``num_encoder_tokens`` of :meth:`~kvcore.KVCacheManager.allocate_slots`),
    and keeps them until freed; they are never cached.
    """

    block_size: int = attrs.field(validator=_positive_int)

    kind = "cross_attention"


@attrs.frozen
class MLAAttentionSpec:
    """Multi-head latent attention (DeepSeek): full attention over one latent vector per token.

    Its blocks are kept and hit as full attention's; a spec of its own, it
    is looked up as a group apart from plain full attention in a hybrid
    cache.
    """

    block_size: int = attrs.field(validator=_positive_int)

    kind = "mla"


def _non_negative_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidConfig(attribute.name, value, "must be an int >= 0")


MAMBA_CACHE_MODES = ("none", "align")


def _mamba_cache_mode(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in MAMBA_CACHE_MODES:
        raise InvalidConfig(attribute.name, value, f"must be one of {list(MAMBA_CACHE_MODES)}")


def _optional_positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidConfig(attribute.name, value, "must be None or an int >= 1")


@attrs.frozen
class MambaSpec:
    """A Mamba (linear-attention) state group, in one of vLLM's cache modes.

    A token reads only the state left by the token before it.  In the
    ``none`` mode (``cache_mode``) the state is never cached: once ``n``
    tokens are computed every block before the one holding token ``n - 1``
    is freed, and each allocation reserves ``num_speculative_blocks`` blocks
    past the slots, where an MTP/EAGLE verifier keeps the states of draft
    tokens.

    In the ``align`` mode (prefix caching of states) table position ``p``
    holds the state after ``(p + 1) * block_size`` tokens: the scheduler
    ends prefill chunks on block boundaries, and a step that reaches a new
    block gets one new block there, the positions it skips padded with the
    null block.  The block the step copies its state from stays until the
    next step; every earlier one is freed.  ``num_speculative_blocks``
    blocks follow the last state (taken on a request's first allocation);
    a step whose new state positions pass over them moves them, whole, to
    the table's end.  A full block's state is cached under the hash of its
    prefix, and a hit needs only the state block at its end (found by
    searching right to left).  What kvcore does not implement of the mode
    is listed in :class:`KVCacheConfig`.

    ``num_prefill_checkpoint_blocks`` above 0 (with a
    ``prefill_checkpoint_alignment``, the token grid the backend can export
    a state on inside a chunk) gives the ``align`` mode prefill checkpoints:
    a chunk that spans past a block boundary keeps, in the block before its
    last state's, the state at the last hit boundary short of its end (see
    :class:`~kvcore.managers.mamba.AlignedMambaManager`).  The ``none`` mode
    ignores both.
    """

    block_size: int = attrs.field(validator=_positive_int)
    num_speculative_blocks: int = attrs.field(default=0, validator=_non_negative_int)
    cache_mode: str = attrs.field(default="none", validator=_mamba_cache_mode)
    num_prefill_checkpoint_blocks: int = attrs.field(default=0, validator=_non_negative_int)
    prefill_checkpoint_alignment: int | None = attrs.field(default=None, validator=_optional_positive_int)

    kind = "mamba"

    @property
    def aligned(self) -> bool:
        """Whether the group runs in the ``align`` mode (its states are prefix-cached)."""
        return self.cache_mode == "align"

    @property
    def has_prefill_checkpoints(self) -> bool:
        """Whether prefill chunks may keep a checkpoint state (the ``align`` mode with checkpoint blocks)."""
        return self.aligned and self.num_prefill_checkpoint_blocks > 0


AttentionSpec = (
    FullAttentionSpec
    | SlidingWindowSpec
    | ChunkedLocalAttentionSpec
    | RSWASpec
    | CircularBufferSpec
    | CrossAttentionSpec
    | MLAAttentionSpec
    | SlidingWindowMLASpec
    | MambaSpec
)
ATTENTION_SPECS = (
    FullAttentionSpec,
    SlidingWindowSpec,
    ChunkedLocalAttentionSpec,
    RSWASpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    MambaSpec,
)


def is_full_attention(spec: AttentionSpec) -> bool:
    """Whether hits of ``spec`` are full-attention hits (every block from the first on): full attention
    (plain or MLA) and R-SWA, whose gap is freed only after the prompt."""
    return isinstance(spec, FullAttentionSpec | MLAAttentionSpec | RSWASpec)


def is_prefix_cacheable(spec: AttentionSpec) -> bool:
    """Whether ``spec``'s group takes part in the prefix cache: not a ring buffer's scratch block, nor
    cross-attention's per-request encoder blocks."""
    return not isinstance(spec, CircularBufferSpec | CrossAttentionSpec)


def _groups(instance: object, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if len(value) < 1:
        raise InvalidConfig("groups", value, "at least one KV-cache group is needed")
    for index, spec in enumerate(value):
        if not isinstance(spec, ATTENTION_SPECS):
            raise InvalidConfig(f"groups[{index}]", spec, "must be an attention spec")


def _optional_block_size(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


def _num_blocks(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise InvalidConfig("num_blocks", value, "must be an int >= 2 (block 0 is the null block)")


def _boolean(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidConfig(attribute.name, value, "must be True or False")


def _max_model_len(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


def _specs(values: Iterable[AttentionSpec]) -> tuple[AttentionSpec, ...]:
    return tuple(values)


@attrs.frozen
class KVCacheConfig:
    """One KV cache: a pool of ``num_blocks`` blocks shared by every group.

    ``groups`` holds one attention spec per KV-cache group (layers of one
    attention type); with more than one group the cache is *hybrid*.  Groups
    may differ in block size: ``scheduler_block_size`` (default: the least
    common multiple of the groups' block sizes) is the granularity of a
    prefix hit and of what a hybrid cache caches, ``hash_block_size``
    (default: with caching and several groups, the greatest common divisor of
    the sizes of the groups in the prefix cache; else the scheduler block
    size) that of a request's block hashes, which a group views at its own
    block size.  A full-attention group whose blocks are larger than the
    hash granularity also caches the prompt's last hash boundary inside a
    block (a *partial* entry), as vLLM 0.33.0 does.  ``max_model_len`` bounds the token slots of
    a request (``None``: no bound).  ``use_eagle`` serves an EAGLE/MTP drafter:
    a prefix hit drops its last matched block (see :mod:`kvcore.coordinator`)
    in the groups that hold the drafter's layers, ``eagle_group_ids`` (all
    groups when none is named); chunked local attention cannot drop.
    ``num_prefill_lookahead`` is how many tokens past a prefill chunk the
    drafter writes (1 for EAGLE, k for k-module MTP): the last
    ``num_prefill_lookahead - 1`` computed tokens may be re-prefilled, so
    they are never cached (in a hybrid cache, only by the groups that
    drop); with drafter groups and caching, a block must hold them all.
    ``watermark`` keeps that fraction of the pool free when a waiting request
    is admitted while others run.  ``max_in_flight_tokens`` (tokens
    scheduled and not yet processed, at most) caps what a request of a
    sliding-window or chunked-local group holds at once, which sizes the
    ``full_sequence_must_fit`` admission gate.  ``enable_kv_cache_events``
    queues a KV cache event (:mod:`kvcore.events`) for every change to the
    prefix cache, for :meth:`~kvcore.KVCacheManager.take_events`.
    ``prefix_cache_retention_interval`` thins what a sliding window caches
    (see :mod:`kvcore.managers.sliding_window`): ``None`` caches every block
    a hit on the scheduler block size can need; ``0`` only the blocks a
    hit at a request's replay boundaries (and at a shared prefix's end)
    needs; a positive multiple of the scheduler block size those and the
    blocks a hit needs at the end of every interval.

    ``dcp_world_size`` is the decode context parallel world size: every
    attention group's blocks are sharded over that many ranks, so a block of
    a group holds ``block_size * dcp_world_size`` tokens (its *manager block
    size*, :meth:`manager_block_size`), unless the group is named in
    ``dcp_replicated_group_ids`` (a draft model running at DCP 1 keeps a
    replicated cache); a Mamba state is never sharded.  Every size above,
    the defaults included, speaks of manager block sizes.  With prefix
    caching, a hybrid cache shards only full-attention groups (plain, MLA,
    R-SWA), and one sliding-window or chunked-local group is never sharded,
    as vLLM 0.33.0 asserts.

    Cross-attention groups and Mamba groups outside the ``align`` mode have
    no prefix cache, so they need caching off; with caching on, a hybrid
    cache needs a group that is not a ring buffer.  A hash block size below
    an ``align``-mode Mamba group's blocks turns on sub-block hits
    (:attr:`partial_hits`), unless a sliding-window or chunked-local group
    is hashed finer than its own blocks (vLLM 0.33.0 then keeps hits on the
    scheduler block size).  Beside an ``align``-mode Mamba group kvcore does
    not implement (and refuses by field, saying so) decode context
    parallelism with prefix caching.

    ``kv_cache_dtypes`` names each group's KV cache dtype (empty: one dtype
    for every group).  With a Mamba group, or attention groups of different
    dtypes, the worker zeroes new blocks before use (:attr:`needs_zeroing`).
    The block sizes vLLM 0.33.0's manager refuses are refused by field.
    """

    num_blocks: int = attrs.field(validator=_num_blocks)
    groups: tuple[AttentionSpec, ...] = attrs.field(converter=_specs, validator=_groups)
    enable_caching: bool = attrs.field(default=True, validator=_boolean)
    max_model_len: int | None = attrs.field(default=None, validator=_max_model_len)
    use_eagle: bool = attrs.field(default=False, validator=_boolean)
    eagle_group_ids: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    num_prefill_lookahead: int = attrs.field(default=0)
    watermark: float = attrs.field(default=0.0)
    max_in_flight_tokens: int | None = attrs.field(default=None)
    enable_kv_cache_events: bool = attrs.field(default=False, validator=_boolean)
    scheduler_block_size: int = attrs.field(default=None, validator=_optional_block_size)
    hash_block_size: int = attrs.field(default=None, validator=_optional_block_size)
    prefix_cache_retention_interval: int | None = attrs.field(default=None)
    dcp_world_size: int = attrs.field(default=1, validator=_positive_int)
    dcp_replicated_group_ids: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    kv_cache_dtypes: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    enable_mamba_shared_prefix_checkpoint: bool = attrs.field(default=False, validator=_boolean)

    def __attrs_post_init__(self) -> None:
        self._check_group_ids("dcp_replicated_group_ids", self.dcp_replicated_group_ids)
        self._check_kv_cache_dtypes()
        for index in self.dcp_replicated_group_ids:
            if isinstance(self.groups[index], MambaSpec):
                raise InvalidConfig(
                    "dcp_replicated_group_ids",
                    self.dcp_replicated_group_ids,
                    f"groups[{index}] is Mamba, never sharded",
                )
        # The sizes an engine resolves when they are not given (vLLM 0.33.0's resolve_kv_cache_block_sizes).
        if self.scheduler_block_size is None:
            object.__setattr__(self, "scheduler_block_size", math.lcm(*self.manager_block_sizes))
        if self.hash_block_size is None:
            object.__setattr__(
                self, "hash_block_size", default_hash_block_size(self.manager_specs, self.enable_caching)
            )
        self._check_block_sizes()
        self._check_retention_interval()
        self._check_aligned_mamba()
        self._check_group_ids("eagle_group_ids", self.eagle_group_ids)
        if not isinstance(self.watermark, int | float) or isinstance(self.watermark, bool):
            raise InvalidConfig("watermark", self.watermark, "must be a fraction of the pool")
        if not 0 <= self.watermark < 1:
            raise InvalidConfig("watermark", self.watermark, "must be >= 0 and < 1")
        if self.max_in_flight_tokens is not None:
            _positive_int(self, attrs.fields(KVCacheConfig).max_in_flight_tokens, self.max_in_flight_tokens)
        lookahead = self.num_prefill_lookahead
        if not isinstance(lookahead, int) or isinstance(lookahead, bool) or lookahead < 0:
            raise InvalidConfig("num_prefill_lookahead", lookahead, "must be an int >= 0")
        if self.enable_caching:
            for index in sorted(self.drop_group_ids):
                if isinstance(self.groups[index], ChunkedLocalAttentionSpec):
                    raise InvalidConfig(
                        "use_eagle", True, f"groups[{index}] is chunked local attention, whose hits cannot drop a block"
                    )
            for index, spec in enumerate(self.groups):
                if isinstance(spec, CrossAttentionSpec):
                    raise InvalidConfig(
                        "enable_caching",
                        True,
                        f"groups[{index}] is cross-attention, which has no prefix cache (vLLM 0.33.0 fails its "
                        "first lookup)",
                    )
                if isinstance(spec, MambaSpec) and not spec.aligned:
                    raise InvalidConfig(
                        "enable_caching",
                        True,
                        f"groups[{index}] is Mamba in the 'none' cache mode, which caches no state (vLLM 0.33.0 "
                        "asserts: prefix caching needs its 'align' mode)",
                    )
            if len(self.groups) > 1 and not any(is_prefix_cacheable(spec) for spec in self.groups):
                raise InvalidConfig(
                    "groups", self.groups, "with prefix caching, a hybrid cache needs a group that takes part in it"
                )
            if self.drafter_group_ids and self.scheduler_block_size < lookahead:
                raise InvalidConfig(
                    "num_prefill_lookahead",
                    lookahead,
                    f"a drafter with prefix caching needs scheduler_block_size (={self.scheduler_block_size}) >= "
                    "its prefill lookahead",
                )

    def _check_kv_cache_dtypes(self) -> None:
        dtypes = self.kv_cache_dtypes
        if dtypes and len(dtypes) != len(self.groups):
            raise InvalidConfig(
                "kv_cache_dtypes", dtypes, f"names {len(dtypes)} dtypes for {len(self.groups)} groups (one per group)"
            )
        for index, dtype in enumerate(dtypes):
            if not isinstance(dtype, str) or not dtype:
                raise InvalidConfig(f"kv_cache_dtypes[{index}]", dtype, "must be a dtype's name")

    @property
    def needs_zeroing(self) -> bool:
        """Whether the worker zeroes new blocks before use, so the allocator records them
        (:meth:`~kvcore.KVCacheManager.take_new_block_ids`): with a Mamba group, whose state is read
        before it is fully written, or attention groups of different dtypes, where a block reused across
        groups would be read in the other dtype (vLLM 0.33.0's ``needs_kv_cache_zeroing``)."""
        if any(isinstance(spec, MambaSpec) for spec in self.groups):
            return True
        attention_dtypes = {
            dtype for spec, dtype in zip(self.groups, self.kv_cache_dtypes) if not isinstance(spec, MambaSpec)
        }
        return len(attention_dtypes) > 1

    def _check_aligned_mamba(self) -> None:
        """Refuse what vLLM 0.33.0 refuses beside an ``align``-mode Mamba group, and what kvcore does not
        implement of that mode (named as such)."""
        for index, spec in enumerate(self.groups):
            if not isinstance(spec, MambaSpec) or not spec.aligned:
                continue
            if not self.enable_caching:
                continue
            if self.states_finer_than_hashes and index in self.drop_group_ids and self.num_reprefillable_tokens:
                raise InvalidConfig(
                    "num_prefill_lookahead",
                    self.num_prefill_lookahead,
                    f"groups[{index}] is Mamba in the align mode in blocks larger than the hash block size (sub-block "
                    "hits on or off), holding the drafter: with "
                    "tokens a drafter prefills again, vLLM 0.33.0 enters the prompt's state inside a block a step "
                    "late, after the forward that ran past it (a stale state), which kvcore does not reproduce",
                )

    @property
    def partial_hits(self) -> bool:
        """Whether hits may end inside a block (vLLM 0.33.0's fine-grained, or partial hash, hits): with
        prefix caching, several groups, an align-mode Mamba group asking for them
        (:attr:`asks_for_sub_block_hits`), and every other group in the prefix cache able to look up inside
        its blocks (full attention, plain, MLA or R-SWA, and align-mode Mamba) or hashed at its own block
        size.  A hit is then a
        multiple of the hash block size; a group whose hit ends inside a block copies that shared block
        to a block of its own before writing (copy on write)."""
        return self.asks_for_sub_block_hits and not self._groups_without_fine_grained_lookup()

    @property
    def asks_for_sub_block_hits(self) -> bool:
        """Whether, with prefix caching and several groups, an align-mode Mamba group asks for sub-block
        hits (they are on if every other group can take them, :attr:`partial_hits`): on one rank, when
        its blocks are larger than the hash block size; under decode context parallelism, when they are
        at least as large, as the sharded full-attention blocks (``dcp_world_size`` times larger) are
        then the ones hits end inside (vLLM 0.33.0's ``partial_hash_hits_enabled``)."""
        if not self.enable_caching or len(self.groups) == 1:
            return False
        if self.dcp_world_size > 1:
            return any(
                isinstance(spec, MambaSpec) and spec.aligned and spec.block_size >= self.hash_block_size
                for spec in self.groups
            )
        return self.states_finer_than_hashes

    @property
    def states_finer_than_hashes(self) -> bool:
        """Whether, with prefix caching and several groups, an align-mode Mamba group's blocks are larger
        than the hash block size, so states sit inside its blocks (sub-block hits on or off)."""
        if not self.enable_caching or len(self.groups) == 1:
            return False
        return any(
            isinstance(spec, MambaSpec) and spec.aligned and spec.block_size > self.hash_block_size
            for spec in self.groups
        )

    def _groups_without_fine_grained_lookup(self) -> list[int]:
        """The groups in the prefix cache, hashed at a finer size than their blocks, whose lookups cannot
        stop inside a block (vLLM's ``supports_fine_grained_hash_lookup``: sliding window and chunked local).
        Beside one, vLLM 0.33.0 turns sub-block hits off (hits stay on the scheduler block size)."""
        return [
            index
            for index, spec in enumerate(self.manager_specs)
            if is_prefix_cacheable(spec)
            and spec.block_size != self.hash_block_size
            and not isinstance(spec, FullAttentionSpec | MLAAttentionSpec | RSWASpec)
            and not (isinstance(spec, MambaSpec) and spec.aligned)
        ]

    def _check_group_ids(self, name: str, group_ids: tuple[int, ...]) -> None:
        for index, group_id in enumerate(group_ids):
            if not isinstance(group_id, int) or isinstance(group_id, bool) or not 0 <= group_id < len(self.groups):
                raise InvalidConfig(f"{name}[{index}]", group_id, f"must name one of {len(self.groups)} groups")
        if len(set(group_ids)) != len(group_ids):
            raise InvalidConfig(name, group_ids, "names a group twice")

    def _check_context_parallel(self) -> None:
        """Refuse the sharded groups vLLM 0.33.0 refuses with prefix caching (it asserts on each)."""
        if not self.enable_caching or self.dcp_world_size == 1:
            return
        for index, spec in enumerate(self.groups):
            if not self.dcp_sharded(index) or is_full_attention(spec):
                continue
            if len(self.groups) > 1:
                raise InvalidConfig(
                    "dcp_world_size",
                    self.dcp_world_size,
                    f"groups[{index}] is {spec.kind}: a hybrid prefix cache shards only full-attention groups "
                    "(replicate it with dcp_replicated_group_ids)",
                )
            if isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec | ChunkedLocalAttentionSpec):
                raise InvalidConfig(
                    "dcp_world_size",
                    self.dcp_world_size,
                    f"groups[{index}] is {spec.kind}, whose prefix hits vLLM 0.33.0 finds only unsharded "
                    "(it asserts at the first lookup)",
                )

    def _check_block_sizes(self) -> None:
        """Refuse the block sizes vLLM 0.33.0's manager refuses (it asserts on each)."""
        self._check_context_parallel()
        scheduler, hashing = self.scheduler_block_size, self.hash_block_size
        sizes = list(self.manager_block_sizes)
        if scheduler % hashing or any(scheduler % size for size in sizes):
            raise InvalidConfig(
                "scheduler_block_size",
                scheduler,
                f"must be a multiple of hash_block_size (={hashing}) and of every group's block_size {sizes}",
            )
        if not self.enable_caching:
            return
        if len(self.groups) == 1:
            if hashing != sizes[0]:
                raise InvalidConfig(
                    "hash_block_size", hashing, f"one group with prefix caching hashes at its block_size (={sizes[0]})"
                )
            return
        for index, spec in enumerate(self.manager_specs):
            if is_prefix_cacheable(spec) and spec.block_size % hashing:
                raise InvalidConfig(
                    "hash_block_size",
                    hashing,
                    f"must divide the block_size of every group in the prefix cache; groups[{index}] has "
                    f"{spec.block_size}",
                )
            alignment = hashing if self.partial_hits else scheduler
            if isinstance(spec, ChunkedLocalAttentionSpec) and spec.block_size != alignment:
                raise InvalidConfig(
                    f"groups[{index}].block_size",
                    spec.block_size,
                    f"chunked local attention in a hybrid prefix cache needs blocks of the hits' alignment "
                    f"(={alignment}: the scheduler_block_size, or the hash_block_size with sub-block hits) "
                    "(vLLM 0.33.0 asserts at its first lookup)",
                )

    def _check_retention_interval(self) -> None:
        """Refuse the retention intervals vLLM 0.33.0's coordinator refuses."""
        interval = self.prefix_cache_retention_interval
        if interval is None:
            return
        if not isinstance(interval, int) or isinstance(interval, bool):
            raise InvalidConfig("prefix_cache_retention_interval", interval, "must be None or an int")
        sparse_kinds = (SlidingWindowSpec, SlidingWindowMLASpec, MambaSpec)
        if not any(isinstance(spec, sparse_kinds) for spec in self.groups):
            if interval:
                raise InvalidConfig(
                    "prefix_cache_retention_interval",
                    interval,
                    "no sliding-window or Mamba group, so a retention interval has no effect (0 is accepted)",
                )
            return
        if interval < 0 or interval % self.scheduler_block_size:
            raise InvalidConfig(
                "prefix_cache_retention_interval",
                interval,
                f"must be >= 0 and a multiple of scheduler_block_size (={self.scheduler_block_size})",
            )

    def dcp_sharded(self, group_id: int) -> bool:
        """Whether decode context parallelism shards group ``group_id``'s blocks: every attention group's
        but those named in ``dcp_replicated_group_ids``; never a Mamba state's."""
        return group_id not in self.dcp_replicated_group_ids and not isinstance(self.groups[group_id], MambaSpec)

    def manager_block_size(self, group_id: int) -> int:
        """The tokens one block of group ``group_id`` holds over all DCP ranks: its spec's block size,
        times ``dcp_world_size`` if the group is sharded."""
        block_size = self.groups[group_id].block_size
        return block_size * self.dcp_world_size if self.dcp_sharded(group_id) else block_size

    @property
    def manager_block_sizes(self) -> tuple[int, ...]:
        """Every group's manager block size, in group order."""
        return tuple(self.manager_block_size(g) for g in range(len(self.groups)))

    @property
    def manager_specs(self) -> tuple[AttentionSpec, ...]:
        """Every group's spec as its manager sees it: with its manager block size."""
        return tuple(
            spec if spec.block_size == size else attrs.evolve(spec, block_size=size)
            for spec, size in zip(self.groups, self.manager_block_sizes)
        )

    @property
    def mixed_block_sizes(self) -> bool:
        """Whether the groups' manager block sizes differ."""
        return len(set(self.manager_block_sizes)) > 1

    @property
    def drafter_group_ids(self) -> frozenset[int]:
        """The groups holding the drafter's layers: those named, or every group for an EAGLE drafter."""
        if self.eagle_group_ids:
            return frozenset(self.eagle_group_ids)
        return frozenset(range(len(self.groups))) if self.use_eagle else frozenset()

    @property
    def drop_group_ids(self) -> frozenset[int]:
        """The groups whose prefix hit drops its last block: the drafter's, when ``use_eagle``."""
        return self.drafter_group_ids if self.use_eagle else frozenset()

    @property
    def shared_prefix_checkpoint(self) -> bool:
        """Whether align-mode Mamba groups also cache the state at the end of a prefix a lookup found
        shared (``enable_mamba_shared_prefix_checkpoint``, in force as vLLM 0.33.0 narrows it: with a
        drafter's groups, sub-block hits and no tokens a drafter prefills again), where the scheduler
        then ends a prefill chunk, inside a block or not."""
        return (
            self.enable_mamba_shared_prefix_checkpoint
            and bool(self.drafter_group_ids)
            and self.partial_hits
            and not self.num_reprefillable_tokens
        )

    @property
    def num_reprefillable_tokens(self) -> int:
        """Trailing computed tokens a multi-module drafter may prefill again: never cached."""
        return max(0, self.num_prefill_lookahead - 1)

    @property
    def watermark_blocks(self) -> int:
        """Blocks the watermark keeps free."""
        return int(self.watermark * self.num_blocks)

    @property
    def block_size(self) -> int:
        """Group 0's manager block size (every group's, unless :attr:`mixed_block_sizes`)."""
        return self.manager_block_size(0)


def default_scheduler_block_size(groups: tuple[AttentionSpec, ...]) -> int:
    """The scheduling granularity an engine picks: the least common multiple of the groups' block sizes."""
    return math.lcm(*(spec.block_size for spec in groups))


def default_hash_block_size(groups: tuple[AttentionSpec, ...], enable_caching: bool) -> int:
    """The hashing granularity an engine picks: with prefix caching and several groups, the greatest
    common divisor of the block sizes of the groups in the prefix cache; otherwise the scheduler block
    size (also with a Mamba group outside its align mode)."""
    scheduler = default_scheduler_block_size(groups)
    if (
        len(groups) == 1
        or not enable_caching
        or any(isinstance(spec, MambaSpec) and not spec.aligned for spec in groups)
    ):
        return scheduler
    cacheable = [spec.block_size for spec in groups if is_prefix_cacheable(spec)] or [
        spec.block_size for spec in groups
    ]
    return math.gcd(*cacheable)
