"""The coverage labels one operation earned, read from the model before and after it and from its result."""

from __future__ import annotations

import copy

import attrs

from kvcheck.coverage.before import (
    BeforeStep,
    frees_behind_state,
    keeps_prompt,
    null_count,
    partial_entries,
    sliding,
)
from kvcheck.coverage.labels import (
    ALLOCATION_REFUSED,
    ASYNC_LOAD_CACHED,
    ASYNC_LOAD_LEFT_UNZEROED,
    CACHED_BLOCK_EVICTED,
    CHECKPOINT_BESIDE_DRAFTER,
    CHECKPOINT_HELD_FOR_PREFILL_END,
    CONTEXT_PARALLEL_HIT,
    CROSS_ATTENTION_ALLOCATED,
    DEFERRED_FREE_RELEASED,
    EAGLE_DROP_SHORTENED_HIT,
    EVENT_CLEAR,
    EVENT_REMOVAL,
    EVENT_STORE_AFTER_PARENT,
    EXTERNAL_BESIDE_STATES,
    EXTERNAL_WITH_LOCAL_HIT,
    FINISHED_STATE_OFFERED,
    HIT_ACROSS_ALL_GROUPS,
    HIT_ACROSS_BLOCK_SIZES,
    HIT_ACROSS_MLA_AND_FULL,
    HIT_INSIDE_BLOCK_BESIDE_DRAFTER,
    HIT_ON_FREE_BLOCK,
    LOOKAHEAD_REFUSED,
    MAMBA_ALIGN_HIT,
    MAMBA_ALIGN_PADDED,
    MAMBA_SPECULATIVE_REFUSED,
    MAMBA_STATE_FREED,
    MIXED_PRECISION_ZEROED,
    PARTIAL_ENTRY_CACHED,
    POOL_EXHAUSTED,
    PREFILL_CHECKPOINT_CACHED,
    PREFILL_CHECKPOINT_IN_SPECULATIVE_BLOCK,
    PREFILL_CHECKPOINT_TRANSIENT,
    REHIT_AFTER_PREEMPTION,
    RETENTION_HIT,
    RING_BLOCK_KEPT,
    ROLLBACK_AFTER_REJECTION,
    RSWA_GAP_FREED,
    RSWA_HIT_INSIDE_BLOCK,
    SHARED_PREFIX_RECORDED,
    SHARED_PREFIX_STATE_CACHED,
    SLIDING_WINDOW_FREED,
    STATE_COPIED_FOR_CACHE,
    STATE_HIT_BESIDE_DRAFTER,
    STATE_HIT_BESIDE_WINDOW,
    STATE_HIT_DEFERRED,
    STATE_HIT_INSIDE_SHARDED_BLOCK,
    STATE_HIT_UNDER_RETENTION,
    STATE_HIT_WITH_SUB_BLOCK_HITS_OFF,
    STATE_OFFERED,
    STATE_OFFERED_FROM_ITS_COPY,
    STATE_THINNED_BY_RETENTION,
    SUB_BLOCK_HIT_COPIED,
    SUB_BLOCK_HIT_CUT_BACK,
    TABLE_PAST_STATE_AFTER_DRAFTS,
    WINDOW_HELD_FOR_IN_FLIGHT,
)
from kvcheck.coverage.states import aligned_group_ids, junction_state_cached_since, states_thinned_since
from kvmodel.config import TargetConfig
from kvmodel.manager_model import ManagerModel
from kvmodel.observation import ClearedEvent, RemovedEvent, StoredEvent
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
        model.groups[group_id].rules.full_hit and hit_length % model.block_sizes[group_id]
        for group_id in model.dropping_group_ids
    )


