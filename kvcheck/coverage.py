"""Coverage labels: the states where allocator bugs live, reported with ``event()``.

Labels are computed from the model around one step, so they name what the
step did, not how the target did it.
"""

from __future__ import annotations

import copy
from collections import Counter

import attrs

from kvmodel.config import FULL_HIT_KINDS, MAMBA_KINDS, SLIDING_KINDS, WINDOW_KINDS, TargetConfig
from kvmodel.manager_model import ManagerModel, skipped_tokens
from kvmodel.observation import CacheKey, ClearedEvent, RemovedEvent, StoredEvent
from kvmodel.ops import (
    FailedLoad,
    Finish,
    FinishAsyncLoad,
    GroupIds,
    Operation,
    Preempt,
    ResetPrefixCache,
    Schedule,
    SpecDecode,
    StartAsyncLoad,
    StepResult,
)

POOL_EXHAUSTED = "pool exhausted"
ALLOCATION_REFUSED = "allocation returned None"
CACHED_BLOCK_EVICTED = "cached block evicted"
HIT_ACROSS_ALL_GROUPS = "prefix hit across all groups"
HIT_ON_FREE_BLOCK = "hit on a ref-count-0 block"
EXTERNAL_WITH_LOCAL_HIT = "external tokens with a local hit"
SLIDING_WINDOW_FREED = "sliding window freed a block"
REHIT_AFTER_PREEMPTION = "preemption then re-hit of own blocks"
EAGLE_DROP_SHORTENED_HIT = "EAGLE drop shortened a hit"
LOOKAHEAD_REFUSED = "lookahead slots made a step not fit"
ROLLBACK_AFTER_REJECTION = "rollback after rejected drafts"
WINDOW_HELD_FOR_IN_FLIGHT = "window block held for a step in flight"
DEFERRED_FREE_RELEASED = "deferred free released after its step"
ASYNC_LOAD_CACHED = "async load cached when it landed"
EVENT_STORE_AFTER_PARENT = "KV cache event: store after a parent"
EVENT_REMOVAL = "KV cache event: entry removed"
EVENT_CLEAR = "KV cache event: cache cleared"
RSWA_GAP_FREED = "R-SWA freed a gap block after the prompt"
RING_BLOCK_KEPT = "ring buffer kept its one block through a step"
CROSS_ATTENTION_ALLOCATED = "cross-attention blocks allocated on admission"
MAMBA_STATE_FREED = "Mamba freed the state block behind its last token"
MAMBA_SPECULATIVE_REFUSED = "Mamba speculative blocks made a step not fit"
HIT_ACROSS_MLA_AND_FULL = "prefix hit across MLA and full-attention groups"
HIT_ACROSS_BLOCK_SIZES = "prefix hit across groups of different block sizes"
PARTIAL_ENTRY_CACHED = "prompt's last hash boundary cached inside a block"
RETENTION_HIT = "prefix hit on a sliding window under a retention interval"
SHARED_PREFIX_RECORDED = "lookup found a shared prefix past the hit under a retention interval"
CONTEXT_PARALLEL_HIT = "prefix hit on blocks sharded over decode context parallel ranks"
MAMBA_ALIGN_HIT = "prefix hit on an align-mode Mamba state"
MAMBA_ALIGN_PADDED = "align-mode Mamba step padded null blocks before its new state"
SUB_BLOCK_HIT_COPIED = "hit ending inside a block copied on write"
STATE_COPIED_FOR_CACHE = "Mamba state cached inside a block copied for the cache"
MIXED_PRECISION_ZEROED = "new blocks zeroed in a cache of two KV cache dtypes"
ASYNC_LOAD_LEFT_UNZEROED = "async load's blocks left out of zeroing"
PREFILL_CHECKPOINT_CACHED = "prefill checkpoint cached under a boundary past its block's end"
PREFILL_CHECKPOINT_TRANSIENT = "transient prefill checkpoint left uncached"
PREFILL_CHECKPOINT_IN_SPECULATIVE_BLOCK = "prefill checkpoint kept in a speculative block"
STATE_HIT_UNDER_RETENTION = "prefix hit on a Mamba state under a retention interval"
STATE_THINNED_BY_RETENTION = "Mamba state left uncached by a retention interval"
CHECKPOINT_HELD_FOR_PREFILL_END = "prefill checkpoint held back for the chunk ending the prefill"
STATE_HIT_BESIDE_DRAFTER = "prefix hit on a Mamba state beside an EAGLE drafter's drop"
CHECKPOINT_BESIDE_DRAFTER = "prefill checkpoint kept a hit boundary lower for an EAGLE drafter"
STATE_HIT_DEFERRED = "hit on a Mamba state cached in the same step deferred to the next"
HIT_INSIDE_BLOCK_BESIDE_DRAFTER = "hit ending inside a drafter group's block after a one-hash-block drop"
SHARED_PREFIX_STATE_CACHED = "Mamba state cached at a shared prefix's end (shared-prefix checkpoint)"
STATE_HIT_BESIDE_WINDOW = "prefix hit on a Mamba state beside local attention"
STATE_HIT_WITH_SUB_BLOCK_HITS_OFF = "prefix hit on a Mamba state with sub-block hits off beside a window hashed finer"
RSWA_HIT_INSIDE_BLOCK = "hit ending inside an R-SWA block copied on write"
STATE_HIT_INSIDE_SHARDED_BLOCK = "prefix hit on a Mamba state ending inside a block sharded over DCP ranks"
EXTERNAL_BESIDE_STATES = "external tokens loaded beside an align-mode Mamba group"
SUB_BLOCK_HIT_CUT_BACK = "sub-block hit cut back to a block boundary for external tokens"
STATE_OFFERED = "Mamba state offered a connector with its block"
STATE_OFFERED_FROM_ITS_COPY = "Mamba state cached inside a block offered a connector from its copy"
FINISHED_STATE_OFFERED = "finishing request's Mamba state inside its block offered a connector"
TABLE_PAST_STATE_AFTER_DRAFTS = "align-mode Mamba table left past its state by rejected drafts"

