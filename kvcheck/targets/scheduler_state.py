"""What a scheduler-driven target keeps about its requests, and their lifecycle outside a step.

The requests by id, which of them run and which wait for an asynchronous load, the steps in flight
(:mod:`kvcheck.targets.pipeline`), the token prefixes their block hashes stand for, and per request the
drafts it was given and the tokens its last step ran up to.  A request is added, preempted (freed and
reset to recompute from token 0) and finished here; its blocks are freed at once, or popped for a
deferred free while a step of it is in flight.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvcheck.targets.allocator_hooks import AllocatorHooks
from kvcheck.targets.pipeline import StepPipeline
from kvcheck.vllm_releases import semantics_in_force
from kvmodel.config import TargetConfig
from kvmodel.observation import CacheEvent
from kvmodel.ops import StepResult, flat_state_offloads
from kvmodel.semantics import Semantics


class SchedulerState(AllocatorHooks):
    """The requests as vLLM's scheduler holds them, over an allocator's hooks."""

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

    def _add_request(self, request_id: str, prompt: tuple[int, ...]) -> None:
        """A new waiting request, its prompt's block hashes learned."""
        request = self._new_request(request_id, prompt)
        self.requests[request_id] = request
        self._hashes_learned[request_id] = 0
        self._learn_hashes(request_id)

    def follow(self, request_id: str, request: Any) -> None:
        """Observe a request another scheduler made and drives (vLLM's own): its hashes are learned
        now, and again by :meth:`learn_hashes` as it grows."""
        self.requests[request_id] = request
        self._hashes_learned[request_id] = 0
        self._learn_hashes(request_id)

    def unfollow(self, request_id: str) -> None:
        """Stop observing a request that scheduler finished."""
        del self.requests[request_id], self._hashes_learned[request_id]

    def learn_hashes(self, request_id: str) -> None:
        """Learn what the block hashes a followed request gained stand for."""
        self._learn_hashes(request_id)

    def _learn_hashes(self, request_id: str) -> None:
        """Record the token prefix each of the request's block hashes not yet seen stands for."""
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

    def _finish(self, request_id: str) -> StepResult:
        """Free the request for good; the states left inside the blocks it was writing are offered first."""
        request = self.requests[request_id]
        self._on_finished(request)
        # As vLLM's scheduler hands a producer connector the finished request's blocks, before the free.
        tails = self._finalize_tail_offloads(request)
        self._release(request, request_id, finished=True)
        del self.requests[request_id], self._hashes_learned[request_id]
        self._draft_tokens.pop(request_id, None)
        self._state_tokens.pop(request_id, None)
        self.running.discard(request_id)
        self.loading.discard(request_id)
        return StepResult(state_offloads=flat_state_offloads({request_id: tails}))

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

    def _holding_request_ids(self) -> list[str]:
        """Requests the allocator keeps tables for (by default, the live ones); an allocator that
        leaks a finished request's table should report it here."""
        return list(self.requests)