def _window_beside_states_labels(model: ManagerModel, hit_length: int, copied: bool) -> list[str]:
    """The labels of a hit of ``hit_length`` tokens beside align-mode Mamba groups and local attention:
    any such hit; one with sub-block hits off where the states' blocks are larger than the hashes (a
    sliding-window or chunked-local group hashed finer than its blocks); one ending inside an R-SWA
    block, copied on write (``copied``)."""
    windows = [g for g, group in enumerate(model.groups) if group.rules.has_window]
    if not hit_length or not windows:
        return []
    labels = [STATE_HIT_BESIDE_WINDOW]
    finer_states = any(
        group.rules.aligned_states and model.block_sizes[g] > model.hash_size for g, group in enumerate(model.groups)
    )
    if finer_states and not model.partial_hits:
        labels.append(STATE_HIT_WITH_SUB_BLOCK_HITS_OFF)
    if copied and any(model.groups[g].rules.keeps_prompt and hit_length % model.block_sizes[g] for g in windows):
        labels.append(RSWA_HIT_INSIDE_BLOCK)
    return labels


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
            frees_behind_state(group.rules)
            or (group.rules.aligned_states and waiting and (request_id, group_id) not in model.mamba_allocated)
        )
    ]


def _fits_without_speculative_blocks(model: ManagerModel, refused: Operation, group_ids: list[int]) -> bool:
    """Whether a refused step is admitted when the Mamba groups ``group_ids`` reserve no speculative blocks."""
    groups = tuple(
        attrs.evolve(group, speculative_blocks=0) if group_id in group_ids else group
        for group_id, group in enumerate(model.config.groups)
    )
    return _fits_under(model, refused, attrs.evolve(model.config, groups=groups))


