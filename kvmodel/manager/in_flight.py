"""Steps in flight, as the model states them: vLLM's async scheduler schedules a step before the
previous one's output is processed.

A scheduled step advances the request's computed tokens at once and adds its tokens to the request's
tokens in flight; a step that computes the request's last known token leaves an output placeholder
(the token it will sample).  Outputs are processed in scheduling order: the tokens leave the in-flight
count, the sampled token is appended, and the request's blocks are cached up to its processed tokens.
A request preempted while steps are in flight has its placeholders dropped and their output marked
stale: it is still appended but changes no counter.  With ``defer_block_free`` a request freed while
one of its steps is in flight keeps its blocks out of the pool until every step scheduled so far is
processed (a fence on the step sequence).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import attrs

from kvmodel.config import TargetConfig
from kvmodel.manager.request import RequestModel
from kvmodel.semantics import CACHED_TOKENS_PROBE, SYNC_MAMBA_OUTPUT_CACHING, Semantics

MAX_STEPS_IN_FLIGHT = 2
"""vLLM runs two batches at once under async scheduling without pipeline parallelism: a third step
is scheduled only once the oldest output is processed."""

Holder = tuple[str, int]
"""A pool holder: a request's table in a group, or a deferred free."""


@attrs.define(eq=False)
class StepInFlight:
    """A scheduled step whose output is not processed yet.  ``request`` is the request object itself:
    a request added again under the same id is another request, and this step's output is not its."""

    request: RequestModel
    request_id: str
    num_scheduled_tokens: int
    samples: bool
    sampled_token: int
    freed: bool = False
    """Set once the request's blocks were freed (it finished or was preempted) while the step was in flight."""


@attrs.frozen
class ProcessedOutput:
    """What processing the oldest step's output does: the deferred frees whose fence it meets are
    released (``frees``, oldest first), then the request (still the live one under its id) gets its
    sampled token appended (``token``) and its blocks cached up to ``cache_up_to`` tokens."""

    frees: tuple[Holder, ...]
    request: RequestModel | None = None
    token: int | None = None
    cache_up_to: int | None = None


def caches_after_sync_output(config: TargetConfig, semantics: Semantics) -> bool:
    """Whether the scheduler caches a request's blocks (up to its computed tokens) after each token a
    synchronous step samples: in releases with ``sync_mamba_output_caching``, when a group holds Mamba
    state and prefix caching is on."""
    return (
        semantics.has(SYNC_MAMBA_OUTPUT_CACHING)
        and config.enable_caching
        and not config.async_scheduling
        and any(group.rules.holds_state for group in config.groups)
    )


class StepsInFlight:
    """The steps in flight, their output placeholders, stale outputs and deferred frees.

    Two scheduler calls depend on the release: ``caches_sync_output`` (the request's blocks are cached
    after each token a synchronous step samples, beside a Mamba group with prefix caching) and
    ``probes_before_lookup`` (a waiting request's cached tokens are probed before its lookup)."""

    def __init__(self, config: TargetConfig, semantics: Semantics) -> None:
        self.async_scheduling = config.async_scheduling
        self.defer_block_free = config.defer_block_free
        self.caches_sync_output = caches_after_sync_output(config, semantics)
        self.probes_before_lookup = semantics.has(CACHED_TOKENS_PROBE)
        self.steps: deque[StepInFlight] = deque()
        self.sched_seq = 0
        self.processed_seq = 0
        self.deferred: deque[tuple[int, Holder]] = deque()
        """(the steps scheduled when the free was deferred, the holder of its blocks)."""
        self.placeholders: dict[str, int] = {}
        self.stale: dict[str, int] = {}
        self.last_sched_seq: dict[str, int] = {}

    def full(self) -> bool:
        """Whether the next step must wait for the oldest output to be processed."""
        return len(self.steps) >= MAX_STEPS_IN_FLIGHT

    def num_placeholders(self, request_id: str) -> int:
        return self.placeholders.get(request_id, 0)

    def scheduled(self, request: RequestModel, num_scheduled_tokens: int, sampled_token: int) -> bool:
        """Record a step of ``request`` just scheduled (its computed tokens already advanced); whether
        its sampled token is appended now: when it computed the last token and steps run synchronously."""
        rid = request.request_id
        samples = request.num_computed_tokens >= len(request.tokens) + self.num_placeholders(rid)
        if not self.async_scheduling:
            return samples
        request.num_in_flight_tokens += num_scheduled_tokens
        self.sched_seq += 1
        self.last_sched_seq[rid] = self.sched_seq
        if samples:
            self.placeholders[rid] = self.num_placeholders(rid) + 1
        self.steps.append(StepInFlight(request, rid, num_scheduled_tokens, samples, sampled_token))
        return False

    def holds_stale_output(self, request_id: str) -> bool:
        """Whether output of the request scheduled before it was preempted is still in flight: the
        scheduler does not admit it again until that output is processed, as the output could deliver
        a token at a position the request would compute again."""
        return self.stale.get(request_id, 0) > 0

    def must_defer_free(self, request_id: str) -> bool:
        """Whether freeing the request now must wait: a step of it may still write its blocks."""
        return self.defer_block_free and self.last_sched_seq.get(request_id, 0) > self.processed_seq

    def defer_free(self, holder: Holder) -> None:
        """Keep ``holder``'s blocks out of the pool until every step scheduled so far is processed."""
        self.deferred.append((self.sched_seq, holder))

    def freed(self, request: RequestModel, finished: bool) -> None:
        """The request's blocks were freed: it finished, or was preempted (its output in flight is then stale)."""
        rid = request.request_id
        for step in self.steps:
            if step.request is request:
                step.freed = True
        self.placeholders.pop(rid, None)
        if finished:
            self.stale.pop(rid, None)
            self.last_sched_seq.pop(rid, None)
        else:
            self.stale[rid] = request.num_in_flight_tokens

    def process_oldest(self, requests: Mapping[str, RequestModel]) -> ProcessedOutput | None:
        """Process the oldest step's output (``None`` when no step is in flight); ``requests`` are the
        live requests by id: a step of a request since finished or added again changes nothing."""
        if not self.steps:
            return None
        step = self.steps.popleft()
        self.processed_seq += 1
        frees = []
        while self.deferred and self.deferred[0][0] <= self.processed_seq:
            frees.append(self.deferred.popleft()[1])
        request, rid = step.request, step.request_id
        if requests.get(rid) is not request:
            return ProcessedOutput(tuple(frees))
        request.num_in_flight_tokens -= step.num_scheduled_tokens
        stale = self.stale.get(rid, 0) > 0
        if stale:
            self.stale[rid] -= step.num_scheduled_tokens
        if not step.samples:
            return ProcessedOutput(tuple(frees), request)
        cache_up_to = None
        if not stale and self.num_placeholders(rid) > 0:
            self.placeholders[rid] -= 1
            if request.running:
                cache_up_to = request.num_computed_tokens - request.num_in_flight_tokens
        return ProcessedOutput(tuple(frees), request, step.sampled_token, cache_up_to)