ALIGN_FEATURE_LABELS = (
    PREFILL_CHECKPOINT_CACHED,
    PREFILL_CHECKPOINT_TRANSIENT,
    PREFILL_CHECKPOINT_IN_SPECULATIVE_BLOCK,
    STATE_HIT_UNDER_RETENTION,
    STATE_THINNED_BY_RETENTION,
    CHECKPOINT_HELD_FOR_PREFILL_END,
    STATE_HIT_BESIDE_DRAFTER,
    CHECKPOINT_BESIDE_DRAFTER,
    STATE_HIT_DEFERRED,
    HIT_INSIDE_BLOCK_BESIDE_DRAFTER,
    SHARED_PREFIX_STATE_CACHED,
    STATE_HIT_INSIDE_SHARDED_BLOCK,
    EXTERNAL_BESIDE_STATES,
    SUB_BLOCK_HIT_CUT_BACK,
    STATE_OFFERED,
    STATE_OFFERED_FROM_ITS_COPY,
    FINISHED_STATE_OFFERED,
    TABLE_PAST_STATE_AFTER_DRAFTS,
)
"""The labels of align-mode Mamba features: prefill checkpoints, sparse state retention, an EAGLE drafter
beside the group (and its one-hash-block drop with sub-block hits), shared-prefix checkpoints, steps of several
requests, sub-block hits inside blocks sharded over decode context parallel ranks, a connector's external
tokens (and the sub-block hits they supersede), boundary states offered a connector (from a copy, and as a
request finishes), speculative decode steps whose rejected drafts leave the table past the state."""

SAMBA_LABELS = (STATE_HIT_BESIDE_WINDOW, STATE_HIT_WITH_SUB_BLOCK_HITS_OFF, RSWA_HIT_INSIDE_BLOCK)
"""The labels of Mamba states beside local attention (the ``samba`` layout): sub-block hits off beside a
sliding window or chunked-local group hashed finer than its blocks, and R-SWA's hits inside its blocks."""

