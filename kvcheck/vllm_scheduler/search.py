"""Random workloads through vLLM's scheduler, and a failing one shrunk.

Each run draws a configuration the scheduler can run (kvcheck's configuration space, redrawn while
:func:`~kvcheck.vllm_scheduler.build.refusal` refuses it), the scheduler's budget and batch size,
and a workload; runs it; and checks the record against the model.  A failure is shrunk as
long as the same invariant still fails: requests dropped, prompts and outputs cut, arrivals moved
earlier, then the configuration simplified as kvcheck's shrinker simplifies a trace's.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from kvcheck.config_space import random_config
from kvcheck.shrink import config_simplifications
from kvcheck.vllm_scheduler.build import SchedulerSettings, refusal, scheduled_config
from kvcheck.vllm_scheduler.check import check_record
from kvcheck.vllm_scheduler.engine import SchedulerRecord, SchedulerRun
from kvcheck.vllm_scheduler.imitation import ImitationGap, imitation_gap
from kvcheck.vllm_scheduler.workload import Workload, random_workload
from kvmodel.config import TargetConfig
from kvmodel.config_checks import ConfigError
from kvmodel.invariants import InvariantViolation
from kvmodel.ops import Preempt

Plant = Callable[[Any], None]


@attrs.frozen
class SchedulerCase:
    """A configuration, the scheduler's settings and a workload: everything a run depends on."""

    config: TargetConfig
    settings: SchedulerSettings
    workload: Workload


@attrs.frozen
class SchedulerFailure:
    """A case whose run broke an invariant, and its record (the scheduler's calls as operations)."""

    case: SchedulerCase
    violation: InvariantViolation
    record: SchedulerRecord


@attrs.define
class SchedulerSearchReport:
    """What a search ran: runs, engine steps, operations checked, stalled runs, and its failure."""

    runs: int = 0
    steps: int = 0
    operations: int = 0
    stalled: int = 0
    preemptions: int = 0
    seconds: float = 0.0
    failure: SchedulerFailure | None = None
    shrunk: SchedulerFailure | None = None
    imitation_gap: tuple[SchedulerCase, ImitationGap] | None = None
    """A clean run whose calls kvcheck's own scheduler did not make alike, and where (with
    ``check_imitation``)."""


def random_case(rng: random.Random) -> SchedulerCase:
    """A configuration the scheduler runs, its settings, and a workload."""
    budget = rng.choice([4, 8, 16, 32])
    settings = SchedulerSettings(
        max_num_batched_tokens=budget, max_num_seqs=rng.choice([n for n in (2, 4, 8) if n <= budget])
    )
    while True:
        drawn = random_config(rng, drafter_and_async=False)
        # The scheduler sets its own reservation for parked loads; no connector parks any here.
        config = scheduled_config(attrs.evolve(drawn, reserved_blocks=0), settings)
        if refusal(config, settings) is None:
            # In nine runs in ten no request is longer than an even share of the pool holds, as vLLM's
            # engine refuses a model whose longest request does not fit its KV cache; so requests are
            # preempted and come back rather than wait forever.  The other runs may stall.
            share = (config.num_blocks - 1) // len(config.groups) * config.block_size
            longest = max(1, share) if rng.random() < 0.9 else None
            return SchedulerCase(config.validate(), settings, random_workload(rng, max_tokens=longest))


def run_case(case: SchedulerCase, plant: Plant | None = None) -> tuple[SchedulerRecord, InvariantViolation | None]:
    """Run the case through vLLM's scheduler and check it."""
    record = SchedulerRun(case.config, case.settings, plant).run(case.workload)
    try:
        check_record(record)
    except InvariantViolation as violation:
        return record, violation
    return record, None


