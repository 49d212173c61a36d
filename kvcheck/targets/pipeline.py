"""Steps in flight: the async scheduler's bookkeeping, for the targets the scheduler drives.

Under async scheduling vLLM's scheduler schedules step N+1 before step N's
output is processed.  A scheduled step advances ``num_computed_tokens`` at
once and adds its tokens to the request's ``num_in_flight_tokens``; a step
that computes the request's last known token leaves an output placeholder
(the token it will sample).  Outputs are processed in scheduling order:
the tokens leave the in-flight count, the sampled token is appended, and
the scheduler caches the request's blocks up to its processed tokens.  A
request preempted while steps are in flight has its placeholders dropped and
their output marked stale: it is still appended but changes no counter.

With ``defer_block_free`` a request freed while one of its steps is in
flight does not return its blocks to the pool: the scheduler pops them from
the allocator and frees them once every step scheduled so far is processed
(a fence on the step sequence), as vLLM 0.33.0 does for KV-consumer
connectors.

This is scheduler logic, not allocator logic: the targets' scheduler
(:class:`~kvcheck.targets.scheduler.SchedulerDrivenTarget`) drives it and
supplies the allocator-side effects as callbacks.  The model states the same
behaviour on its own (:mod:`kvmodel.manager.in_flight`), so a bug here is
seen by the lockstep.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from kvcheck.kinds import kind_of
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.semantics import CACHED_TOKENS_PROBE, SYNC_MAMBA_OUTPUT_CACHING, Semantics

GroupPositions = tuple[tuple[int, ...], ...]

MAX_STEPS_IN_FLIGHT = 2
"""vLLM runs two batches at once under async scheduling without pipeline parallelism: a third step
is scheduled only once the oldest output is processed."""


def read_positions(
    groups: tuple[GroupSpec, ...],
    block_sizes: tuple[int, ...],
    num_computed_tokens: int,
    num_new_tokens: int,
    num_prompt_tokens: int,
    num_encoder_tokens: int = 0,
    state_tokens: int | None = None,
) -> GroupPositions:
    """Per group, the block positions a step that computes ``num_new_tokens`` tokens after
    ``num_computed_tokens`` reads or writes (of a request with a ``num_prompt_tokens``-token prompt):
    the attended blocks up to the last new token; an R-SWA group's prompt and window; a ring
    buffer's block; cross-attention's blocks for the encoder's tokens; an align-mode Mamba group's
    state block before the step and the block of its last token.  ``block_sizes`` has each
    group's block size; ``state_tokens`` the tokens the request's last step ran up to, drafts
    included (``None``: it ran none since it was last admitted from waiting): vLLM's model runner
    saved the state in that step's last block and copies it from there, so after rejected drafts
    it lies past the computed tokens.  Each group's kind states its positions
    (:meth:`kvcheck.kinds.base.HarnessKind.step_positions`)."""
    return tuple(
        kind_of(group.kind).step_positions(
            group, block_size, num_computed_tokens, num_new_tokens, num_prompt_tokens, num_encoder_tokens, state_tokens
        )
        for group, block_size in zip(groups, block_sizes, strict=True)
    )


@attrs.define(eq=False)
class InFlightStep:
    """A scheduled step whose output is not processed yet.

    ``request`` is the request object itself: a request added again under
    the same id is another request, and this step's output is not its.
    ``reads`` holds, per group, the block ids at the positions the step
    reads and writes, as the request's table held them when it was
    scheduled.  ``freed`` is set once the request's blocks were freed
    (finish or preemption) while the step was in flight.
    """

    request: Any
    request_id: str
    num_scheduled_tokens: int
    samples: bool
    sampled_token: int
    reads: tuple[tuple[int, ...], ...]
    freed: bool = False


def caches_after_sync_output(config: TargetConfig, semantics: Semantics) -> bool:
    """Whether the scheduler caches a request's blocks (up to its computed tokens) after each token a
    synchronous step samples: in releases with ``sync_mamba_output_caching`` (kvcheck/vllm_releases.py),
    when a group holds Mamba state and prefix caching is on."""
    return (
        semantics.has(SYNC_MAMBA_OUTPUT_CACHING)
        and config.enable_caching
        and not config.async_scheduling
        and any(group.rules.holds_state for group in config.groups)
    )


class StepPipeline:
    """The async scheduler's in-flight steps, output placeholders, stale outputs and deferred frees.

    Two calls the scheduler makes depend on the release (kvcheck/vllm_releases.py); the callers make
    them: ``caches_sync_output``, ``cache_blocks`` after a synchronous step's sampled token
    (:func:`caches_after_sync_output`), and ``probes_before_lookup``, ``get_num_cached_tokens`` asked
    of a waiting request before its lookup."""

    def __init__(
        self,
        async_scheduling: bool,
        defer_block_free: bool,
        caches_sync_output: bool = False,
        probes_before_lookup: bool = False,
    ) -> None:
        self.async_scheduling = async_scheduling
        self.defer_block_free = defer_block_free
        self.caches_sync_output = caches_sync_output
        self.probes_before_lookup = probes_before_lookup
        self.steps: deque[InFlightStep] = deque()
        self.sched_seq = 0
        self.processed_seq = 0
        self.deferred: deque[tuple[int, Any]] = deque()
        self.placeholders: dict[str, int] = {}
        self.stale: dict[str, int] = {}
        self.last_sched_seq: dict[str, int] = {}

    @classmethod
    def for_config(cls, config: TargetConfig, semantics: Semantics) -> StepPipeline:
        """The pipeline of a run of ``config`` on ``semantics``."""
        return cls(
            config.async_scheduling,
            config.defer_block_free,
            caches_after_sync_output(config, semantics),
            semantics.has(CACHED_TOKENS_PROBE),
        )

    def full(self) -> bool:
        """Whether the next step must wait for the oldest output to be processed."""
        return len(self.steps) >= MAX_STEPS_IN_FLIGHT

    def num_placeholders(self, request_id: str) -> int:
        return self.placeholders.get(request_id, 0)

    def scheduled(
        self,
        request: Any,
        request_id: str,
        num_scheduled_tokens: int,
        num_tokens: int,
        sampled_token: int,
        reads: tuple[tuple[int, ...], ...],
    ) -> bool:
        """Record a step just scheduled (``num_computed_tokens`` already advanced).

        Returns whether the caller appends the sampled token now: always for
        a step that computed the last token under synchronous scheduling;
        never under async scheduling, where the step goes in flight.
        """
        samples: bool = request.num_computed_tokens >= num_tokens + self.num_placeholders(request_id)
        if not self.async_scheduling:
            return samples
        request.num_in_flight_tokens += num_scheduled_tokens
        self.sched_seq += 1
        self.last_sched_seq[request_id] = self.sched_seq
        if samples:
            self.placeholders[request_id] = self.num_placeholders(request_id) + 1
        self.steps.append(InFlightStep(request, request_id, num_scheduled_tokens, samples, sampled_token, reads))
        return False

    def must_defer_free(self, request_id: str) -> bool:
        """Whether freeing the request now must wait: a step of it may still write its blocks."""
        return self.defer_block_free and self.last_sched_seq.get(request_id, 0) > self.processed_seq

    def defer_free(self, popped: Any) -> None:
        """Hold blocks popped from the allocator until every step scheduled so far is processed."""
        self.deferred.append((self.sched_seq, popped))

    def holds_stale_output(self, request_id: str) -> bool:
        """Whether the request was preempted with output still in flight that is not processed yet
        (vLLM's scheduler skips such a request in its waiting queue: "deliverable stale output")."""
        return self.stale.get(request_id, 0) > 0

    def freed(self, request: Any, request_id: str, finished: bool) -> None:
        """The request's blocks were freed: it finished, or was preempted (its in-flight output is then stale)."""
        for step in self.steps:
            if step.request is request:
                step.freed = True
        self.placeholders.pop(request_id, None)
        if finished:
            self.stale.pop(request_id, None)
            self.last_sched_seq.pop(request_id, None)
        else:
            self.stale[request_id] = request.num_in_flight_tokens

    def process_next(
        self,
        current: Callable[[str], Any],
        running: Callable[[str], bool],
        append: Callable[[Any, int], None],
        cache: Callable[[Any, int], None],
        free_popped: Callable[[Any], None],
    ) -> InFlightStep | None:
        """Process the oldest step's output; ``None`` when no step is in flight.

        Deferred frees whose fence this step meets are released first (as
        vLLM's ``update_from_output`` drains them before it reads outputs).
        ``current(request_id)`` is the live request under that id (or
        ``None``); ``running`` says whether it is running; ``append`` appends
        a sampled token; ``cache`` caches the request's blocks up to a token
        count; ``free_popped`` frees blocks popped for a deferred free.
        """
        if not self.steps:
            return None
        step = self.steps.popleft()
        self.processed_seq += 1
        while self.deferred and self.deferred[0][0] <= self.processed_seq:
            free_popped(self.deferred.popleft()[1])
        request, request_id = step.request, step.request_id
        if current(request_id) is not request:
            return step
        request.num_in_flight_tokens -= step.num_scheduled_tokens
        stale = self.stale.get(request_id, 0) > 0
        if stale:
            self.stale[request_id] -= step.num_scheduled_tokens
        if step.samples:
            had_placeholders = self.num_placeholders(request_id) > 0
            append(request, step.sampled_token)
            if not stale and had_placeholders:
                self.placeholders[request_id] -= 1
                if running(request_id):
                    cache(request, request.num_computed_tokens - request.num_in_flight_tokens)
        return step

    def held_reads(self) -> tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]:
        """The reads of every in-flight step whose blocks must still be held: all of them with
        deferred frees, otherwise those of requests not freed since the step was scheduled."""
        return tuple((step.request_id, step.reads) for step in self.steps if self.defer_block_free or not step.freed)