def _table_past_state(model: ManagerModel, rid: str) -> bool:
    """Whether an align-mode Mamba table of ``rid`` holds positions past the block of its computed tokens'
    state, besides its speculative blocks: the blocks of drafts a verifier rejected, where the allocator
    records the last state and the model runner saves the next one."""
    computed = model.requests[rid].num_computed_tokens
    return any(
        len(model.pool.holders.get((rid, g), ())) - group.speculative_blocks
        > -(-computed // model.config.group_block_size(g))
        for g, group in enumerate(model.groups)
        if group.rules.aligned_states
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


def _full_attention_of_two_specs(model: ManagerModel) -> bool:
    """Whether full-attention groups of two kinds (full attention and MLA's latent vectors) share the cache."""
    return len({group.kind for group in model.groups if group.rules.full_hit and not group.rules.has_window}) > 1


def _hit_cut_back(op: Operation, result: StepResult, before: BeforeStep) -> bool:
    """Whether a waiting request's schedule or asynchronous load cut the hit its lookup found back to a
    block boundary for the external tokens it loads (``truncate_computed_blocks``), whether or not the
    step fits: it adopted a hit other than the one found."""
    return (
        isinstance(op, Schedule | StartAsyncLoad)
        and op.num_external_tokens > 0
        and result.hit_length is not None
        and result.hit_length != before.found_hit_tokens
    )


def _hit_deferred(op: Operation, result: StepResult, model: ManagerModel) -> bool:
    """Whether a refused step's hit was a Mamba state entered in the same scheduler step (the request waits
    for the next).  Where the whole request must fit, that count refuses it first."""
    request = model.requests.get(getattr(op, "request_id", ""))
    return (
        result.admitted is False
        and result.hit_block_ids is not None
        and request is not None
        and not (model.config.reserve_full_sequence and request.waiting)
        and model.defers_hit(result.hit_block_ids)
    )


def _checkpoint_held_back(op: Schedule, result: StepResult, before: BeforeStep) -> bool:
    """Whether an admitted schedule's allocation held back a prefill checkpoint because its chunk does not
    end the prefill: asked of the model the step planned from, for the chunk it computed."""
    planning = before.planning
    if planning is None or result.num_slots is None:
        return False
    start = planning.requests[op.request_id].num_computed_tokens + (result.hit_length or 0)
    start += result.num_external_tokens
    end = result.num_slots - planning.config.num_lookahead_tokens
    return any(planning.holds_back_checkpoint(op.request_id, g, start, end) for g in aligned_group_ids(planning))


def _states_thinned(op: Operation, result: StepResult, before: BeforeStep, model: ManagerModel) -> bool:
    """Whether the step's caching left a live align-mode Mamba state uncached by a retention interval (not
    counting the blocks of a hit it took)."""
    if before.thinned_first:
        return True
    if before.marks is None:
        return False
    hit = None
    if isinstance(op, Schedule | StartAsyncLoad) and result.admitted and result.hit_length is not None:
        hit = (op.request_id, result.hit_length)
    return states_thinned_since(before.marks, model, hit)


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
    if isinstance(op, Schedule) and null_count(model, op, sliding) > before.sliding_nulls:
        labels.append(SLIDING_WINDOW_FREED)
    if null_count(model, op, keeps_prompt) > before.rswa_nulls:
        labels.append(RSWA_GAP_FREED)
    if null_count(model, op, frees_behind_state) > before.mamba_nulls:
        labels.append(MAMBA_STATE_FREED)
    speculative = _speculative_groups(model, op) if result.admitted is False else []
    if speculative and _fits_without_speculative_blocks(model, op, speculative):
        labels.append(MAMBA_SPECULATIVE_REFUSED)
    if isinstance(op, Schedule) and result.hit_length and _full_attention_of_two_specs(model):
        labels.append(HIT_ACROSS_MLA_AND_FULL)
    if isinstance(op, Schedule) and result.hit_length and model.config.mixed_block_sizes:
        labels.append(HIT_ACROSS_BLOCK_SIZES)
    if partial_entries(model) - before.partial_entries:
        labels.append(PARTIAL_ENTRY_CACHED)
    if isinstance(op, Schedule) and model.tracks_shared_prefix:
        if result.admitted and result.hit_length:
            labels.append(RETENTION_HIT)
        if result.hit_length is not None and model.requests[op.request_id].shared_prefix_boundary:
            labels.append(SHARED_PREFIX_RECORDED)
    if isinstance(op, Schedule) and result.admitted and result.hit_length and model.config.dcp_world_size > 1:
        labels.append(CONTEXT_PARALLEL_HIT)
    if (
        isinstance(op, Schedule)
        and model.aligned_mamba
        and _ends_inside_a_sharded_block(model, before.found_hit_tokens)
    ):
        # The lookup found it (the sub-block rule under DCP at work), whether or not the step fits.
        labels.append(STATE_HIT_INSIDE_SHARDED_BLOCK)
    if isinstance(op, Schedule) and result.admitted and model.aligned_mamba:
        if result.hit_length:
            labels.append(MAMBA_ALIGN_HIT)
        new_ids = result.new_block_ids or ()
        aligned = [new_ids[g] for g, group in enumerate(model.groups) if group.rules.aligned_states]
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
        if _checkpoint_held_back(op, result, before):
            labels.append(CHECKPOINT_HELD_FOR_PREFILL_END)
        if result.num_external_tokens:
            labels.append(EXTERNAL_BESIDE_STATES)
        labels.extend(_window_beside_states_labels(model, result.hit_length or 0, bool(result.block_copies)))
    if _states_thinned(op, result, before, model):
        labels.append(STATE_THINNED_BY_RETENTION)
    if before.junction_first or (before.marks is not None and junction_state_cached_since(before.marks, model)):
        labels.append(SHARED_PREFIX_STATE_CACHED)
    if _hit_deferred(op, result, model):
        labels.append(STATE_HIT_DEFERRED)
    if _hit_cut_back(op, result, before):
        # The hit is cut back (``truncate_computed_blocks``) before the allocation, whether or not it fits.
        labels.append(SUB_BLOCK_HIT_CUT_BACK)
    if result.block_copies:
        labels.append(SUB_BLOCK_HIT_COPIED if result.hit_length else STATE_COPIED_FOR_CACHE)
    labels.extend(_offload_labels(op, result))
    if result.zeroed_block_ids and not any(group.rules.holds_state for group in model.groups):
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
        and any(group.rules.encoder_blocks for group in model.groups)
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