ALL_LABELS = (
    POOL_EXHAUSTED,
    ALLOCATION_REFUSED,
    CACHED_BLOCK_EVICTED,
    HIT_ACROSS_ALL_GROUPS,
    HIT_ON_FREE_BLOCK,
    EXTERNAL_WITH_LOCAL_HIT,
    SLIDING_WINDOW_FREED,
    REHIT_AFTER_PREEMPTION,
    EAGLE_DROP_SHORTENED_HIT,
    LOOKAHEAD_REFUSED,
    ROLLBACK_AFTER_REJECTION,
    WINDOW_HELD_FOR_IN_FLIGHT,
    DEFERRED_FREE_RELEASED,
    ASYNC_LOAD_CACHED,
    EVENT_STORE_AFTER_PARENT,
    EVENT_REMOVAL,
    EVENT_CLEAR,
    RSWA_GAP_FREED,
    RING_BLOCK_KEPT,
    CROSS_ATTENTION_ALLOCATED,
    MAMBA_STATE_FREED,
    MAMBA_SPECULATIVE_REFUSED,
    HIT_ACROSS_MLA_AND_FULL,
    HIT_ACROSS_BLOCK_SIZES,
    PARTIAL_ENTRY_CACHED,
    RETENTION_HIT,
    SHARED_PREFIX_RECORDED,
    CONTEXT_PARALLEL_HIT,
    MAMBA_ALIGN_HIT,
    MAMBA_ALIGN_PADDED,
    SUB_BLOCK_HIT_COPIED,
    STATE_COPIED_FOR_CACHE,
    MIXED_PRECISION_ZEROED,
    ASYNC_LOAD_LEFT_UNZEROED,
    *ALIGN_FEATURE_LABELS,
    *SAMBA_LABELS,
)


GROUP_LAYOUTS: tuple[int | str | None, ...] = (None, 2, 3, 4, "mamba", "samba")
"""Group counts the manager machine runs with when --groups is not given: drawn from 1 to 4
per run, then 2, 3 and 4 fixed, so every hybrid width gets its own full example budget; then
Mamba layouts alone (full attention beside Mamba groups, or Mamba alone), whose states, in both
cache modes and in blocks larger than the hashes, get a budget of their own; then Mamba beside local
attention (``samba``), a few of the others' draws."""

MAMBA_LABELS = (
    MAMBA_STATE_FREED,
    MAMBA_SPECULATIVE_REFUSED,
    MAMBA_ALIGN_HIT,
    MAMBA_ALIGN_PADDED,
    SUB_BLOCK_HIT_COPIED,
    STATE_COPIED_FOR_CACHE,
    *ALIGN_FEATURE_LABELS,
)
"""The labels of Mamba groups' states, which the run of Mamba layouts must reach."""


def _ends_inside_a_sharded_block(model: ManagerModel, hit_length: int) -> bool:
    """Whether a hit of ``hit_length`` tokens ends inside a block of a group sharded over decode context
    parallel ranks (a sub-block hit there)."""
    config = model.config
    return config.dcp_world_size > 1 and any(
        config.dcp_sharded(g) and hit_length % config.group_block_size(g) for g in range(len(config.groups))
    )


def _drop_ends_inside_a_block(model: ManagerModel, hit_length: int) -> bool:
    """Whether a hit of ``hit_length`` tokens ends inside a block of a full-attention group holding the
    drafter (whose drop with sub-block hits is one hash block, not one of its blocks)."""
    return any(
        model.groups[group_id].kind in FULL_HIT_KINDS and hit_length % model.block_sizes[group_id]
        for group_id in model.dropping_group_ids
    )


def _window_beside_states_labels(model: ManagerModel, hit_length: int, copied: bool) -> list[str]:
    """The labels of a hit of ``hit_length`` tokens beside align-mode Mamba groups and local attention:
    any such hit; one with sub-block hits off where the states' blocks are larger than the hashes (a
    sliding-window or chunked-local group hashed finer than its blocks); one ending inside an R-SWA
    block, copied on write (``copied``)."""
    windows = [g for g, group in enumerate(model.groups) if group.kind in WINDOW_KINDS]
    if not hit_length or not windows:
        return []
    labels = [STATE_HIT_BESIDE_WINDOW]
    finer_states = any(
        group.kind == "mamba_align" and model.block_sizes[g] > model.hash_size for g, group in enumerate(model.groups)
    )
    if finer_states and not model.partial_hits:
        labels.append(STATE_HIT_WITH_SUB_BLOCK_HITS_OFF)
    if copied and any(model.groups[g].kind == "rswa" and hit_length % model.block_sizes[g] for g in windows):
        labels.append(RSWA_HIT_INSIDE_BLOCK)
    return labels