def search(
    seed: int = 0,
    max_runs: int = 100,
    max_seconds: float | None = None,
    plant: Plant | None = None,
    check_imitation: bool = False,
) -> SchedulerSearchReport:
    """Random cases from ``seed`` until one fails (then shrunk) or the budget is spent.  With
    ``check_imitation``, each clean run's operations are also replayed through kvcheck's own scheduler,
    which must make the same calls (:func:`~kvcheck.vllm_scheduler.imitation.imitation_gap`); the first
    run where it does not ends the search too."""
    rng = random.Random(seed)
    report = SchedulerSearchReport()
    start = time.perf_counter()
    while report.runs < max_runs and (max_seconds is None or time.perf_counter() - start < max_seconds):
        case = random_case(rng)
        record, violation = run_case(case, plant)
        report.runs += 1
        report.steps += len(record.steps)
        report.operations += len(record.ops)
        report.stalled += record.stalled_at is not None
        report.preemptions += sum(isinstance(op, Preempt) for op in record.ops)
        if violation is not None:
            report.failure = SchedulerFailure(case, violation, record)
            report.shrunk = shrink(report.failure, plant)
            break
        gap = imitation_gap(record) if check_imitation else None
        if gap is not None:
            report.imitation_gap = case, gap
            break
    report.seconds = time.perf_counter() - start
    return report


def shrink(failure: SchedulerFailure, plant: Plant | None = None, max_tries: int = 400) -> SchedulerFailure:
    """The smallest case found that fails the same invariant: the smaller workloads of
    :func:`smaller_workloads`, then the simpler configurations kvcheck's shrinker tries
    (:func:`kvcheck.shrink.config_simplifications`) that the scheduler runs, each tried first to last,
    starting over from each one that still fails."""
    best, tries, improved = failure, 0, True
    while improved and tries < max_tries:
        improved = False
        for case in smaller_cases(best.case):
            tries += 1
            record, violation = run_case(case, plant)
            if violation is not None and violation.invariant == failure.violation.invariant:
                best, improved = SchedulerFailure(case, violation, record), True
                break
            if tries >= max_tries:
                break
    return best


def smaller_cases(case: SchedulerCase) -> Iterator[SchedulerCase]:
    """Cases a step smaller than ``case``: its workload smaller, or its configuration simpler."""
    for workload in smaller_workloads(case.workload):
        yield attrs.evolve(case, workload=workload)
    for simpler in config_simplifications(case.config):
        config = scheduled_config(simpler, case.settings)
        if config == case.config:
            continue  # simpler only in what the scheduler's budget sets anyway
        try:
            config.validate()
        except ConfigError:
            continue
        if refusal(config, case.settings) is None:
            yield attrs.evolve(case, config=config)


def smaller_workloads(workload: Workload) -> Iterator[Workload]:
    """Workloads a step smaller than ``workload``: a request left out, an abort left out, a prompt or
    an output cut by half or by one token, an arrival one step earlier."""
    arrivals = workload.arrivals
    for index, arrival in enumerate(arrivals):
        rest = arrivals[:index] + arrivals[index + 1 :]
        aborts = tuple(abort for abort in workload.aborts if abort.request_id != arrival.request_id)
        yield Workload(rest, aborts)
    for index in range(len(workload.aborts)):
        yield attrs.evolve(workload, aborts=workload.aborts[:index] + workload.aborts[index + 1 :])
    for index, arrival in enumerate(arrivals):
        for field in ("prompt", "outputs"):
            tokens = getattr(arrival, field)
            for length in sorted({len(tokens) // 2, len(tokens) - 1}):
                if 1 <= length < len(tokens):
                    changed = attrs.evolve(arrival, **{field: tokens[:length]})
                    yield attrs.evolve(workload, arrivals=(*arrivals[:index], changed, *arrivals[index + 1 :]))
        if arrival.step > 0:
            earlier = attrs.evolve(arrival, step=arrival.step - 1)
            yield attrs.evolve(workload, arrivals=(*arrivals[:index], earlier, *arrivals[index + 1 :]))
