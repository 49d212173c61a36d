"""The named invariants every step must keep.

Each invariant is a function of a :class:`StepCheck`: the step's operation,
what the target and the model returned, and both observations.  It raises
:class:`InvariantViolation` naming itself, the step, the block or request,
and expected against actual.  ``ALL_INVARIANTS`` lists them in checking
order: the target's own consistency first, then its agreement with the model.

The invariants live by concern: the pool (:mod:`.pool`), the prefix cache (:mod:`.prefix_cache`),
each group kind's tables (:mod:`.group_tables`), what a step hands the worker (:mod:`.steps`) and the
target against the model (:mod:`.against_model`).
"""

from __future__ import annotations

from kvmodel.config import TargetConfig
from kvmodel.invariants.against_model import (
    admission_matches_model,
    cache_matches_model,
    events_match_model,
    same_block_copies,
    same_state_offloads,
    same_zeroed_blocks,
    tables_match_model,
)
from kvmodel.invariants.check import EventReplay, Invariant, InvariantViolation, StepCheck, fail
from kvmodel.invariants.group_tables import (
    cross_attention_holds_encoder_blocks,
    mamba_align_keeps_few_states,
    mamba_keeps_a_state_tail,
    ring_holds_one_block,
    rswa_keeps_the_prompt,
    scheduled_slots_have_blocks,
)
from kvmodel.invariants.pool import (
    failed_allocation_changes_nothing,
    free_queue_well_formed,
    lifo_head_reuse_when_caching_off,
    lru_eviction_when_caching_on,
    no_duplicate_block_ids,
    ref_cnt_matches_holders,
    reset_refused_only_while_held,
)
from kvmodel.invariants.prefix_cache import (
    cache_map_consistent,
    cached_tokens_probe_changes_nothing,
    events_match_cache,
    hit_block_never_written,
    hit_is_sound_and_maximal,
)
from kvmodel.invariants.steps import (
    block_copies_well_formed,
    in_flight_blocks_held,
    state_offloads_well_formed,
    zeroed_blocks_are_fresh,
)
from kvmodel.observation import Observation
from kvmodel.ops import Operation, StepResult

ALL_INVARIANTS: tuple[Invariant, ...] = (
    no_duplicate_block_ids,
    ref_cnt_matches_holders,
    free_queue_well_formed,
    cache_map_consistent,
    events_match_cache,
    scheduled_slots_have_blocks,
    ring_holds_one_block,
    cross_attention_holds_encoder_blocks,
    rswa_keeps_the_prompt,
    mamba_keeps_a_state_tail,
    mamba_align_keeps_few_states,
    in_flight_blocks_held,
    hit_block_never_written,
    block_copies_well_formed,
    admission_matches_model,
    hit_is_sound_and_maximal,
    cached_tokens_probe_changes_nothing,
    failed_allocation_changes_nothing,
    zeroed_blocks_are_fresh,
    lifo_head_reuse_when_caching_off,
    lru_eviction_when_caching_on,
    tables_match_model,
    cache_matches_model,
    reset_refused_only_while_held,
    events_match_model,
    state_offloads_well_formed,
)


NOT_OBSERVED = Observation((), (), 0, {}, {}, frozenset(), {})
"""The observation of a step whose state is not looked at (see :func:`check_results`)."""


def check_results(
    step: int, op: Operation, config: TargetConfig, sut_result: StepResult, model_result: StepResult
) -> None:
    """The invariants, or their parts, that need only what a step returned, no observation: the
    admission, the hit, the newly allocated blocks (in the reuse-order invariant of the caching mode)
    and the reset's outcome.  The steps between two full checks (:class:`kvcheck.lockstep.Lockstep`
    with ``full_check_every``) run these."""
    check = StepCheck(step, op, config, sut_result, model_result, NOT_OBSERVED, NOT_OBSERVED)
    admission_matches_model(check)
    hit_is_sound_and_maximal(check)
    same_zeroed_blocks(check)
    same_block_copies(check)
    if sut_result.new_block_ids != model_result.new_block_ids:
        invariant = "lru_eviction_when_caching_on" if config.enable_caching else "lifo_head_reuse_when_caching_off"
        fail(check, invariant, "newly allocated blocks differ", model_result.new_block_ids, sut_result.new_block_ids)
    reset_refused_only_while_held(check)
    same_state_offloads(check)
    cached_tokens_probe_changes_nothing(check)


def check_all(check: StepCheck) -> None:
    """Run every invariant in order; the first violation is raised."""
    for invariant in ALL_INVARIANTS:
        invariant(check)


__all__ = [
    "ALL_INVARIANTS",
    "NOT_OBSERVED",
    "EventReplay",
    "Invariant",
    "InvariantViolation",
    "StepCheck",
    "admission_matches_model",
    "block_copies_well_formed",
    "cache_map_consistent",
    "cache_matches_model",
    "cached_tokens_probe_changes_nothing",
    "check_all",
    "check_results",
    "cross_attention_holds_encoder_blocks",
    "events_match_cache",
    "events_match_model",
    "failed_allocation_changes_nothing",
    "free_queue_well_formed",
    "hit_block_never_written",
    "hit_is_sound_and_maximal",
    "in_flight_blocks_held",
    "lifo_head_reuse_when_caching_off",
    "lru_eviction_when_caching_on",
    "mamba_align_keeps_few_states",
    "mamba_keeps_a_state_tail",
    "no_duplicate_block_ids",
    "ref_cnt_matches_holders",
    "reset_refused_only_while_held",
    "ring_holds_one_block",
    "rswa_keeps_the_prompt",
    "scheduled_slots_have_blocks",
    "state_offloads_well_formed",
    "tables_match_model",
    "zeroed_blocks_are_fresh",
]