def reachable_labels(num_groups: int | str | None) -> tuple[str, ...]:
    """The labels a run must reach when its layouts have ``num_groups`` groups (``None``: drawn from
    1 to 4), or are all of the layout ``num_groups`` names.  A run of Mamba layouts (``"mamba"``)
    must reach the Mamba labels, and one of Mamba beside local attention (``"samba"``) its own,
    which the others are spared (those layouts are a few of their draws).  A hit across all groups
    (or across MLA and full attention) needs two groups at least, as does a shared prefix one group
    cached past the hit, and cross-attention sits beside the decoder's self-attention."""
    if num_groups == "mamba":
        return MAMBA_LABELS
    if num_groups == "samba":
        return SAMBA_LABELS
    general = tuple(label for label in ALL_LABELS if label not in (*MAMBA_LABELS, *SAMBA_LABELS))
    if num_groups == 1:
        multi_group = (
            HIT_ACROSS_ALL_GROUPS,
            CROSS_ATTENTION_ALLOCATED,
            HIT_ACROSS_MLA_AND_FULL,
            HIT_ACROSS_BLOCK_SIZES,
            PARTIAL_ENTRY_CACHED,
            SHARED_PREFIX_RECORDED,
            MIXED_PRECISION_ZEROED,
            ASYNC_LOAD_LEFT_UNZEROED,
        )
        return tuple(label for label in general if label not in multi_group)
    return general


def labels_required(layouts: tuple[int | str | None, ...]) -> tuple[str, ...]:
    """The labels runs of the given layouts (see :func:`reachable_labels`) must reach between them."""
    required = {label for layout in layouts for label in reachable_labels(layout)}
    return tuple(label for label in ALL_LABELS if label in required)


LABELS_SEEN: Counter[str] = Counter()
"""Every label reached in this process (each machine run checks those it added)."""


@attrs.define
class BeforeStep:
    """What the labels need of the model just before a step."""

    free: set[int]
    cached: set[int]
    sliding_nulls: int
    rswa_nulls: int
    mamba_nulls: int
    ring_held: bool
    """For a step of a request: it holds its ring-buffer block(s) already."""
    held_by_request: set[int]
    plain_hit_tokens: int | None
    """For a waiting request's schedule with an EAGLE drafter: the hit without the drop."""
    window_held: bool
    """For a running request's schedule: a block past the processed tokens' window, but inside the
    scheduled tokens' one, is still in its table (a step in flight reads it)."""
    num_deferred: int
    num_events: int
    partial_entries: set[tuple[CacheKey, int]]
    states_thinned: int
    checkpoints_held_back: int
    hits_deferred: int
    junction_states_cached: int
    hits_cut_back: int

    @classmethod
    def capture(cls, model: ManagerModel, op: Operation) -> BeforeStep:
        request_id = getattr(op, "request_id", None)
        holders = model.pool.holders.items()
        held = {b for holder, table in holders if isinstance(holder, tuple) and holder[0] == request_id for b in table}
        plain = None
        if isinstance(op, Schedule) and model.config.use_eagle and model.config.enable_caching:
            request = model.requests.get(op.request_id)
            if request is not None and not request.running:
                plain = model.plain_hit_tokens(op.request_id)
        return cls(
            set(model.pool.free_order),
            set(model.pool.cache),
            _nulls(model, op, *SLIDING_KINDS),
            _nulls(model, op, "rswa"),
            _nulls(model, op, "mamba"),
            any(
                model.pool.holders.get((request_id, g)) for g, group in enumerate(model.groups) if group.kind == "ring"
            ),
            held - {0},
            plain,
            _window_held(model, op),
            len(model.pipeline.deferred),
            len(model.events or ()),
            _partial_entries(model),
            model.states_thinned,
            model.checkpoints_held_back,
            model.hits_deferred,
            model.junction_states_cached,
            model.hits_cut_back,
        )


