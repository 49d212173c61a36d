"""What every target shares: turning operations into the calls vLLM's scheduler makes.

An adapter subclasses :class:`SchedulerDrivenTarget` and supplies the
allocator-specific hooks (make a request, look up its hit, allocate slots,
free, evict, reset, read its table); the request lifecycle is written once
here, so two targets can only differ in their allocators.
"""

from __future__ import annotations

from typing import Any

from kvcheck.config import TargetConfig
from kvcheck.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    GroupIds,
    Operation,
    Preempt,
    ResetPrefixCache,
    Schedule,
    SpecDecode,
    StepResult,
    plan_schedule,
)


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
    blocks from the prefix cache.
    """

    def __init__(self, config: TargetConfig) -> None:
        self.config = config
        self.requests: dict[str, Any] = {}
        self.running: set[str] = set()
        # Hashes are opaque bytes; observations speak of token prefixes.
        self._prefix_of_hash: dict[bytes, tuple[int, ...]] = {}
        self._hashes_learned: dict[str, int] = {}

    # -- hooks ----------------------------------------------------------------

    def _new_request(self, request_id: str, prompt: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def _get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """The local hit: blocks per group (as the allocator passes them back) and its length in tokens."""
        raise NotImplementedError

    def _allocate_slots(self, request: Any, num_new_tokens: int, hit: tuple[Any, int] | None, external: int) -> Any:
        """``allocate_slots``; ``hit`` is ``None`` for a running request. Returns the new blocks or ``None``."""
        raise NotImplementedError

    def _free(self, request: Any) -> None:
        raise NotImplementedError

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
        if isinstance(op, Finish):
            request = self.requests[op.request_id]
            self._on_finished(request)
            self._free(request)
            del self.requests[op.request_id], self._hashes_learned[op.request_id]
            self.running.discard(op.request_id)
            return StepResult()
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
        request = self.requests[op.request_id]
        waiting = op.request_id not in self.running
        hit: tuple[Any, int] | None = self._get_computed_blocks(request) if waiting else None
        hit_length = hit[1] if hit is not None else 0
        amounts = plan_schedule(op, request.num_tokens, request.num_computed_tokens, hit[1] if hit else None)
        new_blocks = self._allocate_slots(request, amounts.num_new_tokens, hit, amounts.num_external_tokens)
        hit_ids = self._block_ids(hit[0]) if hit is not None else None
        result_hit_length = hit_length if waiting else None
        if new_blocks is None:
            return StepResult(admitted=False, hit_length=result_hit_length, hit_block_ids=hit_ids)
        self.running.add(op.request_id)
        self._on_admitted(request)
        request.num_computed_tokens += hit_length + amounts.num_external_tokens + amounts.num_new_tokens
        num_slots = request.num_computed_tokens + self.config.num_lookahead_tokens
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token_ids(op.sampled_token)
            self._learn_hashes(op.request_id)
        return StepResult(
            admitted=True,
            hit_length=result_hit_length,
            hit_block_ids=hit_ids,
            new_block_ids=self._block_ids(new_blocks),
            num_external_tokens=amounts.num_external_tokens,
            num_slots=num_slots,
        )

    def _spec_decode(self, op: SpecDecode) -> StepResult:
        """Schedule the last token and the drafts, then roll back the rejected drafts and append the
        accepted ones and a bonus token, as vLLM's scheduler does with the verifier's output."""
        request = self.requests[op.request_id]
        if op.request_id not in self.running or request.num_computed_tokens != request.num_tokens - 1:
            return StepResult()
        num_drafts = op.num_draft_tokens
        num_accepted = min(op.num_accepted_tokens, num_drafts)
        new_blocks = self._allocate_slots(request, 1 + num_drafts, None, 0)
        if new_blocks is None:
            return StepResult(admitted=False)
        request.num_computed_tokens += 1 + num_drafts
        num_slots = request.num_computed_tokens + self.config.num_lookahead_tokens
        request.num_computed_tokens -= num_drafts - num_accepted
        request.append_output_token_ids([op.sampled_token] * (num_accepted + 1))
        self._learn_hashes(op.request_id)
        self._cache_blocks(request, request.num_computed_tokens)
        return StepResult(admitted=True, new_block_ids=self._block_ids(new_blocks), num_slots=num_slots)

    def _preempt(self, request_id: str) -> None:
        request = self.requests[request_id]
        self._free(request)
        request.num_computed_tokens = 0
        self._on_preempted(request, request_id in self.running)
        self.running.discard(request_id)

    def _learn_hashes(self, request_id: str) -> None:
        request = self.requests[request_id]
        block_size = self.config.block_size
        tokens = request.all_token_ids
        hashes = request.block_hashes
        for index in range(self._hashes_learned[request_id], len(hashes)):
            self._prefix_of_hash.setdefault(hashes[index], tuple(tokens[: (index + 1) * block_size]))
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
