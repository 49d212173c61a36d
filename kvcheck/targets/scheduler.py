"""What every target shares: turning operations into the calls vLLM's scheduler makes.

An adapter subclasses :class:`SchedulerDrivenTarget` and supplies the
allocator-specific hooks (make a request, look up its hit, allocate slots,
free, evict, reset, read its table); the request lifecycle is written once
here, so two targets can only differ in their allocators.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import attrs

from kvcheck.targets.pipeline import GroupPositions, StepPipeline, read_positions
from kvcheck.vllm_releases import semantics_in_force
from kvmodel.config import TargetConfig
from kvmodel.observation import CacheEvent, ClearedEvent, Observation, RemovedEvent, StoredEvent
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
    flat_state_offloads,
)
from kvmodel.semantics import Semantics
from kvmodel.step_plans import ends_short_of_its_state, plan_async_load, plan_step


def block_ids(groups: Any) -> GroupIds:
    """Block ids of per-group block lists."""
    return tuple(tuple(block.block_id for block in group) for group in groups)


class SchedulerDrivenTarget:
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

    def __init__(self, config: TargetConfig, semantics: Semantics | None = None) -> None:
        self.config = config
        self._block_sizes = config.block_sizes
        self.requests: dict[str, Any] = {}
        self.running: set[str] = set()
        self.loading: set[str] = set()
        # The scheduler's calls follow the release in force (kvcheck/vllm_releases.py).
        self.pipeline = StepPipeline.for_config(config, semantics_in_force() if semantics is None else semantics)
        # Hashes are opaque bytes; observations speak of token prefixes.
        self._prefix_of_hash: dict[bytes, tuple[int, ...]] = {}
        # The same, keyed as KV cache events publish hashes.
        self._prefix_of_event_hash: dict[Hashable, tuple[int, ...]] = {}
        self.events: list[CacheEvent] = []
        self._hashes_learned: dict[str, int] = {}
        self._draft_tokens: dict[str, int] = {}
        # Per request, the tokens its last step ran up to, drafts included: where vLLM's model runner
        # saved its align-mode Mamba state, and reads it from at the next step (none once preempted).
        self._state_tokens: dict[str, int] = {}

    # -- hooks ----------------------------------------------------------------

    def _new_request(self, request_id: str, prompt: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def _get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """The local hit: blocks per group (as the allocator passes them back) and its length in tokens."""
        raise NotImplementedError

    def _allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        hit: tuple[Any, int] | None,
        external: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> Any:
        """``allocate_slots``; ``hit`` is ``None`` for a running request. Returns the new blocks or ``None``."""
        raise NotImplementedError

    def _get_num_cached_tokens(self, request: Any) -> int:
        """``get_num_cached_tokens``: the probe of a release that has it."""
        raise NotImplementedError

    def observe(self) -> Observation:
        raise NotImplementedError

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

    def _truncate_computed_blocks(self, blocks: Any, num_tokens: int) -> Any:
        """``truncate_computed_blocks``: a hit's blocks cut back to its first ``num_tokens`` tokens."""
        raise NotImplementedError

    def _free(self, request: Any) -> None:
        raise NotImplementedError

    def _pop_blocks_for_free(self, request: Any) -> Any:
        """``pop_blocks_for_free``: the request's blocks, forgotten by the allocator but still referenced."""
        raise NotImplementedError

    def _free_popped(self, popped: Any) -> None:
        """Return blocks from :meth:`_pop_blocks_for_free` to the pool, tail first, as the scheduler does."""
        raise NotImplementedError

    def _take_block_copies(self) -> tuple[list[tuple[int, int]], list[Any]]:
        """The block copies the step queued, as (source, destination) block ids, and their endpoints
        (each copy's source, then its destination), held until :meth:`_free_retained` (none by default)."""
        return [], []

    def _free_retained(self, blocks: list[Any]) -> None:
        """Release the endpoints of run block copies, in the order given."""
        raise NotImplementedError

    def _take_new_block_ids(self) -> list[int]:
        """``take_new_block_ids``: the blocks recorded for the worker to zero since the last call."""
        raise NotImplementedError

    def _take_state_offloads(self) -> Mapping[str, Sequence[tuple[int, int, int]]]:
        """``take_boundary_state_offloads``: the boundary states offered a connector since the last call."""
        raise NotImplementedError

    def _finalize_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """``finalize_partial_tail_offloads``: a finishing request's states left inside the blocks it was
        writing, offered before its free."""
        raise NotImplementedError

    def _new_step_starts(self) -> None:
        """``new_step_starts``, called as a scheduler step begins (nothing by default)."""

    def _take_events(self) -> list[Any]:
        """``take_events``: the allocator's KV cache events queued since the last call."""
        raise NotImplementedError

    def _event_hash(self, block_hash: bytes) -> Hashable:
        """A block hash as the allocator's KV cache events publish it (as it is, by default)."""
        return block_hash

    def _read_event(self, event: Any) -> list[CacheEvent]:
        """An allocator's KV cache event, its hashes read as token prefixes; ``BlockRemoved`` gives one
        event per hash.  The event classes are told apart by name, the fields read as vLLM names them."""
        kind = type(event).__name__
        prefix = self._prefix_of_event_hash.__getitem__
        if kind == "BlockStored":
            lookahead = event.lookahead_token_ids
            return [
                StoredEvent(
                    group=event.group_idx,
                    prefixes=tuple(prefix(h) for h in event.block_hashes),
                    parent=None if event.parent_block_hash is None else prefix(event.parent_block_hash),
                    token_ids=tuple(event.token_ids),
                    block_size=event.block_size,
                    lookahead_token_ids=None if lookahead is None else tuple(tuple(ids) for ids in lookahead),
                )
            ]
        if kind == "BlockRemoved":
            return [RemovedEvent(event.group_idx, prefix(h)) for h in event.block_hashes]
        if kind == "AllBlocksCleared":
            return [ClearedEvent()]
        raise TypeError(f"unknown KV cache event {event!r}")

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

    def _cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """``cache_blocks``, as a scheduler calls it after a speculative step's output."""
        raise NotImplementedError

    def _evict(self, block_ids: set[int]) -> None:
        raise NotImplementedError

    def _reset_prefix_cache(self) -> bool:
        raise NotImplementedError

    def _table(self, request_id: str) -> GroupIds:
        raise NotImplementedError

    def _block_ids(self, blocks: Any) -> GroupIds:
        """Block ids of what the allocator returned for a hit or an allocation (per-group lists by default)."""
        return block_ids(blocks)

    def _on_admitted(self, request: Any) -> None:
        """Status bookkeeping after admission (nothing by default)."""

    def _on_preempted(self, request: Any, was_running: bool) -> None:
        """Status bookkeeping after preemption (nothing by default)."""

    def _on_finished(self, request: Any) -> None:
        """Status bookkeeping before the request is freed for good (nothing by default)."""

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
            for event in self._take_events():
                self.events.extend(self._read_event(event))
        return result

    def _apply(self, op: Operation) -> StepResult:
        if isinstance(op, AddRequest):
            request = self._new_request(op.request_id, op.prompt)
            self.requests[op.request_id] = request
            self._hashes_learned[op.request_id] = 0
            self._learn_hashes(op.request_id)
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
            request = self.requests[op.request_id]
            self._on_finished(request)
            # As vLLM's scheduler hands a producer connector the finished request's blocks, before the free.
            tails = self._finalize_tail_offloads(request)
            self._release(request, op.request_id, finished=True)
            del self.requests[op.request_id], self._hashes_learned[op.request_id]
            self._draft_tokens.pop(op.request_id, None)
            self._state_tokens.pop(op.request_id, None)
            self.running.discard(op.request_id)
            self.loading.discard(op.request_id)
            return StepResult(state_offloads=flat_state_offloads({op.request_id: tails}))
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

    def _release_copies(self) -> tuple[tuple[int, int], ...]:
        """Take the step's block copies and release their endpoints as vLLM's scheduler does once the
        step is scheduled: at once, or with deferred frees once the step is processed (a deferred free
        is released last block first, so the endpoints go in reversed)."""
        copies, retained = self._take_block_copies()
        if retained:
            if self.pipeline.defer_block_free:
                self.pipeline.defer_free(self._deferred_retained(retained))
            else:
                self._free_retained(retained)
        return tuple(copies)

    def _deferred_retained(self, blocks: list[Any]) -> list[Any]:
        """The endpoints of copies as a deferred free holds them: reversed, as it frees last block first."""
        return blocks[::-1]

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
        if rid in self.running or rid in self.loading:
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

    def _process_output(self) -> None:
        def append(request: Any, token: int) -> None:
            request.append_output_token_ids(token)
            self._learn_hashes(request.request_id)

        self.pipeline.process_next(
            self.requests.get, self.running.__contains__, append, self._cache_blocks, self._free_popped
        )

    def _read_positions(self, request: Any, num_computed_tokens: int, num_new_tokens: int) -> GroupPositions:
        """The block positions, per group, that a step of ``request`` reads and writes."""
        config = self.config
        return read_positions(
            config.groups,
            self._block_sizes,
            num_computed_tokens,
            num_new_tokens,
            request.num_prompt_tokens,
            config.num_encoder_tokens,
            self._state_tokens.get(request.request_id),
        )

    def _reads(self, request: Any, num_computed_tokens: int, num_new_tokens: int) -> GroupIds:
        """Block ids at the positions a step reads and writes, per group (0 where the table has none)."""
        if not self.config.async_scheduling:
            return ()
        table = self._table(request.request_id)
        positions = self._read_positions(request, num_computed_tokens, num_new_tokens)
        return tuple(
            tuple(blocks[p] if p < len(blocks) else 0 for p in group_positions)
            for blocks, group_positions in zip(table, positions)
        )

    def _release(self, request: Any, request_id: str, finished: bool) -> None:
        """Free the request's blocks, or pop them for a deferred free while a step of it is in flight."""
        if self.pipeline.must_defer_free(request_id):
            popped = self._pop_blocks_for_free(request)
            if popped:
                self.pipeline.defer_free(popped)
        else:
            self._free(request)
        self.pipeline.freed(request, request_id, finished)

    def _preempt(self, request_id: str) -> None:
        request = self.requests[request_id]
        self._release(request, request_id, finished=False)
        request.num_computed_tokens = 0
        self._state_tokens.pop(request_id, None)
        self._on_preempted(request, request_id in self.running)
        self.running.discard(request_id)
        self.loading.discard(request_id)

    def _popped_ids(self, popped: Any) -> tuple[int, ...]:
        return tuple(block.block_id for block in popped)

    def pipeline_fields(self) -> dict[str, Any]:
        """The observation's view of the deferred frees and the reads of steps in flight."""
        return {
            "deferred_frees": tuple(self._popped_ids(popped) for _, popped in self.pipeline.deferred),
            "in_flight_reads": self.pipeline.held_reads(),
            "events": tuple(self.events),
            "prompt_lengths": {rid: request.num_prompt_tokens for rid, request in self.requests.items()},
            "draft_tokens": dict(self._draft_tokens),
            "state_tokens": dict(self._state_tokens),
        }

    def _learn_hashes(self, request_id: str) -> None:
        request = self.requests[request_id]
        block_size = self.config.hash_size
        tokens = request.all_token_ids
        hashes = request.block_hashes
        for index in range(self._hashes_learned[request_id], len(hashes)):
            end = (index + 1) * block_size + self.config.num_hash_lookahead_tokens
            prefix = self._prefix_of_hash.setdefault(hashes[index], tuple(tokens[:end]))
            if self.config.enable_kv_cache_events:
                self._prefix_of_event_hash.setdefault(self._event_hash(hashes[index]), prefix)
        self._hashes_learned[request_id] = len(hashes)

    def _holding_request_ids(self) -> list[str]:
        """Requests the allocator keeps tables for (by default, the live ones); an allocator that
        leaks a finished request's table should report it here."""
        return list(self.requests)

    def tables(self) -> dict[str, GroupIds]:
        """Each request holding blocks, with its table per group (0 is the null block)."""
        tables = {}
        for request_id in self._holding_request_ids():
            table = self._table(request_id)
            if any(table):
                tables[request_id] = table
        return tables
