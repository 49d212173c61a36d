"""The KV-cache manager, as lists and dicts: tables per request and group over one pool model.

Each operation is stated here in terms of the concerns in :mod:`kvmodel.manager`.
"""

from __future__ import annotations

import attrs

from kvmodel.manager.allocation import Allocation
from kvmodel.manager.caching import PrefixCaching
from kvmodel.manager.lookup import PrefixLookup
from kvmodel.manager.request import RequestModel
from kvmodel.manager.state import skipped_tokens
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
    StepResult,
)
from kvmodel.step_plans import ends_short_of_its_state, plan_async_load, plan_step

__all__ = ["ManagerModel", "RequestModel", "skipped_tokens"]


class ManagerModel(PrefixLookup, PrefixCaching, Allocation):
    """What a KV-cache manager must do with each operation, stated directly.

    A request's table in group ``g`` is the pool holder ``(request_id, g)``.
    Prefix-cache keys are the token prefixes themselves, so two blocks share
    a key exactly when their whole prefixes are equal.
    """

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
        if request.loading:
            return StepResult()
        if self.pipeline.full():
            self._process_output()
        waiting = not request.running
        if waiting and self.pipeline.holds_stale_output(rid):
            return StepResult()  # not admitted again until its output from before the preemption is processed
        placeholders = self.pipeline.num_placeholders(rid)
        if not waiting and request.num_computed_tokens >= len(request.tokens) + placeholders:
            return StepResult()
        if not op.same_step:
            self.cached_this_step.clear()  # a new scheduler step starts
        hit_length = 0
        hit_ids: GroupIds = tuple(() for _ in range(num_groups))
        if waiting and self.config.enable_caching:
            hit_length, hit_ids, request.shared_prefix_boundary = self.lookup_prefix(rid)
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
        if self.pipeline.scheduled(request, amounts.num_new_tokens, op.sampled_token):
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

    def _start_async_load(self, op: StartAsyncLoad) -> StepResult:
        """A waiting request's hit and external tokens get blocks, as :meth:`_schedule` gives them, with no
        new tokens and no lookahead; nothing is cached until the load finishes."""
        rid = op.request_id
        request = self.requests[rid]
        if request.running or request.loading or self.pipeline.holds_stale_output(rid):
            return StepResult()
        self.cached_this_step.clear()  # a new scheduler step starts
        num_groups = len(self.groups)
        hit_length = 0
        hit_ids: GroupIds = tuple(() for _ in range(num_groups))
        if self.config.enable_caching:
            hit_length, hit_ids, request.shared_prefix_boundary = self.lookup_prefix(rid)
        adopted, external = plan_async_load(op, self.config, len(request.tokens), hit_length)
        if external <= 0:
            return StepResult()
        if adopted != hit_length:
            hit_length, hit_ids = adopted, self.truncate_hit(hit_ids, adopted)
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
        """The oldest step's output: the deferred frees it fences are released (last block first), its
        sampled token appended, and the request's processed blocks cached."""
        output = self.pipeline.process_oldest(self.requests)
        if output is None:
            return
        for holder in output.frees:
            self.pool.release(reversed(self.pool.holders.pop(holder)))
        if output.request is None or output.token is None:
            return
        output.request.tokens.append(output.token)
        if output.cache_up_to is not None and self.config.enable_caching:
            self._cache_full_blocks(output.request.request_id, output.cache_up_to)

    def _preempt(self, rid: str) -> None:
        self._release(rid, finished=False)
        request = self.requests[rid]
        request.num_computed_tokens = 0
        request.state_tokens = None
        request.running = False
        request.loading = False
        request.waiting = True
