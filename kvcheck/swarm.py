"""The swarm driver: random operations at full speed, with per-run rule subsets (swarm testing).

It drives the same Lockstep (target, model, invariants) as the state
machines, without Hypothesis's engine in the loop, so it runs many times
more steps per second.  Each run draws a configuration and a random subset
of operation kinds with random weights, which reaches deep states (a warm
pool, a long conversation) that uniform rule choice rarely does.  A failing
run is shrunk by :mod:`kvcheck.shrink`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import attrs

from kvcheck.config_space import random_config
from kvcheck.lockstep import Lockstep
from kvcheck.targets import TargetFactory
from kvmodel.config import TargetConfig
from kvmodel.invariants import InvariantViolation
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

OP_KINDS = (
    "add",
    "follow_up",
    "fill_pool",
    "schedule",
    "spec_decode",
    "process_output",
    "async_load",
    "finish",
    "preempt",
    "failed_load",
    "evict",
    "reset",
)
MAX_LIVE_REQUESTS = 6
TOKEN_ALPHABET = 3


@attrs.frozen
class Failure:
    """A run that broke an invariant: its configuration, the operations up to the failing one, and why."""

    config: TargetConfig
    ops: tuple[Operation, ...]
    violation: InvariantViolation


@attrs.define
class SwarmReport:
    runs: int = 0
    steps: int = 0
    seconds: float = 0.0
    failure: Failure | None = None


class _Run:
    def __init__(self, rng: random.Random, lockstep: Lockstep) -> None:
        self.rng = rng
        self.lockstep = lockstep
        self.next_id = 0
        enabled = [kind for kind in OP_KINDS if rng.random() < 0.6] or ["schedule"]
        enabled = sorted(set(enabled) | {"add", "schedule"}, key=OP_KINDS.index)
        self.kinds = enabled
        self.weights = [rng.random() + 0.05 for _ in enabled]

    def prompt(self) -> tuple[int, ...]:
        return tuple(self.rng.randrange(TOKEN_ALPHABET) for _ in range(self.rng.randint(1, 8)))

    def new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id - 1}"

    def warm_start(self) -> list[Operation]:
        """Memory pressure from the first step, as the manager machine's warm start: a request whose
        prefill takes every block of its share is preempted, and usually resumed as soon as the scheduler
        would (at once, or under async scheduling once its prefill's output is processed) with a few of
        its tokens loaded by a connector."""
        rng, config = self.rng, self.lockstep.config
        per_group_tokens = (config.num_blocks - 1) // len(config.groups) * config.block_size
        if per_group_tokens == 0:
            return []
        extra = rng.randint(2, 4)
        request_id = self.new_id()
        ops: list[Operation] = [
            AddRequest(request_id, (0,) * (per_group_tokens + extra)),
            Schedule(request_id, per_group_tokens, 0, 0),
            Preempt(request_id),
        ]
        if rng.random() < 0.9:
            if config.async_scheduling:
                # The scheduler resumes it only once the output of its prefill, in flight, is processed.
                ops.append(ProcessOutput())
            ops.append(Schedule(request_id, extra, rng.randint(0, 8), 0))
        return ops

    def next_ops(self) -> list[Operation]:
        """The operations of one random step (a next turn is a finish and an add)."""
        rng, model = self.rng, self.lockstep.model
        live = list(model.requests)
        kind = rng.choices(self.kinds, self.weights)[0]
        if kind in ("add", "follow_up", "fill_pool") and len(live) >= MAX_LIVE_REQUESTS:
            kind = "schedule"
        if not live and kind not in ("add", "fill_pool", "reset"):
            kind = "add"
        if kind == "add":
            return [AddRequest(self.new_id(), self.prompt())]
        if kind == "follow_up":
            source = rng.choice(live)
            prompt = (*model.requests[source].tokens, *self.prompt())
            ops: list[Operation] = [Finish(source)] if rng.random() < 0.5 else []
            return [*ops, AddRequest(self.new_id(), prompt)]
        if kind == "fill_pool":
            per_group = max(1, len(model.pool.free_order) // len(model.groups))
            token = rng.randrange(TOKEN_ALPHABET)
            return [AddRequest(self.new_id(), (token,) * (per_group * model.block_size))]
        if kind == "spec_decode":
            ready = sorted(
                r for r, m in model.requests.items() if m.running and m.num_computed_tokens == len(m.tokens) - 1
            )
            if ready:
                drafts = rng.randint(1, 4)
                request_id = rng.choice(ready)
                drafts = max(drafts, model.min_draft_tokens(request_id))
                return [SpecDecode(request_id, drafts, rng.randint(0, drafts), rng.randrange(TOKEN_ALPHABET))]
            kind = "schedule"
        if kind == "process_output" and model.pipeline.steps:
            return [ProcessOutput()]
        if kind == "async_load":
            loading = sorted(r for r, m in model.requests.items() if m.loading)
            if loading and rng.random() < 0.5:
                return [FinishAsyncLoad(rng.choice(loading))]
            return [StartAsyncLoad(rng.choice(live), rng.randint(1, 8))]
        if kind in ("schedule", "process_output"):
            new_tokens = rng.randint(1, rng.choice([4, 32]))
            external = rng.choice([0, rng.randint(1, 8)])
            step = Schedule(rng.choice(live), new_tokens, external, rng.randrange(TOKEN_ALPHABET))
            if model.aligned_mamba and not model.config.async_scheduling and rng.random() < 1 / 2:
                # A waiting request joins the step: it may not hit a Mamba state the first caches now.
                waiting = [r for r in live if r != step.request_id and model.requests[r].waiting]
                if waiting:
                    joining = Schedule(rng.choice(waiting), rng.randint(1, 32), 0, step.sampled_token, same_step=True)
                    return [step, joining]
            return [step]
        if kind == "finish":
            return [Finish(rng.choice(live))]
        if kind == "preempt":
            return [Preempt(rng.choice(live))]
        if kind == "failed_load":
            return [FailedLoad(rng.choice(live))]
        if kind == "evict" and model.pool.cache:
            cached = sorted(model.pool.cache)
            return [EvictBlocks(tuple(rng.sample(cached, rng.randint(1, min(3, len(cached))))))]
        return [ResetPrefixCache()]


def swarm(
    make_target: TargetFactory,
    *,
    seed: int = 0,
    max_runs: int = 1000,
    steps_per_run: int = 40,
    max_seconds: float | None = None,
    num_groups: int | None = None,
    check: bool = True,
    full_check_every: int = 1,
    drafter_and_async: bool = True,
    on_run: Callable[[Lockstep], None] | None = None,
) -> SwarmReport:
    """Run random operation sequences until one breaks an invariant or the budget is spent.

    ``check`` off skips the invariants; ``full_check_every`` N above 1 checks the whole state every
    N steps and at the end of each run, and only the step's results in between, then reports a
    violation as checking every step in full would (:class:`~kvcheck.lockstep.Lockstep`).
    ``drafter_and_async`` off draws configurations without a drafter, lookahead or async
    scheduling (see :func:`~kvcheck.config_space.random_config`).  ``on_run`` is handed each run's
    lockstep once the run ends without a violation."""
    rng = random.Random(seed)
    report = SwarmReport()
    start = time.perf_counter()
    while report.runs < max_runs and (max_seconds is None or time.perf_counter() - start < max_seconds):
        report.runs += 1
        # Half the runs start warm, on a pool split evenly among the groups.
        warm = rng.random() < 0.5
        config = random_config(rng, num_groups, full_pool=warm, drafter_and_async=drafter_and_async)
        lockstep = Lockstep(make_target, config, check=check, full_check_every=full_check_every)
        run = _Run(rng, lockstep)
        try:
            for op in run.warm_start() if warm else ():
                report.steps += 1
                lockstep.step(op)
            while len(lockstep.trace) < steps_per_run:
                for op in run.next_ops():
                    report.steps += 1
                    lockstep.step(op)
            lockstep.finish()
            if on_run is not None:
                on_run(lockstep)
        except InvariantViolation as violation:
            report.failure = Failure(config, tuple(lockstep.trace[: violation.step]), violation)
            break
    report.seconds = time.perf_counter() - start
    return report
