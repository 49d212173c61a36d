"""What every target shares: turning operations into the calls vLLM's scheduler makes.

An adapter subclasses :class:`SchedulerDrivenTarget` and supplies the
allocator-specific hooks (make a request, look up its hit, allocate slots,
free, evict, reset, read its table: :mod:`kvcheck.targets.allocator_hooks`);
the request lifecycle is written once, so two targets can only differ in
their allocators.  This module schedules one operation; the requests'
bookkeeping is :mod:`kvcheck.targets.scheduler_state`, the target's side of
its steps in flight :mod:`kvcheck.targets.in_flight`, and what it reports
beside the allocator's state :mod:`kvcheck.targets.observed_state`.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvcheck.targets.allocator_hooks import block_ids
from kvcheck.targets.in_flight import InFlightSteps
from kvcheck.targets.observed_state import ObservedState
from kvmodel.observation import Observation
from kvmodel.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    FinishAsyncLoad,
    Operation,
    Preempt,
    ProcessOutput,
    ResetPrefixCache,
    Schedule,
    SpecDecode,
    StartAsyncLoad,
    StepResult,
    flat_state_offloads,
)
from kvmodel.step_plans import ends_short_of_its_state, plan_async_load, plan_step

__all__ = ["SchedulerDrivenTarget", "block_ids"]


class SchedulerDrivenTarget(InFlightSteps, ObservedState):
    """The request lifecycle of a scheduler, over allocator-specific hooks.

    A waiting request takes its local hit, then up to the operation's external
    tokens, then computes a chunk; admission makes it running; the step then
    advances ``num_computed_tokens`` and appends the sampled token once the
    last token is computed.  Preemption frees the request and resets it to
    recompute from token 0; a failed external load first drops the request's
    blocks from the prefix cache.  An asynchronous external load allocates
    with ``delay_cache_blocks`` and caches when it lands.  Under async
    scheduling steps go in flight (:mod:`kvcheck.targets.pipeline`).
    """

    def _probe(self, request: Any) -> tuple[int, tuple[str, ...]]:
        """The probe's answer for a waiting request, and the observed fields it changed."""
        before = self.observe()
        probed = self._get_num_cached_tokens(request)
        after = self.observe()
        changed = tuple(
            field.name
            for field in attrs.fields(Observation)
            if getattr(before, field.name) != getattr(after, field.name)
        )
        return probed, changed

    def _admission_gates(self, request_id: str, waiting: bool) -> dict[str, Any]:
        """The ``allocate_slots`` keywords vLLM's scheduler adds when it admits a waiting request (new,
        preempted, or back from an asynchronous load): none for a running one."""
        if not waiting:
            return {}
        encoder = {"num_encoder_tokens": self.config.num_encoder_tokens} if self.config.num_encoder_tokens else {}
        return {
            **encoder,
            "full_sequence_must_fit": self.config.reserve_full_sequence,
            "reserved_blocks": self.config.reserved_blocks,
            "has_scheduled_reqs": any(other != request_id for other in self.running),
        }

    # -- operations -----------------------------------------------------------

    def apply(self, op: Operation) -> StepResult:
        result = self._apply(op)
        # As vLLM's scheduler drains the record every step, and hands it to the worker only when the
        # cache needs zeroing.
        zeroed = self._take_new_block_ids()
        if zeroed and self.config.needs_zeroing:
            result = attrs.evolve(result, zeroed_block_ids=tuple(zeroed))
        # As vLLM's scheduler drains them every step, whether or not a connector takes them.
        offloads = flat_state_offloads(self._take_state_offloads())
        if offloads:
            result = attrs.evolve(result, state_offloads=result.state_offloads + offloads)
        if self.config.enable_kv_cache_events:
            # As vLLM's scheduler publishes them: every event of the step, once it is done.
            self._record_events()
        return result

    def _apply(self, op: Operation) -> StepResult:
        if isinstance(op, AddRequest):
            self._add_request(op.request_id, op.prompt)
            return StepResult()
        if isinstance(op, Schedule):
            return self._schedule(op)
        if isinstance(op, SpecDecode):
            return self._spec_decode(op)
        if isinstance(op, ProcessOutput):
            self._process_output()
            return StepResult()
        if isinstance(op, StartAsyncLoad):
            return self._start_async_load(op)
        if isinstance(op, FinishAsyncLoad):
            if op.request_id in self.loading:
                request = self.requests[op.request_id]
                self.loading.discard(op.request_id)
                self.running.add(op.request_id)
                self._cache_blocks(request, request.num_computed_tokens)
            return StepResult()
        if isinstance(op, Finish):
            return self._finish(op.request_id)
        if isinstance(op, FailedLoad):
            self._evict({block_id for table in self._table(op.request_id) for block_id in table if block_id})
            self._preempt(op.request_id)
            return StepResult()
        if isinstance(op, Preempt):
            self._preempt(op.request_id)
            return StepResult()
        if isinstance(op, EvictBlocks):
            self._evict(set(op.block_ids))
            return StepResult()
        if isinstance(op, ResetPrefixCache):
            return StepResult(reset_done=self._reset_prefix_cache())
        raise TypeError(f"unknown operation {op!r}")

    def _schedule(self, op: Schedule) -> StepResult:
        rid = op.request_id
        request = self.requests[rid]
        if rid in self.loading:
            return StepResult()
        if self.pipeline.full():
            self._process_output()
        waiting = rid not in self.running
        if waiting and self.pipeline.holds_stale_output(rid):
            return StepResult()  # skipped in the waiting queue while its stale output is in flight
        placeholders = self.pipeline.num_placeholders(rid)
        if not waiting and request.num_computed_tokens >= request.num_tokens + placeholders:
            return StepResult()  # every token a running request has, or will sample, is computed already
        if not op.same_step:
            self._new_step_starts()
        probe: tuple[int | None, tuple[str, ...]] = (None, ())
        if waiting and self.pipeline.probes_before_lookup:
            probe = self._probe(request)
        hit: tuple[Any, int] | None = self._get_computed_blocks(request) if waiting else None
        amounts = plan_step(
            op,
            self.config,
            request.num_tokens,
            request.num_computed_tokens,
            request.num_prompt_tokens,
            request.shared_prefix_boundary,
            hit[1] if hit else None,
            placeholders,
        )
        if not waiting and ends_short_of_its_state(
            self.config, self._state_tokens.get(rid), request.num_computed_tokens + amounts.num_new_tokens
        ):
            return StepResult()
        if hit is not None and amounts.hit_length is not None:
            hit = self._adopted_hit(hit, amounts.hit_length)
        hit_length = hit[1] if hit is not None else 0
        lookahead = self.config.num_lookahead_tokens
        new_blocks = self._allocate_slots(request, amounts.num_new_tokens, hit, amounts.num_external_tokens, lookahead)
        hit_ids = self._block_ids(hit[0]) if hit is not None else None
        result_hit_length = hit_length if waiting else None
        if new_blocks is None:
            return StepResult(
                admitted=False,
                hit_length=result_hit_length,
                hit_block_ids=hit_ids,
                probed_tokens=probe[0],
                probe_changed=probe[1],
            )
        self.running.add(rid)
        self._on_admitted(request)
        request.num_computed_tokens += hit_length + amounts.num_external_tokens
        reads = self._reads(request, request.num_computed_tokens, amounts.num_new_tokens)
        request.num_computed_tokens += amounts.num_new_tokens
        self._state_tokens[rid] = request.num_computed_tokens
        num_slots = request.num_computed_tokens + lookahead
        if self.pipeline.scheduled(request, rid, amounts.num_new_tokens, request.num_tokens, op.sampled_token, reads):
            request.append_output_token_ids(op.sampled_token)
            self._learn_hashes(rid)
            if self.pipeline.caches_sync_output:
                self._cache_blocks(request, request.num_computed_tokens)
        return StepResult(
            admitted=True,
            hit_length=result_hit_length,
            hit_block_ids=hit_ids,
            new_block_ids=self._block_ids(new_blocks),
            num_external_tokens=amounts.num_external_tokens,
            num_slots=num_slots,
            block_copies=self._release_copies(),
            probed_tokens=probe[0],
            probe_changed=probe[1],
        )

    def _spec_decode(self, op: SpecDecode) -> StepResult:
        """Schedule the last token and the drafts, then roll back the rejected drafts and append the
        accepted ones and a bonus token, as vLLM's scheduler does with the verifier's output."""
        request = self.requests[op.request_id]
        if op.request_id not in self.running or request.num_computed_tokens != request.num_tokens - 1:
            return StepResult()
        if self.pipeline.steps:
            return StepResult()  # a speculative step is scheduled and processed at once: only with none in flight
        if not self.config.runs_spec_decode:
            return StepResult()
        end = request.num_computed_tokens + 1 + op.num_draft_tokens
        if ends_short_of_its_state(self.config, self._state_tokens.get(op.request_id), end):
            return StepResult()
        self._new_step_starts()
        num_drafts = op.num_draft_tokens
        num_accepted = min(op.num_accepted_tokens, num_drafts)
        new_blocks = self._allocate_slots(request, 1 + num_drafts, None, 0, self.config.num_lookahead_tokens)
        if new_blocks is None:
            return StepResult(admitted=False)
        self._on_admitted(request)
        copies = self._release_copies()  # at scheduling, before the verifier's output
        self._draft_tokens[op.request_id] = max(self._draft_tokens.get(op.request_id, 0), num_drafts)
        request.num_computed_tokens += 1 + num_drafts
        self._state_tokens[op.request_id] = request.num_computed_tokens
        num_slots = request.num_computed_tokens + self.config.num_lookahead_tokens
        request.num_computed_tokens -= num_drafts - num_accepted
        request.append_output_token_ids([op.sampled_token] * (num_accepted + 1))
        self._learn_hashes(op.request_id)
        self._cache_blocks(request, request.num_computed_tokens)
        return StepResult(
            admitted=True,
            new_block_ids=self._block_ids(new_blocks),
            num_slots=num_slots,
            block_copies=copies,
        )

    def _start_async_load(self, op: StartAsyncLoad) -> StepResult:
        """The hit and the external tokens, allocated with ``delay_cache_blocks`` and no lookahead, as
        vLLM's scheduler allocates for a load that lands asynchronously; nothing is computed."""
        rid = op.request_id
        request = self.requests[rid]
        if rid in self.running or rid in self.loading or self.pipeline.holds_stale_output(rid):
            return StepResult()
        self._new_step_starts()
        hit = self._get_computed_blocks(request)
        hit_length, external = plan_async_load(op, self.config, request.num_tokens, hit[1])
        if external <= 0:
            return StepResult()
        hit = self._adopted_hit(hit, hit_length)
        new_blocks = self._allocate_slots(request, 0, hit, external, 0, delay_cache_blocks=True)
        hit_ids = self._block_ids(hit[0])
        if new_blocks is None:
            return StepResult(admitted=False, hit_length=hit_length, hit_block_ids=hit_ids)
        self.loading.add(rid)
        request.num_computed_tokens += hit_length + external
        return StepResult(
            admitted=True,
            hit_length=hit_length,
            hit_block_ids=hit_ids,
            new_block_ids=self._block_ids(new_blocks),
            num_external_tokens=external,
            num_slots=request.num_computed_tokens,
        )

    def _adopted_hit(self, hit: tuple[Any, int], hit_length: int) -> tuple[Any, int]:
        """The lookup's ``hit``, cut back to its first ``hit_length`` tokens where external tokens
        supersede its sub-block tail (``truncate_computed_blocks``, as vLLM's scheduler cuts it)."""
        if hit_length == hit[1]:
            return hit
        return self._truncate_computed_blocks(hit[0], hit_length), hit_length
