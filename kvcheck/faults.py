"""The fault catalogue: realistic allocator bugs, planted into a kvcore manager from outside.

A fault patches one instance of :class:`kvcore.KVCacheManager` (its pool,
coordinator or managers) right after construction; kvcore itself carries no
switch for it.  Each fault is a bug an allocator engineer could plausibly
write; together they prove the suite catches the classes of bug it exists
for (the kill matrix).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

import kvcore
from kvcheck import fault_plants as plants
from kvcheck.targets.kvcore_target import KvcoreTarget
from kvmodel.config import TargetConfig


@attrs.frozen
class Fault:
    """A named bug: ``plant`` rewires one manager instance to carry it."""

    name: str
    description: str
    plant: Callable[[kvcore.KVCacheManager], None]

    def make_manager(self, config: kvcore.KVCacheConfig) -> kvcore.KVCacheManager:
        manager = kvcore.KVCacheManager(config)
        self.plant(manager)
        return manager

    def kvcore_target(self, config: TargetConfig) -> KvcoreTarget:
        """A kvcore target whose manager carries this fault."""
        return KvcoreTarget(config, manager_factory=self.make_manager)


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault(
            "fifo-reuse-when-caching-off",
            "free_blocks routes freed blocks by `hash is None and caching_on`: with caching off, reuse turns FIFO",
            plants.plant_fifo_reuse_when_caching_off,
        ),
        Fault(
            "interleaved-external-alloc",
            "each group allocates for external tokens before the next group touches its hit (cross-group double "
            "allocation)",
            plants.plant_interleaved_external_alloc,
        ),
        Fault(
            "touch-leaves-free-block-queued",
            "touch raises a free hit block's ref_cnt but leaves it in the free queue, so it can be handed out again",
            plants.plant_touch_leaves_free_block_queued,
        ),
        Fault(
            "free-table-head-first",
            "free_table frees a request's blocks in position order: its head (shared prefix) is evicted first",
            plants.plant_free_table_head_first,
        ),
        Fault(
            "reset-discounts-null-block-twice",
            "reset_prefix_cache discounts the null block twice and empties the cache under one held block",
            plants.plant_reset_discounts_null_block_twice,
        ),
        Fault(
            "reused-block-leaves-map-entry",
            "allocating a cached free block clears its hash but leaves its prefix-cache map entry behind",
            plants.plant_reused_block_leaves_map_entry,
        ),
        Fault(
            "evict-skips-held-blocks",
            "evict_blocks drops only free blocks' cache entries: a held block whose load failed stays hittable",
            plants.plant_evict_skips_held_blocks,
        ),
        Fault(
            "full-hit-rounds-up",
            "the full-attention hit scan is bounded with ceil_div, not floor: a hit can pass the num_tokens - 1 cap",
            plants.plant_full_hit_rounds_up,
        ),
        Fault(
            "sliding-window-skip-off-by-one",
            "the sliding window skips n - W tokens, not n - W + 1: a block outside the window is kept or allocated",
            plants.plant_sliding_window_skip_off_by_one,
        ),
        Fault(
            "chunked-local-skip-uses-last-token",
            "chunked local attention skips up to the chunk of token n - 1, not n: a finished chunk's blocks are kept",
            plants.plant_chunked_local_skip_uses_last_token,
        ),
        Fault(
            "hybrid-hit-takes-max",
            "the hybrid coordinator combines the groups' hit lengths with max instead of min",
            plants.plant_hybrid_hit_takes_max,
        ),
        Fault(
            "eagle-window-without-extra-block",
            "with an EAGLE drafter, the sliding-window hit drops its last block without having matched the extra "
            "block the drop needs: the hit's window starts at an unmatched block",
            plants.plant_eagle_window_without_extra_block,
        ),
        Fault(
            "admission-ignores-lookahead",
            "allocate_slots sizes admission for the tokens a step computes, leaving out the drafter's lookahead "
            "slots it then allocates: a step is admitted that cannot be allocated",
            plants.plant_admission_ignores_lookahead,
        ),
        Fault(
            "spec-output-caches-one-token-short",
            "cache_blocks after a speculative step's output stops one token short: the block the accepted "
            "drafts completed is not published until the next step",
            plants.plant_spec_output_caches_one_token_short,
        ),
        Fault(
            "reprefillable-tokens-cached",
            "cache_blocks takes every computed token as final: the block holding the last tokens a multi-module "
            "drafter may prefill again is published",
            plants.plant_reprefillable_tokens_cached,
        ),
        Fault(
            "window-slides-on-scheduled-tokens",
            "allocate_slots releases local-attention (sliding-window, chunked) blocks on the scheduled token "
            "count, not the processed one: a block a step still in flight reads goes back to the pool",
            plants.plant_window_slides_on_scheduled_tokens,
        ),
        Fault(
            "deferred-free-in-eviction-order",
            "pop_blocks_for_free returns the blocks tail first, as free passes them; the deferred free "
            "reverses them again and evicts the shared prefix first",
            plants.plant_deferred_free_in_eviction_order,
        ),
        Fault(
            "delayed-load-cached-at-allocation",
            "allocate_slots ignores delay_cache_blocks: an asynchronous load's blocks are cached, and hittable, "
            "before the load lands",
            plants.plant_delayed_load_cached_at_allocation,
        ),
        Fault(
            "window-admission-cap-one-block-short",
            "the sliding-window admission cap of the whole-request gate leaves out the block a window may "
            "straddle: a request is admitted whose window does not fit",
            plants.plant_window_admission_cap_one_block_short,
        ),
        Fault(
            "hit-taken-before-admission",
            "the local hit is touched before the admission check, so a refused allocation keeps the hit blocks",
            plants.plant_hit_taken_before_admission,
        ),
        Fault(
            "evicted-block-removal-unreported",
            "get_new_blocks drops a reused cached block's entry directly, not through the eviction path: no "
            "BlockRemoved is queued",
            plants.plant_evicted_block_removal_unreported,
        ),
        Fault(
            "stored-event-repeats-cached-blocks",
            "a caching call's BlockStored lists every full block from position 0 (parent None), not only the "
            "blocks it newly cached: blocks cached before are reported stored twice",
            plants.plant_stored_event_repeats_cached_blocks,
        ),
        Fault(
            "reset-unreported",
            "reset_prefix_cache empties the prefix cache but queues no AllBlocksCleared",
            plants.plant_reset_unreported,
        ),
        Fault(
            "rswa-gap-starts-inside-the-prompt",
            "R-SWA's gap starts at the block holding the prompt's last token (rounded down): a prompt ending "
            "inside a block loses that block",
            plants.plant_rswa_gap_starts_inside_the_prompt,
        ),
        Fault(
            "ring-grows-like-full-attention",
            "the ring buffer's manager grows like full attention (a block per block of tokens) while admission "
            "counts one block",
            plants.plant_ring_grows_like_full_attention,
        ),
        Fault(
            "cross-attention-counted-by-decoder-tokens",
            "admission counts cross-attention's blocks for the decoder's tokens, not the encoder's",
            plants.plant_cross_attention_counted_by_decoder_tokens,
        ),
        Fault(
            "mamba-frees-the-last-state",
            "a Mamba group counts every computed token as skipped (not all but the last): the block holding the "
            "state the next token reads is freed",
            plants.plant_mamba_frees_the_last_state,
        ),
        Fault(
            "mamba-speculative-blocks-not-counted",
            "admission counts a Mamba group's blocks for the slots only, while allocation reserves its speculative "
            "blocks too",
            plants.plant_mamba_speculative_blocks_not_counted,
        ),
        Fault(
            "mla-looked-up-with-full-attention",
            "MLA's spec compares equal to full attention's: MLA layers are looked up with a drafter's "
            "full-attention layers and drop a block from their hits too",
            plants.plant_mla_looked_up_with_full_attention,
        ),
        Fault(
            "sliding-window-mla-managed-as-mla",
            "sliding-window MLA is given MLA's manager (full attention's): its blocks never leave the window "
            "and its hits need every block",
            plants.plant_sliding_window_mla_managed_as_mla,
        ),
        Fault(
            "hits-aligned-to-the-hash-size",
            "a hybrid cache of mixed block sizes without sub-block hits aligns hits to the hash size, not the "
            "scheduler block size: a hit ends inside a larger group's shared block, longer than it may be",
            plants.plant_hits_aligned_to_the_hash_size,
        ),
        Fault(
            "partial-key-outlives-eviction",
            "evicting a block drops its own key but leaves the partial key of a prompt boundary inside it in the "
            "prefix cache, pointing at a block that now holds other tokens",
            plants.plant_partial_key_outlives_eviction,
        ),
        Fault(
            "sliding-window-caches-unreachable-blocks",
            "a sliding window whose hits land on boundaries several blocks apart caches every full block, not "
            "only the window's before each boundary",
            plants.plant_sliding_window_caches_unreachable_blocks,
        ),
        Fault(
            "retention-drops-the-replay-boundary",
            "under a retention interval a sliding window keeps the blocks before each interval's end but not "
            "those before the prompt's replay boundary: a resend of the prompt falls back to an interval's end",
            plants.plant_retention_drops_the_replay_boundary,
        ),
        Fault(
            "shared-prefix-boundary-dropped",
            "the scheduler keeps a lookup's hit but drops the shared prefix it found past the hit: under a "
            "retention interval no window keeps that prefix's end, so requests sharing it keep missing",
            plants.plant_shared_prefix_boundary_dropped,
        ),
        Fault(
            "replicated-group-sharded",
            "under decode context parallelism a draft model's replicated group gets the sharded groups' block "
            "size (the world size passed in, not the group's own): its table holds a block per world-size blocks "
            "of slots",
            plants.plant_replicated_group_sharded,
        ),
        Fault(
            "window-frees-by-rank-blocks",
            "under decode context parallelism a window counts its skipped tokens in the spec's blocks on one rank, "
            "not the manager's larger blocks: blocks still inside the window are freed",
            plants.plant_window_frees_by_rank_blocks,
        ),
        Fault(
            "mamba-state-search-stops-at-first-miss",
            "an align-mode Mamba group looks its states up left to right, as full attention does, and stops at "
            "the first one not cached: the positions before a chunk's end hold no state, so hits are missed",
            plants.plant_mamba_state_search_stops_at_first_miss,
        ),
        Fault(
            "mamba-align-counts-the-padding",
            "admission counts an align-mode Mamba group a block for every position up to the last slot, null "
            "padding included, where one block is taken: steps that fit are refused",
            plants.plant_mamba_align_counts_the_padding,
        ),
        Fault(
            "mamba-align-speculative-blocks-not-counted",
            "admission caps an align-mode Mamba group's new blocks at one on a request's first allocation too, as "
            "for a request that allocated before: its speculative blocks are left out while the allocation takes them",
            plants.plant_mamba_align_speculative_blocks_not_counted,
        ),
        Fault(
            "mamba-align-allocates-lookahead-slots",
            "an align-mode Mamba group's table grows to every slot of the step, the drafter's lookahead included "
            "(a drafter has no Mamba layers): its new state block lands past the step's last token, whose state "
            "the model runner saves in the null padding",
            plants.plant_mamba_align_allocates_lookahead_slots,
        ),
        Fault(
            "partial-hit-not-copied",
            "a hit ending inside a block is not recorded for its copy on write: the request's table keeps the "
            "block the prefix cache shares, and the request writes its next tokens into it",
            plants.plant_partial_hit_not_copied,
        ),
        Fault(
            "copy-block-not-counted",
            "admission does not count the block a copy on write takes (a hit ending inside a block, or a state "
            "cached inside the block its request goes on writing): a step that does not fit is admitted",
            plants.plant_copy_block_not_counted,
        ),
        Fault(
            "state-entry-left-on-written-block",
            "an align-mode Mamba state a request cached inside the block it goes on writing is copied, but its "
            "cache entry stays on that block: a later hit reads a state overwritten since",
            plants.plant_state_entry_left_on_written_block,
        ),
        Fault(
            "checkpoint-block-left-null",
            "an align-mode Mamba allocation pads a prefill checkpoint's position with the null block, as any "
            "position a chunk skips: the backend exports the checkpoint into the null block, and the block "
            "admission counted for it is never taken",
            plants.plant_checkpoint_block_left_null,
        ),
        Fault(
            "transient-checkpoint-keeps-its-key",
            "a transient prefill checkpoint (inside a block, neither the prompt's nor a shared prefix's end) "
            "keeps the full-block key its position was cached under: a later hit on that block boundary reads "
            "the state of another boundary",
            plants.plant_transient_checkpoint_keeps_its_key,
        ),
        Fault(
            "retention-caches-every-state",
            "an align-mode Mamba group under a retention interval caches every state it computes, as with no "
            "interval: the prefix cache fills with states the interval thins out, evicting those kept for hits",
            plants.plant_retention_caches_every_state,
        ),
        Fault(
            "checkpoint-before-the-prefill-end",
            "under a retention interval of 0 the coordinator does not pass the prefill's end to align-mode Mamba "
            "groups: every prefill chunk reserves a checkpoint block, not only the one ending the prefill",
            plants.plant_checkpoint_before_the_prefill_end,
        ),
        Fault(
            "checkpoint-ignores-the-eagle-drop",
            "beside an EAGLE drafter an align-mode Mamba group keeps its prefill checkpoints and its prompt's "
            "reusable state short of the last token, not a hit boundary lower: the attention groups' hits, "
            "one block shorter after the drop, find no state there",
            plants.plant_checkpoint_ignores_the_eagle_drop,
        ),
        Fault(
            "eagle-drops-a-block-inside-sub-block-hits",
            "with sub-block hits, full attention's lookup for an EAGLE drafter drops a whole block of its hit, "
            "not one hash block: hits come out a block short and the drafter recomputes cached tokens",
            plants.plant_eagle_drops_a_block_inside_sub_block_hits,
        ),
        Fault(
            "shared-prefix-state-left-uncached",
            "with shared-prefix checkpoints in force the Mamba groups never learn of them: the scheduler ends a "
            "prefill chunk at the end of a prefix a lookup found shared, and no state is cached there for the "
            "sibling requests that would resume from it",
            plants.plant_shared_prefix_state_left_uncached,
        ),
        Fault(
            "rswa-hits-stop-at-whole-blocks",
            "R-SWA's lookup probes whole blocks only, as a sliding window's does, though sub-block hits count "
            "on it: beside Mamba states cached inside its blocks every hit ends on an R-SWA block boundary, and "
            "the tokens up to the state are computed again",
            plants.plant_rswa_hits_stop_at_whole_blocks,
        ),
        Fault(
            "sub-block-hits-beside-a-window-hashed-finer",
            "sub-block hits are turned on whenever Mamba states are in blocks larger than the hashes, never "
            "asking whether a sliding-window or chunked-local group hashed finer than its blocks can stop a "
            "lookup inside one: the window is asked for hits its lookup cannot give",
            plants.plant_sub_block_hits_beside_a_window_hashed_finer,
        ),
        Fault(
            "sub-block-hits-off-under-dcp-at-equal-sizes",
            "sub-block hits are asked for by the one-rank rule under decode context parallelism too (Mamba "
            "states in blocks larger than the hashes): with states at the hash size, hits stop at the sharded "
            "full-attention blocks, dcp_world_size times larger, and the tokens past them are computed again",
            plants.plant_sub_block_hits_off_under_dcp_at_equal_sizes,
        ),
        Fault(
            "state-hit-in-the-step-that-caches-it",
            "an align-mode Mamba group forgets which states it cached in the current scheduler step: a request "
            "scheduled in the same step hits a state whose forward pass has not run yet, and reads garbage",
            plants.plant_state_hit_in_the_step_that_caches_it,
        ),
        Fault(
            "zeroing-record-not-drained",
            "the blocks recorded for the worker to zero are handed over but the record is not emptied: every "
            "later step zeroes earlier steps' blocks again, wiping computed tokens and cached prefixes",
            plants.plant_zeroing_record_not_drained,
        ),
        Fault(
            "hit-blocks-zeroed",
            "a prefix hit's blocks are recorded for zeroing as they enter the request's table, like new "
            "blocks: the worker wipes the cached tokens the request is about to read",
            plants.plant_hit_blocks_zeroed,
        ),
        Fault(
            "async-load-blocks-zeroed",
            "the blocks of an asynchronous external load are recorded for zeroing (skip_zeroing_group_ids "
            "ignored): the worker's zeroing races the load that writes them",
            plants.plant_async_load_blocks_zeroed,
        ),
        Fault(
            "truncated-hit-keeps-its-state",
            "a sub-block hit cut back to a block boundary for a connector's load keeps its align-mode Mamba "
            "state: the state the hit ended on stays in the request's table past the endpoint, and the load's "
            "state is written into that block, cached under the shorter prefix a later hit reads",
            plants.plant_truncated_hit_keeps_its_state,
        ),
        Fault(
            "state-offered-from-its-written-block",
            "the hand-off of a state a request cached inside the align-mode Mamba block it goes on writing "
            "offers a KV connector that block instead of the copy the next allocation makes of it: the "
            "connector offloads, under the state's boundary, whatever the next step writes there",
            plants.plant_state_offered_from_its_written_block,
        ),
        Fault(
            "finished-tail-offered-after-later-tokens",
            "a finishing request's state cached inside the align-mode Mamba block it was writing is offered "
            "a KV connector though later tokens (computed, or in flight) reached that block: the connector "
            "offloads, under the state's boundary, the state of a later token",
            plants.plant_finished_tail_offered_after_later_tokens,
        ),
    )
}


def get_fault(name: str) -> Fault:
    try:
        return FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(sorted(FAULTS))}") from None