def _window_held(model: ManagerModel, op: Operation) -> bool:
    """Whether a schedule of a running request keeps a window block only because of steps in flight."""
    request = model.requests.get(getattr(op, "request_id", ""))
    if not isinstance(op, Schedule) or request is None or not request.running or not request.num_in_flight_tokens:
        return False
    in_flight = request.num_in_flight_tokens
    oldest = model.pipeline.steps[0] if model.pipeline.full() else None
    if oldest is not None and oldest.request is request:
        in_flight -= oldest.num_scheduled_tokens  # processed before the step is scheduled
    computed = request.num_computed_tokens
    for group_id, group in enumerate(model.groups):
        table = model.pool.holders.get((op.request_id, group_id), [])
        block_size = model.block_sizes[group_id]
        processed_end = skipped_tokens(group, max(0, computed - in_flight)) // block_size
        scheduled_end = min(skipped_tokens(group, computed) // block_size, len(table))
        if any(b != 0 for b in table[processed_end:scheduled_end]):
            return True
    return False


def _fits_under(model: ManagerModel, refused: Operation, config: TargetConfig) -> bool:
    """Whether a refused step is admitted under ``config`` instead.  A refusal changed nothing but
    releasing blocks that left the window, which the step repeats as a no-op, so it is re-run on a
    copy of the model after it (only refusals pay for the copy)."""
    other = copy.deepcopy(model)
    other.config, other.groups = config, config.groups
    return bool(other.apply(refused).admitted)


def _fits_without_lookahead(model: ManagerModel, refused: Operation) -> bool:
    """Whether a refused step is admitted without lookahead slots."""
    return _fits_under(model, refused, attrs.evolve(model.config, num_lookahead_tokens=0))


def _speculative_groups(model: ManagerModel, refused: Operation) -> list[int]:
    """The Mamba groups whose speculative blocks a refused step counts: every ``none``-mode group's, and an
    align-mode group's on the request's first allocation only (a waiting request's that holds no blocks
    there yet: not one whose asynchronous load took them)."""
    request_id = getattr(refused, "request_id", "")
    request = model.requests.get(request_id)
    waiting = request is not None and request.waiting
    return [
        group_id
        for group_id, group in enumerate(model.groups)
        if group.speculative_blocks
        and (
            group.kind == "mamba"
            or (group.kind == "mamba_align" and waiting and (request_id, group_id) not in model.mamba_allocated)
        )
    ]


def _fits_without_speculative_blocks(model: ManagerModel, refused: Operation, group_ids: list[int]) -> bool:
    """Whether a refused step is admitted when the Mamba groups ``group_ids`` reserve no speculative blocks."""
    groups = tuple(
        attrs.evolve(group, speculative_blocks=0) if group_id in group_ids else group
        for group_id, group in enumerate(model.config.groups)
    )
    return _fits_under(model, refused, attrs.evolve(model.config, groups=groups))


def _partial_entries(model: ManagerModel) -> set[tuple[CacheKey, int]]:
    """The cache entries under a partial key: a hash boundary inside its block (none, without looking,
    where no full-attention group's blocks are larger than the hashes)."""
    if not any(
        group.kind in FULL_HIT_KINDS and size != model.hash_size for group, size in zip(model.groups, model.block_sizes)
    ):
        return set()
    lookahead = model.config.num_hash_lookahead_tokens
    return {
        ((group_id, prefix), block_id)
        for (group_id, prefix), block_id in model.pool.entries()
        if (len(prefix) - lookahead) % model.block_sizes[group_id]
    }


def _table_past_state(model: ManagerModel, rid: str) -> bool:
    """Whether an align-mode Mamba table of ``rid`` holds positions past the block of its computed tokens'
    state, besides its speculative blocks: the blocks of drafts a verifier rejected, where the allocator
    records the last state and the model runner saves the next one."""
    computed = model.requests[rid].num_computed_tokens
    return any(
        len(model.pool.holders.get((rid, g), ())) - group.speculative_blocks
        > -(-computed // model.config.group_block_size(g))
        for g, group in enumerate(model.groups)
        if group.kind == "mamba_align"
    )


def _checkpoint_labels(model: ManagerModel, rid: str, new_block_ids: GroupIds) -> list[str]:
    """The labels of the prefill checkpoints a request's step keeps: one whose block is entered under
    the key of a boundary past the block's end (a state kept in the block before its own position), one
    whose block keeps no key (a transient state), one kept in a speculative block the table held (not
    among the step's new blocks)."""
    labels = []
    for (request_id, group_id), (tokens, position) in model.checkpoints.items():
        if request_id != rid:
            continue
        block = model.table(rid, group_id)[position]
        if block not in new_block_ids[group_id]:
            labels.append(PREFILL_CHECKPOINT_IN_SPECULATIVE_BLOCK)
        key = model.pool.cache.get(block)
        if key is None:
            labels.append(PREFILL_CHECKPOINT_TRANSIENT)
        elif key == (group_id, model.prefix_to(rid, tokens)) and tokens > (position + 1) * model.block_sizes[group_id]:
            labels.append(PREFILL_CHECKPOINT_CACHED)
    return labels


def _offload_labels(op: Operation, result: StepResult) -> list[str]:
    """The labels of the boundary states a step offered a connector."""
    if not result.state_offloads:
        return []
    if isinstance(op, Finish):
        return [FINISHED_STATE_OFFERED]
    copies = {destination for _, destination in result.block_copies}
    labels = [STATE_OFFERED]
    if any(block in copies for _, _, block, _ in result.state_offloads):
        labels.append(STATE_OFFERED_FROM_ITS_COPY)
    return labels


def _nulls(model: ManagerModel, op: Operation, *kinds: str) -> int:
    """Null blocks in the tables of a scheduled request's groups of ``kinds``."""
    if not isinstance(op, Schedule | SpecDecode):
        return 0
    return sum(
        model.pool.holders.get((op.request_id, g), []).count(0)
        for g, group in enumerate(model.groups)
        if group.kind in kinds
    )


def step_labels(
    op: Operation,
    result: StepResult,
    before: BeforeStep,
    model: ManagerModel,
    held_before_preemption: dict[str, set[int]],
) -> list[str]:
    """The labels one step earned; also records preempted requests' blocks for the re-hit label."""
    labels = []
    if not model.pool.free_order:
        labels.append(POOL_EXHAUSTED)
    if result.admitted is False:
        labels.append(ALLOCATION_REFUSED)
    if not isinstance(op, ResetPrefixCache) and before.cached - set(model.pool.cache):
        labels.append(CACHED_BLOCK_EVICTED)
    if isinstance(op, Preempt | FailedLoad):
        held_before_preemption[op.request_id] = before.held_by_request
    if isinstance(op, Schedule) and result.admitted:
        hit_ids = {b for group in result.hit_block_ids or () for b in group if b != 0}
        if result.hit_length and len(model.groups) > 1:
            labels.append(HIT_ACROSS_ALL_GROUPS)
        if hit_ids & before.free:
            labels.append(HIT_ON_FREE_BLOCK)
        if result.hit_length and result.num_external_tokens:
            labels.append(EXTERNAL_WITH_LOCAL_HIT)
        if hit_ids & held_before_preemption.pop(op.request_id, set()):
            labels.append(REHIT_AFTER_PREEMPTION)
    if before.plain_hit_tokens is not None and (result.hit_length or 0) < before.plain_hit_tokens:
        labels.append(EAGLE_DROP_SHORTENED_HIT)
    if result.admitted is False and model.config.num_lookahead_tokens and _fits_without_lookahead(model, op):
        labels.append(LOOKAHEAD_REFUSED)
    if isinstance(op, SpecDecode) and result.admitted and op.num_accepted_tokens < op.num_draft_tokens:
        labels.append(ROLLBACK_AFTER_REJECTION)
    if isinstance(op, SpecDecode) and result.admitted and _table_past_state(model, op.request_id):
        labels.append(TABLE_PAST_STATE_AFTER_DRAFTS)
    if before.window_held and result.admitted:
        labels.append(WINDOW_HELD_FOR_IN_FLIGHT)
    if len(model.pipeline.deferred) < before.num_deferred:
        labels.append(DEFERRED_FREE_RELEASED)
    if isinstance(op, FinishAsyncLoad) and set(model.pool.cache) - before.cached:
        labels.append(ASYNC_LOAD_CACHED)
    if isinstance(op, Schedule) and _nulls(model, op, *SLIDING_KINDS) > before.sliding_nulls:
        labels.append(SLIDING_WINDOW_FREED)
    if _nulls(model, op, "rswa") > before.rswa_nulls:
        labels.append(RSWA_GAP_FREED)
    if _nulls(model, op, "mamba") > before.mamba_nulls:
        labels.append(MAMBA_STATE_FREED)
    speculative = _speculative_groups(model, op) if result.admitted is False else []
    if speculative and _fits_without_speculative_blocks(model, op, speculative):
        labels.append(MAMBA_SPECULATIVE_REFUSED)
    if isinstance(op, Schedule) and result.hit_length and {"mla", "full"} <= {g.kind for g in model.groups}:
        labels.append(HIT_ACROSS_MLA_AND_FULL)
    if isinstance(op, Schedule) and result.hit_length and model.config.mixed_block_sizes:
        labels.append(HIT_ACROSS_BLOCK_SIZES)
    if _partial_entries(model) - before.partial_entries:
        labels.append(PARTIAL_ENTRY_CACHED)
    if isinstance(op, Schedule) and model.tracks_shared_prefix:
        if result.admitted and result.hit_length:
            labels.append(RETENTION_HIT)
        if result.hit_length is not None and model.requests[op.request_id].shared_prefix_boundary:
            labels.append(SHARED_PREFIX_RECORDED)
    if isinstance(op, Schedule) and result.admitted and result.hit_length and model.config.dcp_world_size > 1:
        labels.append(CONTEXT_PARALLEL_HIT)
    if isinstance(op, Schedule) and model.aligned_mamba and _ends_inside_a_sharded_block(model, model.found_hit_tokens):
        # The lookup found it (the sub-block rule under DCP at work), whether or not the step fits.
        labels.append(STATE_HIT_INSIDE_SHARDED_BLOCK)
    if isinstance(op, Schedule) and result.admitted and model.aligned_mamba:
        if result.hit_length:
            labels.append(MAMBA_ALIGN_HIT)
        new_ids = result.new_block_ids or ()
        aligned = [new_ids[g] for g, group in enumerate(model.groups) if group.kind == "mamba_align"]
        if any(0 in ids for ids in aligned):
            labels.append(MAMBA_ALIGN_PADDED)
        labels.extend(_checkpoint_labels(model, op.request_id, result.new_block_ids or ()))
        if result.hit_length and model.retention is not None:
            labels.append(STATE_HIT_UNDER_RETENTION)
        if result.hit_length and model.config.use_eagle:
            labels.append(STATE_HIT_BESIDE_DRAFTER)
        if model.config.use_eagle and any(rid == op.request_id for rid, _ in model.checkpoints):
            labels.append(CHECKPOINT_BESIDE_DRAFTER)
        if result.hit_length and model.partial_hits and _drop_ends_inside_a_block(model, result.hit_length):
            labels.append(HIT_INSIDE_BLOCK_BESIDE_DRAFTER)
        if model.checkpoints_held_back > before.checkpoints_held_back:
            labels.append(CHECKPOINT_HELD_FOR_PREFILL_END)
        if result.num_external_tokens:
            labels.append(EXTERNAL_BESIDE_STATES)
        labels.extend(_window_beside_states_labels(model, result.hit_length or 0, bool(result.block_copies)))
    if model.states_thinned > before.states_thinned:
        labels.append(STATE_THINNED_BY_RETENTION)
    if model.junction_states_cached > before.junction_states_cached:
        labels.append(SHARED_PREFIX_STATE_CACHED)
    if result.admitted is False and model.hits_deferred > before.hits_deferred:
        labels.append(STATE_HIT_DEFERRED)
    if model.hits_cut_back > before.hits_cut_back:
        # The hit is cut back (``truncate_computed_blocks``) before the allocation, whether or not it fits.
        labels.append(SUB_BLOCK_HIT_CUT_BACK)
    if result.block_copies:
        labels.append(SUB_BLOCK_HIT_COPIED if result.hit_length else STATE_COPIED_FOR_CACHE)
    labels.extend(_offload_labels(op, result))
    if result.zeroed_block_ids and not any(group.kind in MAMBA_KINDS for group in model.groups):
        labels.append(MIXED_PRECISION_ZEROED)
    if (
        isinstance(op, StartAsyncLoad)
        and result.admitted
        and model.config.needs_zeroing
        and model.config.zeroed_group_ids & set(model.config.async_loaded_group_ids)
    ):
        labels.append(ASYNC_LOAD_LEFT_UNZEROED)
    if isinstance(op, Schedule | SpecDecode) and result.admitted and before.ring_held:
        labels.append(RING_BLOCK_KEPT)
    if (
        isinstance(op, Schedule)
        and result.admitted
        and result.hit_length is not None
        and any(group.kind == "cross_attention" for group in model.groups)
    ):
        labels.append(CROSS_ATTENTION_ALLOCATED)
    new_events = (model.events or [])[before.num_events :]
    if any(isinstance(event, StoredEvent) and event.parent is not None for event in new_events):
        labels.append(EVENT_STORE_AFTER_PARENT)
    if any(isinstance(event, RemovedEvent) for event in new_events):
        labels.append(EVENT_REMOVAL)
    if any(isinstance(event, ClearedEvent) for event in new_events):
        labels.append(EVENT_CLEAR)
    return labels
