"""Exhaustive small-scope exploration: every operation sequence up to a depth, breadth first.

Random search samples; this enumerates.  A *scope* fixes the configurations
(pool size, block sizes, group layouts, caching, drafter and async
features) and the operations tried from every state (prompts over a small
alphabet, a few schedule sizes, finish, preempt, and so on).  From each
configuration's empty state, every operation of the scope is applied to
every state of depth ``d`` to reach depth ``d + 1``; a state already seen
(by a canonical form of the model's state, request names left out) is not
expanded again.  Depths advance together across configurations, so the first
violation found is a shortest one in the whole scope.  When the last depth
is done without one, the scope is exhausted: no operation sequence of that
length, in that scope, breaks an invariant, counting sequences that leave
the model in the same state as one (a target whose hidden state differs
between them is explored along the first one found).

Each state is rebuilt by replaying its operations (unchecked: they were
checked when the state was first reached) and then takes one checked step,
so every target can be explored, vLLM's and faulty ones included.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import attrs

from kvcheck.lockstep import Lockstep
from kvcheck.scopes import Scope
from kvcheck.swarm import Failure
from kvcheck.targets import TargetFactory
from kvmodel.config import TargetConfig
from kvmodel.invariants import InvariantViolation
from kvmodel.manager_model import ManagerModel
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
)


def candidate_ops(model: ManagerModel, scope: Scope, feature: str, num_added: int) -> Iterator[Operation]:
    """Every operation the scope tries from a state (some are no-ops there; they dedupe away)."""
    live = list(model.requests)
    if len(live) < scope.max_requests:
        for length in scope.prompt_lengths:
            for prompt in itertools.product(range(scope.alphabet), repeat=length):
                yield AddRequest(f"r{num_added}", prompt)
    for request_id in live:
        request = model.requests[request_id]
        for size, external in itertools.product(scope.schedule_sizes, scope.external_tokens):
            if external and request.running:
                continue  # external tokens only count for a waiting request
            yield Schedule(request_id, size, external)
        yield Finish(request_id)
        yield Preempt(request_id)
        if any(model.pool.holders.get((request_id, g)) for g in range(len(model.groups))):
            yield FailedLoad(request_id)
        if feature == "spec" and request.running and request.num_computed_tokens == len(request.tokens) - 1:
            yield SpecDecode(request_id, 2, 0)
            yield SpecDecode(request_id, 2, 2)
        if feature in ("async", "deferred"):
            if not request.running and not request.loading:
                yield StartAsyncLoad(request_id, 1)
            if request.loading:
                yield FinishAsyncLoad(request_id)
    if model.pipeline.steps:
        yield ProcessOutput()
    for block_id in sorted(model.pool.cache):
        yield EvictBlocks((block_id,))
    yield ResetPrefixCache()


def canonical_state(model: ManagerModel) -> object:
    """The model's state with request names left out: two states that differ only in what the
    requests are called are one state."""
    num_groups = len(model.groups)
    pipeline = model.pipeline

    def request_key(request_id: str) -> tuple[object, ...]:
        request = model.requests[request_id]
        tables = tuple(tuple(model.pool.holders.get((request_id, g), ())) for g in range(num_groups))
        return (
            tuple(request.tokens),
            request.num_computed_tokens,
            request.num_in_flight_tokens,
            request.running,
            request.loading,
            tables,
            pipeline.placeholders.get(request_id, 0),
            pipeline.stale.get(request_id, 0),
            pipeline.last_sched_seq.get(request_id, 0) - pipeline.processed_seq,
        )

    keys = {request_id: request_key(request_id) for request_id in model.requests}
    steps = tuple(
        (
            keys.get(step.request_id) if model.requests.get(step.request_id) is step.request else None,
            step.num_scheduled_tokens,
            step.samples,
            step.sampled_token,
            step.freed,
        )
        for step in pipeline.steps
    )
    deferred = tuple(
        (fence - pipeline.processed_seq, tuple(model.pool.holders[key])) for fence, key in pipeline.deferred
    )
    return (
        tuple(sorted(keys.values(), key=repr)),
        tuple(model.pool.free_order),
        tuple(sorted(model.pool.cache.items())),
        steps,
        deferred,
        pipeline.sched_seq - pipeline.processed_seq,
    )


@attrs.define
class DepthStats:
    depth: int
    frontier: int = 0
    """Distinct new states reached at this depth (the next depth's frontier)."""
    explored: int = 0
    """Operations applied at this depth."""


@attrs.define
class ExploreReport:
    scope: Scope
    configs: int = 0
    explored: int = 0
    distinct: int = 0
    seconds: float = 0.0
    depths: list[DepthStats] = attrs.Factory(list)
    failure: Failure | None = None
    exhausted: bool = False
    """Every depth of the scope was explored without a violation (False when stopped early)."""

    @property
    def states_per_second(self) -> float:
        return self.explored / self.seconds if self.seconds else 0.0


@attrs.define
class _Node:
    ops: tuple[Operation, ...]
    num_added: int


def _replay(make_target: TargetFactory, config: TargetConfig, ops: tuple[Operation, ...]) -> Lockstep:
    """A lockstep taken through ``ops`` without checks (every prefix was checked when first reached).

    States are rebuilt, not copied: a fault planted into a target rewires its
    methods with closures over the target's own objects, which a deep copy
    would share between parent and child."""
    lockstep = Lockstep(make_target, config, check=False)
    for op in ops:
        lockstep.step(op)
    return lockstep


def explore(
    make_target: TargetFactory,
    scope: Scope,
    max_seconds: float | None = None,
    progress: Callable[[DepthStats], None] | None = None,
) -> ExploreReport:
    """Explore ``scope`` breadth first on ``make_target``; stop at the first violation (a shortest one)."""
    report = ExploreReport(scope)
    start = time.perf_counter()
    configs = scope.configs()
    report.configs = len(configs)
    frontiers: list[list[_Node]] = [[_Node((), 0)] for _ in configs]
    seen: list[set[object]] = []
    for config, _ in configs:
        root = Lockstep(make_target, config)
        seen.append({canonical_state(root.model)})
    report.distinct = len(configs)
    for depth in range(1, scope.depth + 1):
        stats = DepthStats(depth)
        report.depths.append(stats)
        for index, (config, feature) in enumerate(configs):
            next_frontier: list[_Node] = []
            for node in frontiers[index]:
                parent = _replay(make_target, config, node.ops)
                for op in candidate_ops(parent.model, scope, feature, node.num_added):
                    child = _replay(make_target, config, node.ops)
                    child.check = True
                    stats.explored += 1
                    report.explored += 1
                    try:
                        child.step(op)
                    except InvariantViolation as violation:
                        report.failure = Failure(config, tuple(child.trace), violation)
                        report.seconds = time.perf_counter() - start
                        return report
                    key = canonical_state(child.model)
                    if key in seen[index]:
                        continue
                    seen[index].add(key)
                    added = node.num_added + isinstance(op, AddRequest)
                    next_frontier.append(_Node(tuple(child.trace), added))
                if max_seconds is not None and time.perf_counter() - start > max_seconds:
                    report.seconds = time.perf_counter() - start
                    return report
            frontiers[index] = next_frontier
            stats.frontier += len(next_frontier)
        report.distinct += stats.frontier
        if progress is not None:
            progress(stats)
    report.exhausted = True
    report.seconds = time.perf_counter() - start
    return report
